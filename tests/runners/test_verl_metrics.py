"""verl's mismatch metrics against bench's, through METRIC_MAP.

The verl-marked tests feed the same seeded tensors (64 sequences × 40 tokens, ragged, one
sequence without response tokens, padding filled with garbage) to verl 0.9.1 in its own
environment (tests/verl_side/offpolicy_metrics.py: `compute_offpolicy_metrics`, the trainer's
`compute_rollout_correction_and_add_to_batch`, `calculate_debug_metrics` and the bypass_mode
policy loss, each composed from exactly the overrides `bench run --trainer verl` emits) and to
`bench.mismatch.mismatch_metrics`: every verl value that METRIC_MAP stores under a name
mismatch_metrics also produces must equal bench's. The other tests need no verl: they check
that the map's targets are native names (or explicitly verl-only ones) and that bypass mode's
keys land where decoupled mode's do, so the stop rules' KL early warning is fed in both.
"""

import math
import subprocess

import pytest
import torch

from bench.mismatch import mismatch_metrics
from runners.presets import get_preset
from runners.verl_follow import Follower
from runners.verl_runner import (BYPASS_OFFPOLICY, IS_WEIGHT_MAP, METRIC_MAP, OFFPOLICY_MAP, ON_VERL, algo_overrides,
                                 map_metrics)

B, T, C = 64, 40, 3.0
REL = 1e-6


def make_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = lengths[1] = T
    lengths[5] = 0                                                    # a sequence without response tokens
    mask = (torch.arange(T) < lengths.unsqueeze(-1)).float()
    pi = -torch.rand(B, T, generator=g) * 3 - 0.05                     # log π_old (training engine)
    pi[1] -= 1.0
    mu = (pi + 0.3 * torch.randn(B, T, generator=g)).clamp(max=-1e-4)  # log μ (rollout engine)
    mu[0] = pi[0] - 1.2                 # ρ_t = e^1.2 > C on every token; Σ_t log ρ = 48 > 20 (the clamp)
    mu[1] = pi[1] + 0.8                 # Σ_t log ρ = −32 < −20
    mu[mask == 0], pi[mask == 0] = -7.0, 3.0                           # padding must not leak
    adv = torch.randint(0, 2, (B,), generator=g).float() * 2 - 1
    return {"mu": mu, "pi": pi, "mask": mask, "advantages": adv}


def native_targets() -> set[str]:
    """The METRIC_MAP names that describe the mismatch of π and μ on the sampled tokens, i.e.
    that mismatch_metrics must produce (the IS-weight ones depend on the algorithm's threshold)."""
    keys = [k for k in METRIC_MAP if k.startswith(("rollout_corr/", "training/rollout_"))]   # bypass/*: verl-only
    return {METRIC_MAP[k] for k in keys} - set(IS_WEIGHT_MAP.values()) - {"masked_frac"}   # masked_frac: the loss's


# ------------------------------------------------------------------ no verl needed

def test_every_mismatch_target_is_produced_natively():
    m = mismatch_metrics(*(make_inputs()[k] for k in ("mu", "pi", "mask")))
    assert native_targets() - set(m) == set()
    assert {"kl_k1_token", "kl_k3", "chi2_token", "chi2_seq", "ppl_training", "ppl_rollout", "ppl_ratio",
            "log_ppl_diff", "prob_abs_diff_mean", "prob_abs_diff_max"} <= native_targets()
    assert all(math.isfinite(v) for v in m.values())


def test_verl_values_never_land_on_names_with_another_meaning():
    targets = set(METRIC_MAP.values())
    assert "kl_k1" not in targets                       # verl's kl is per token, bench's kl_k1 per sequence
    assert not any(t.startswith(("is_ratio_token_", "is_ratio_seq_")) for t in targets)   # raw ratios only
    assert "prob_diff_max" not in targets and "prob_diff_min" not in targets               # signed π − μ
    m = mismatch_metrics(*(make_inputs()[k] for k in ("mu", "pi", "mask")))
    assert not set(IS_WEIGHT_MAP.values()) & set(m)     # applied IS weights: verl-only names
    assert "rollout_corr/rollout_is_max" not in METRIC_MAP and "rollout_corr/rollout_is_min" not in METRIC_MAP


