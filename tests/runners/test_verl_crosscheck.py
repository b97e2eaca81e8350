"""bench's losses against verl 0.9.1's `core_algos` on the same random tensors: the paper's seven
and the corrections verl has a rule for (icepop, trm, grpo-geo-mask, cispo, cispo-two-sided;
runners/verl_runner.py NOT_ON_VERL names the others and why).

verl runs in its own environment (tests/verl_side/losses.py): for every algorithm it composes
verl's config from exactly the overrides `bench run --trainer verl` emits and computes what
verl's actor computes (advantage estimator, decoupled IS weights, registered policy loss,
aggregation), both on the whole batch and on the path verl's trainer executes (`ppo_loss` per
one-sequence micro-batch with the trainer's global batch info). Where the two definitions
agree, loss values and gradients must match; each place they differ is pinned down by a test
below (dual-clip, IcePop's lower bound, the aggregation, the advantage estimator, GSPO's empty
sequences).
"""

import math
import subprocess

import pytest
import torch

from runners.algos import AlgoConfig, LossInputs, get_loss, leave_one_out_advantages
from runners.verl_runner import ON_VERL, algo_overrides

pytestmark = [pytest.mark.verl, pytest.mark.integration]

P, G, T, L = 4, 4, 12, 16        # prompts, samples per prompt, padded length, Dr.GRPO normaliser
C = 3.0


def make_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    B = P * G
    lengths = torch.randint(3, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths.unsqueeze(-1)).float()            # right padding, as verl
    logp = -torch.rand(B, T, generator=g) * 2 - 0.05
    logp_old = logp + 0.15 * torch.randn(B, T, generator=g)             # some PPO ratios clip
    logp_rollout = logp_old + 0.5 * torch.randn(B, T, generator=g)      # some weights > C
    rewards = torch.randint(0, 2, (P, G), generator=g).float()
    rewards[0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    return {"logp": logp, "logp_old": logp_old, "logp_rollout": logp_rollout, "mask": mask,
            "rewards": rewards.flatten(), "groups": [i // G for i in range(B)],
            "advantages": leave_one_out_advantages(rewards).flatten()}


def run_verl(verl_python, tmp_path, inputs: dict[str, tuple[dict, list]]) -> dict[str, dict]:
    """verl's results for each named (tensors, cases), all in one verl process."""
    args, outs = [], {}
    for key, (x, cases) in inputs.items():
        inp, outs[key] = tmp_path / f"{key}.in.pt", tmp_path / f"{key}.out.pt"
        torch.save({**x, "cases": cases}, inp)
        args += [str(inp), str(outs[key])]
    r = subprocess.run([verl_python, "tests/verl_side/losses.py", *args], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return {key: torch.load(out) for key, out in outs.items()}


def bench_loss(x, algo, max_len=L):
    logp = x["logp"].clone().requires_grad_(True)
    inputs = LossInputs(logp, x["logp_old"], x["logp_rollout"], x["mask"], x["advantages"])
    loss, _ = get_loss(algo)(inputs, AlgoConfig(max_len=max_len, C=C))
    loss.backward()
    return loss.detach(), logp.grad


@pytest.fixture(scope="module")
def verl_out(verl_python, tmp_path_factory):
    """One verl process for every case of this module (verl's import takes seconds)."""
    x = make_inputs()
    tiny = make_inputs(seed=1)
    tiny["logp_rollout"][0, :3] += 8.0                                  # ρ of row 0 ≈ e^-24 < 1e-9
    empty = make_inputs(seed=2)
    empty["mask"][5] = 0.0                                              # a sequence with no token
    dual = make_inputs(seed=3)
    dual["logp"][dual["advantages"] < 0, 0] += 2.0                      # r_0 ≈ e^2 > 3 where A < 0
    rs = make_inputs(seed=4)                                            # a small mismatch, a few far tokens
    rs["logp_rollout"] = rs["logp_old"] + 0.003 * torch.randn(rs["logp_old"].shape,
                                                               generator=torch.Generator().manual_seed(4))
    rs["logp_rollout"][:4, 1] += 3.0                                    # ½ℓ² = 4.5 > 2.5: trm rejects rows 0-3
    cases = {"main": (x, [(a, algo_overrides(a, L, C)) for a in ON_VERL]),
             "rs": (rs, [(a, algo_overrides(a, L, C)) for a in ("trm", "grpo-geo-mask", "icepop")]),
             "tiny": (tiny, [(a, algo_overrides(a, L, C)) for a in ("grpo-seq-mis", "pg-seq-mis")]
                      + [(a + "-lo-1e-3", [o.replace("'1e-9_3'", "'1e-3_3'") for o in algo_overrides(a, L, C)])
                         for a in ("grpo-seq-mis", "pg-seq-mis")]),
             "empty": (empty, [(a, algo_overrides(a, L, C)) for a in ("grpo", "gspo")]),
             "dual": (dual, [("grpo", algo_overrides("grpo", L, C)),
                             ("grpo-dual-clip",
                              algo_overrides("grpo", L, C) + ["actor_rollout_ref.actor.clip_ratio_c=3.0"])]),
             "agg": (x, [("token-mean", [o for o in algo_overrides("grpo", L, C) if "loss_agg_mode" not in o]),
                         ("no-scale-factor", [o for o in algo_overrides("grpo", L, C) if "loss_scale_factor" not in o]),
                         ("gspo-token-mean", [o for o in algo_overrides("gspo", L, C) if "loss_agg_mode" not in o]),
                         ("grpo-estimator",
                          ["algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=False"])])}
    out = run_verl(verl_python, tmp_path_factory.mktemp("verl"), cases)
    return {key: (inputs, out[key]) for key, (inputs, _) in cases.items()}


def close(a, b):
    return torch.allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("algo", ON_VERL)
def test_each_loss_and_gradient_equals_verls(verl_out, algo):
    x, v = verl_out["main"]
    loss, grad = bench_loss(x, algo)
    if algo == "grpo-geo-mask":       # these tensors' mismatch rejects every sequence: verl's bare agg_loss
        assert torch.isnan(v[algo]["loss"]) and loss == 0 and (grad == 0).all()    # divides 0 by 0 tokens
    else:
        assert close(loss, v[algo]["loss"]), (loss, v[algo]["loss"])
        assert close(grad, v[algo]["grad"])
    # and on the path verl's trainer runs: ppo_loss per one-sequence micro-batch, global batch info
    assert close(loss, v[algo]["trainer_loss"]), (loss, v[algo]["trainer_loss"])
    assert close(grad, v[algo]["trainer_grad"])


def test_the_inputs_exercise_clipping_truncation_and_masking(verl_out):
    x, _ = verl_out["main"]
    m = x["mask"]
    w = ((x["logp_old"] - x["logp_rollout"]) * m).sum(-1).exp()
    assert (w > C).any() and (w <= C).any()                             # MIS masks, TIS truncates something
    wt = (x["logp_old"] - x["logp_rollout"]).exp()[m.bool()]
    assert (wt > C).any()                                               # token TIS truncates something
    wc = ((x["logp"] - x["logp_rollout"]) * m).sum(-1).exp()
    assert (wc > C).any() and (wc <= C).any()                           # the PG family's w = π_θ/μ too
    r = (x["logp"] - x["logp_old"]).exp()[m.bool()]
    assert ((r < 0.8) | (r > 1.28)).any()                               # PPO clipping is active


def test_advantages_are_verls_rloo_and_grpo_is_a_scaled_copy(verl_out):
    x, v = verl_out["main"]
    assert close(v["grpo"]["adv"], x["advantages"])                      # bench's leave-one-out = verl's rloo
    _, a = verl_out["agg"]
    assert close(a["grpo-estimator"]["adv"], x["advantages"] * (G - 1) / G)   # verl's grpo: R − mean


def test_difference_dual_clip(verl_out):
    """verl's vanilla loss bounds −r·A at −3·A for A < 0 (dual-clip, clip_ratio_c=3.0 by
    default); bench has no dual-clip, so the runner sets clip_ratio_c=1e9."""
    x, v = verl_out["dual"]
    loss, grad = bench_loss(x, "grpo")
    assert close(loss, v["grpo"]["loss"]) and close(grad, v["grpo"]["grad"])
    assert not close(loss, v["grpo-dual-clip"]["loss"])
    hit = (x["advantages"] < 0)
    assert (v["grpo-dual-clip"]["grad"][hit, 0] == 0).all() and (grad[hit, 0] != 0).all()


def test_difference_icepop_lower_bound(verl_out):
    """IcePop (`rollout_is_threshold='lo_hi'`) also zeroes weights below lo; bench's MIS masks only
    above C. With the runner's lo = 1e-9 this never bites: both sides clamp the sequence
    log-ratio at −20 (SAFETY_BOUND), and e^−20 ≈ 2.1e-9 > 1e-9. A larger lo (here 1e-3) zeroes
    the gradient of that sequence in verl and not in bench."""
    x, v = verl_out["tiny"]
    for algo in ("grpo-seq-mis", "pg-seq-mis"):
        loss, grad = bench_loss(x, algo)
        assert close(loss, v[algo]["loss"]) and close(grad, v[algo]["grad"])
        assert (grad[0][x["mask"][0].bool()] != 0).all()
        lo = v[algo + "-lo-1e-3"]
        assert (lo["grad"][0] == 0).all() and close(grad[1:], lo["grad"][1:])


def test_empty_sequences_count_as_in_verls_trainer(verl_out):
    """A sequence without response tokens: verl's trainer divides every micro-batch's seq-mean
    by global_batch_size = ppo_mini_batch_size · rollout.n, every sequence, as bench does (Dr.GRPO
    family). Only the bare `agg_loss`, without the trainer's global batch info, falls back to the
    batch's non-empty sequences (B/(B−1) here): a harness artefact, not a difference.
    GSPO is the exception: bench averages over non-empty sequences (bench/algorithms.py SPECS: mean_over),
    verl's trainer over all of them, (B−1)/B of bench's loss here."""
    x, v = verl_out["empty"]
    B = P * G
    assert x["mask"].sum(-1).eq(0).sum() == 1
    loss, grad = bench_loss(x, "grpo")
    assert close(loss, v["grpo"]["trainer_loss"]) and close(grad, v["grpo"]["trainer_grad"])
    assert close(loss * B / (B - 1), v["grpo"]["loss"])                        # the fallback alone
    loss, grad = bench_loss(x, "gspo")
    assert close(loss, v["gspo"]["loss"])                                       # the fallback: non-empty
    assert close(loss * (B - 1) / B, v["gspo"]["trainer_loss"])                # the trainer: all B
    assert close(grad * (B - 1) / B, v["gspo"]["trainer_grad"])


def test_verls_trainer_stops_where_icepop_zeroes_a_one_sequence_micro_batch(verl_out):
    """pg-seq-mis in bypass mode computes the IS weights inside the loss, per micro-batch; where
    IcePop zeroes the only sequence of a micro-batch (ρ = π_θ/μ > C), verl 0.9.1's
    `compute_is_metrics` divides by a zero effective sample size (ZeroDivisionError). The
    weights and the loss do not depend on that metric (the loss past it equals bench's, above);
    the decoupled grpo-seq-mis weighs the whole batch at once and is not affected."""
    x, v = verl_out["main"]
    rho = ((x["logp"] - x["logp_rollout"]) * x["mask"]).sum(-1).clamp(-20, 20).exp()
    zeroed = [f"sequence {i}" for i in (rho > C).nonzero().flatten().tolist()]
    assert zeroed and [e.split(":")[0] for e in v["pg-seq-mis"]["trainer_errors"]] == zeroed
    assert all("ZeroDivisionError" in e for e in v["pg-seq-mis"]["trainer_errors"])
    assert all(v[a]["trainer_errors"] == [] for a in ON_VERL if a != "pg-seq-mis")


def test_difference_aggregation(verl_out):
    """verl's defaults are token-mean for every loss (GSPO included) and, without
    loss_scale_factor, the padded length of the micro-batch as the Dr.GRPO normaliser."""
    x, a = verl_out["agg"]
    m = x["mask"]
    loss, _ = bench_loss(x, "grpo")
    assert close(a["no-scale-factor"]["loss"], loss * L / T)
    obj = bench_loss(x, "grpo")[0] * L * (P * G)                        # −Σ over all tokens
    assert close(a["token-mean"]["loss"], obj / m.sum())
    assert not close(a["gspo-token-mean"]["loss"], bench_loss(x, "gspo")[0])


def test_rejections_equal_verls_where_they_reject_and_keep(verl_out):
    """verl's rollout_rs on tensors where it decides both ways: trm (seq_max_k2 2.5) rejects the four
    rows with one far token, the geometric-mean mask (seq_mean_k1 [0.999, 1.001]) those and some of
    the rest. verl removes a rejected sequence from response_mask; its trainer still divides by the
    global batch size (every sequence), as bench's mean over B does. Only the bare `agg_loss`
    fallback renormalises over the kept (non-empty) sequences."""
    x, v = verl_out["rs"]
    m = x["mask"].bool()
    lr = (x["logp_old"] - x["logp_rollout"]).clamp(-20, 20)
    trm_kept = ((0.5 * lr ** 2) * m).amax(-1) <= 2.5
    geo = ((-lr) * m).sum(-1) / m.sum(-1)
    geo_kept = (geo >= math.log(0.999)) & (geo <= math.log(1.001))
    assert trm_kept[:4].logical_not().all() and trm_kept[4:].all()
    assert 0 < int(geo_kept.sum()) < len(geo_kept) - 4
    for algo, kept in (("trm", trm_kept), ("grpo-geo-mask", geo_kept), ("icepop", None)):
        loss, grad = bench_loss(x, algo)
        assert close(loss, v[algo]["trainer_loss"]), (algo, loss, v[algo]["trainer_loss"])
        assert close(grad, v[algo]["trainer_grad"])
        if kept is not None:
            assert (grad[~kept] == 0).all() and (grad[kept][m[kept]] != 0).any()
            assert close(loss * len(kept) / int(kept.sum()), v[algo]["loss"])      # the fallback: kept only


def test_trls_cispo_is_verls_cispo_with_no_lower_bound(verl_out):
    """TRL's min(r, ε_high) = verl's clamp(r, 1 − clip_ratio_low, 1 + clip_ratio_high) at
    clip_ratio_low = 1, clip_ratio_high = ε_high − 1 (r > 0); the two-sided one clamps below 0.8."""
    x, v = verl_out["main"]
    r = (x["logp"] - x["logp_old"]).exp()[x["mask"].bool()]
    assert (r < 0.8).any() and (r > 1.28).any()
    assert not close(bench_loss(x, "cispo")[0], bench_loss(x, "cispo-two-sided")[0])