def test_bypass_keys_keep_their_own_names():
    """Bypass means are means of per-sequence means under a moving π_θ: not the native metric."""
    assert (METRIC_MAP["rollout_corr/kl"] == "kl_k1_token"
            and METRIC_MAP["actor/rollout_corr/kl"] == "bypass/kl_k1_token")
    assert METRIC_MAP["rollout_corr/k3_kl"] == "kl_k3" and METRIC_MAP["actor/rollout_corr/k3_kl"] == "bypass/kl_k3"
    for k in BYPASS_OFFPOLICY:
        assert METRIC_MAP[f"actor/rollout_corr/{k}"] == f"bypass/{OFFPOLICY_MAP[k]}"
    # micro-batch maxima/minima and IS-weight statistics are not the batch's: kept as verl's
    assert map_metrics({"actor/rollout_corr/log_ppl_diff_max": 1.0, "actor/rollout_corr/rollout_is_mean": 2.0}) == {
        "verl/actor/rollout_corr/log_ppl_diff_max": 1.0, "verl/actor/rollout_corr/rollout_is_mean": 2.0}
    m = map_metrics({"rollout_corr/k3_kl": 1e-3, "actor/rollout_corr/k3_kl": 5e-3})
    assert m == {"kl_k3": 1e-3, "bypass/kl_k3": 5e-3}


def test_a_bypass_run_feeds_the_kl_early_warning():
    f = Follower(store=None, run_id="r", cfg=get_preset("tiny", eval_every=1000, max_steps=1000), split_size=16)
    series = [1e-4 * 1.5 ** i for i in range(f.cfg.stop.kl_window)]
    for step, v in enumerate(series, 1):
        m = map_metrics({"actor/rollout_corr/k3_kl": v, "actor/rollout_corr/kl": v / 2})
        assert f.track(step, m) is None
    assert f.state.kl == pytest.approx(series)
    assert f.state.kl_warning_step == len(series) and m["kl_warning"] == 1.0


# ------------------------------------------------------------------ against verl 0.9.1

@pytest.fixture(scope="module")
def verl_out(verl_python, tmp_path_factory):
    x = make_inputs()
    tmp = tmp_path_factory.mktemp("verl_metrics")
    inp, outp = tmp / "in.pt", tmp / "out.pt"
    torch.save({**x, "cases": [(a, algo_overrides(a, T, C)) for a in ON_VERL]}, inp)
    r = subprocess.run([verl_python, "tests/verl_side/offpolicy_metrics.py", str(inp), str(outp)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return x, mismatch_metrics(x["mu"], x["pi"], x["mask"]), torch.load(outp)


def compared(native: dict, logged: dict) -> dict[str, tuple[float, float]]:
    """verl key → (verl's value, bench's value under METRIC_MAP's name) for every shared metric;
    a `bypass/<name>` value is compared with <name> (equal when the whole batch is one micro-batch
    and π_θ = π_old, as in these cases)."""
    names = {k: METRIC_MAP.get(k, "").removeprefix("bypass/") for k in logged}
    return {k: (v, native[names[k]]) for k, v in logged.items() if names[k] in native}


@pytest.mark.verl
def test_offpolicy_metrics_equal_verls(verl_out):
    x, native, v = verl_out
    assert set(v["offpolicy"]) == set(OFFPOLICY_MAP)                  # every key verl computes is mapped
    for key, val in v["offpolicy"].items():
        assert native[OFFPOLICY_MAP[key]] == pytest.approx(val, rel=REL, abs=1e-12), key
    for key, val in v["offpolicy_fp32"].items():                      # verl on float32 tensors: rounding only
        assert native[OFFPOLICY_MAP[key]] == pytest.approx(val, rel=1e-4, abs=1e-6), key


@pytest.mark.verl
def test_every_shared_metric_verl_logs_equals_bench(verl_out):
    """Per algorithm, what verl logs (decoupled: the trainer's batch metrics; bypass: the loss's
    metrics with the whole batch as one micro-batch, where π_θ = π_old)."""
    _, native, v = verl_out
    n = 0
    for name, case in v["cases"].items():
        pairs = compared(native, case["logged"])
        assert len(pairs) >= (len(BYPASS_OFFPOLICY) if case["bypass"] else len(OFFPOLICY_MAP)), name
        for k, (theirs, ours) in pairs.items():
            assert ours == pytest.approx(theirs, rel=REL, abs=1e-12), (name, k)
        n += len(pairs)
    debug = compared(native, v["debug"])
    assert set(debug) == {"training/rollout_probs_diff_mean", "training/rollout_probs_diff_max",
                          "training/rollout_probs_diff_std"}
    for k, (theirs, ours) in debug.items():
        assert ours == pytest.approx(theirs, rel=REL), k
    assert n >= 4 * len(OFFPOLICY_MAP) + 3 * len(BYPASS_OFFPOLICY)


@pytest.mark.verl
def test_which_keys_each_mode_logs(verl_out):
    """Decoupled cells log `rollout_corr/*`; bypass cells (pg-seq-*) only `actor/rollout_corr/*`,
    stored as bypass/<name> (another quantity: means of per-sequence means, π_θ moving)."""
    _, _, v = verl_out
    for name, case in v["cases"].items():
        keys = set(case["logged"])
        if name.startswith("pg-seq"):
            assert case["bypass"] and not any(k.startswith("rollout_corr/") for k in keys)
            assert {f"actor/rollout_corr/{k}" for k in OFFPOLICY_MAP} <= keys
            m = map_metrics(case["logged"])
            assert m["bypass/kl_k3"] == case["logged"]["actor/rollout_corr/k3_kl"] and "kl_k3" not in m
            assert m["bypass/kl_k1_token"] == case["logged"]["actor/rollout_corr/kl"] and "kl_k1_token" not in m
        else:
            assert not case["bypass"] and {f"rollout_corr/{k}" for k in OFFPOLICY_MAP} <= keys
        # the rejection's per-mode statistics (trm, grpo-geo-mask) are kept under verl's names
        unmapped = {k for k in keys if k.startswith("rollout_corr/") and k not in METRIC_MAP
                    and not k.startswith("rollout_corr/rollout_rs_")}
        assert unmapped <= {"rollout_corr/rollout_is_max", "rollout_corr/rollout_is_min",
                            "rollout_corr/rollout_is_seq_fraction_high",
                            "rollout_corr/rollout_is_seq_fraction_low"}, (name, unmapped)


@pytest.mark.verl
def test_rejected_sequence_fraction_is_benchs_masked_frac(verl_out):
    """verl's rollout_rs_seq_masked_fraction (stored as masked_frac) is the share of sequences trm and
    grpo-geo-mask reject in bench's loss on the same tensors (an empty sequence is kept by both);
    the per-mode `..._seq_max_k2_seq_masked_fraction` counts otherwise and stays under verl's name."""
    from runners.algos import AlgoConfig, LossInputs, get_loss

    x, _, v = verl_out
    pi, mu, m = x["pi"].double(), x["mu"].double(), x["mask"].double()
    for algo in ("trm", "grpo-geo-mask"):
        logged = v["cases"][algo]["logged"]
        _, metrics = get_loss(algo)(LossInputs(pi.clone().requires_grad_(True), pi, mu, m,
                                               torch.ones(len(pi), dtype=torch.float64)), AlgoConfig(max_len=T))
        assert map_metrics(logged)["masked_frac"] == pytest.approx(metrics["masked_frac"]), algo
    assert 0 < metrics["masked_frac"] < 1


@pytest.mark.verl
def test_rollout_is_stats_are_applied_weights(verl_out):
    """verl's rollout_is_* describe the truncated / IcePop-masked weights (hence is_weight_applied_*),
    except rollout_is_max/min at sequence level, which are the raw ratio's (hence left unmapped)."""
    x, native, v = verl_out
    mu, pi, m = x["mu"].double(), x["pi"].double(), x["mask"].double()
    tok = v["cases"]["grpo-token-tis"]["logged"]
    rho = (pi - mu).clamp(-20, 20).exp()
    applied = rho.clamp(max=C)
    assert tok["rollout_corr/rollout_is_mean"] == pytest.approx(((applied * m).sum() / m.sum()).item(), rel=REL)
    assert tok["rollout_corr/rollout_is_max"] == pytest.approx(C)                 # truncated
    assert native["is_ratio_token_max"] > C and native["is_ratio_token_mean"] > tok["rollout_corr/rollout_is_mean"]
    assert tok["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(
        (((rho > C) * m).sum() / m.sum()).item(), rel=REL)
    seq = v["cases"]["grpo-seq-mis"]["logged"]
    lw = ((pi - mu) * m).sum(-1)
    w = lw.clamp(-20, 20).exp()
    kept = w * ((w >= 1e-9) & (w <= C))                                           # IcePop '1e-9_3'
    n = m.sum(-1)
    assert seq["rollout_corr/rollout_is_mean"] == pytest.approx(((kept * n).sum() / n.sum()).item(), rel=REL)
    assert seq["rollout_corr/rollout_is_max"] == pytest.approx(native["is_ratio_seq_max"], rel=REL)   # raw: e^20
    assert seq["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx((w > C).double().mean().item())
    assert map_metrics(seq)["is_weight_applied_seq_max"] <= C


@pytest.mark.verl
def test_difference_bypass_micro_batch_means(verl_out):
    """bench's command runs one sequence per micro-batch; verl averages the loss's metrics over
    micro-batches. Per-sequence quantities keep their value; per-token means become means over
    sequences of per-sequence token means (so bypass `kl` equals log_ppl_diff, not kl_k1_token)."""
    x, native, v = verl_out
    keep = x["mask"].sum(-1) > 0                                      # verl rejects an empty micro-batch
    sub = mismatch_metrics(x["mu"][keep], x["pi"][keep], x["mask"][keep])
    micro = v["cases"]["pg-seq-is"]["micro"]
    for k in ("chi2_seq", "training_ppl", "rollout_ppl", "ppl_ratio", "log_ppl_diff", "log_ppl_abs_diff"):
        assert micro[f"actor/rollout_corr/{k}"] == pytest.approx(sub[OFFPOLICY_MAP[k]], rel=REL), k
    assert micro["actor/rollout_corr/kl"] == pytest.approx(sub["log_ppl_diff"], rel=REL)
    assert micro["actor/rollout_corr/kl"] != pytest.approx(sub["kl_k1_token"], rel=1e-2)
    mu, pi, m = x["mu"][keep].double(), x["pi"][keep].double(), x["mask"][keep].double()
    d = pi - mu
    k3 = (((d.exp() - 1 - d) * m).sum(-1) / m.sum(-1)).mean().item()
    assert micro["actor/rollout_corr/k3_kl"] == pytest.approx(k3, rel=REL)


@pytest.mark.verl
def test_difference_bypass_icepop_crashes_on_a_fully_masked_micro_batch(verl_out):
    """A verl 0.9.1 bug met by the pg-seq-mis cells: with IcePop bounds (`'1e-9_3'`) the bypass
    loss computes the ESS as 1 / mean((w / mean w)²), a Python float division, so a micro-batch
    whose every weight is masked (here: one sequence with ρ outside [1e-9, 3]) raises
    ZeroDivisionError. pg-seq-is / -tis weights never vanish."""
    x, _, v = verl_out
    m = x["mask"].double()
    w = (((x["pi"].double() - x["mu"].double()) * m).sum(-1)).clamp(-20, 20).exp()
    outside = {i for i in range(B) if m[i].any() and not (1e-9 <= w[i] <= C)}
    errors = v["cases"]["pg-seq-mis"]["micro_errors"]
    assert outside and set(errors) == outside
    assert all(e.startswith("ZeroDivisionError") for e in errors.values())
    assert v["cases"]["pg-seq-is"]["micro_errors"] == v["cases"]["pg-seq-tis"]["micro_errors"] == {}
