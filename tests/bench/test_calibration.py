"""The step-0 calibration gate: its metrics against hand-computed values, the bands, and the
gate end to end in the native trainer — every correct pair passes, each injected plumbing
fault (temperature on the rollout side only, RoPE inv_freq in bf16 on one side, a stale tied
lm_head after a weight sync) ends the run `failed` before step 1. Also the run-config checks
that came with it (T/top-p refused; non-finite gradients end a bf16 run `diverged`)."""

import copy
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from bench.calibration import (BANDS, CAUSES, CHECKS, KAPPA_MAX, TWIN_RATIO, Z_MIN, Z_REF, band_for, buffer_mismatches,
                               calibration_metrics, judge, processing_metrics, reference_metrics, twin_model)
from bench.cli import app
from bench.engines.torch_engine import TorchEngine
from bench.models import load_model, load_tokenizer, resolve_model
from bench.precision import Precision
from bench.store import Run, open_store, session
from runners.presets import get_preset, preset_defaults
from runners.runs import start_run


def test_calibration_metrics_by_hand():
    # two sequences; d = log π − log μ on the unmasked tokens: row 0: 0.1, -0.2 ; row 1: 0.3
    mu = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    pi = torch.tensor([[-0.9, -2.2, 5.0], [-0.2, 7.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    m = calibration_metrics(mu, pi, mask)
    assert m["tokens"] == 3 and m["sequences"] == 2
    assert m["abs_logp_diff_mean"] == pytest.approx((0.1 + 0.2 + 0.3) / 3)
    assert m["abs_logp_diff_max"] == pytest.approx(0.3)
    k3 = [math.expm1(d) - d for d in (0.1, -0.2, 0.3)]          # 0.005171, 0.018731, 0.049859
    assert m["k3"] == pytest.approx(sum(k3) / 3)
    # sequence sums D: -0.1 and 0.3
    assert m["seq_log_ratio_mean"] == pytest.approx(0.1)
    assert m["seq_log_ratio_max"] == pytest.approx(0.3)
    assert m["is_ratio_min"] == pytest.approx(math.exp(-0.1)) and m["is_ratio_max"] == pytest.approx(math.exp(0.3))


def test_bands_and_verdict():
    assert band_for("fp32", "fp32") == BANDS["fp32"]
    b = band_for("fp32", "bf16")
    assert (b.mean_abs, b.k3, b.max_abs) == (BANDS["bf16"].mean_abs, BANDS["bf16"].k3, None)
    ok = judge({"abs_logp_diff_mean": 1e-7, "abs_logp_diff_max": 1e-5, "k3": 1e-12}, "fp32", "fp32")
    assert ok["ok"] and "message" not in ok and ok["pair"] == "fp32/fp32"
    bad = judge({"abs_logp_diff_mean": 1e-7, "abs_logp_diff_max": 2e-3, "k3": 1e-12}, "fp32", "fp32")
    assert not bad["ok"] and "abs_logp_diff_max" in bad["message"] and "stale tied lm_head" in bad["message"]
    nan = judge({"abs_logp_diff_mean": float("nan"), "abs_logp_diff_max": 0.0, "k3": 0.0}, "bf16", "bf16")
    assert not nan["ok"]
    # at 16 bits the max is a tail statistic and is not checked
    assert judge({"abs_logp_diff_mean": 1e-3, "abs_logp_diff_max": 3.0, "k3": 1e-5}, "bf16", "bf16")["ok"]


def test_reference_metrics_by_hand():
    # one row, two response tokens: μ, the twin τ and the fp32 reference ρ
    mu = torch.tensor([[-1.0, -2.0, 0.0]])
    twin = torch.tensor([[-1.1, -2.0, 9.0]])
    ref = torch.tensor([[-1.0, -1.8, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    r = reference_metrics(mu, twin, ref, mask, ratio_limit=2.0)
    # u = |τ − μ| = [0.1, 0], v = |ρ − τ| = [0.1, 0.2]; w = u − 2v = [-0.1, -0.4]
    assert r["mean_rollout"] == pytest.approx(0.05) and r["mean_twin"] == pytest.approx(0.15)
    assert r["ratio"] == pytest.approx(1 / 3) and r["ratio_limit"] == 2.0
    assert r["excess"] == pytest.approx(-0.25)
    assert r["excess_se"] == pytest.approx(0.3 / math.sqrt(2) / math.sqrt(2))      # sd([-0.1, -0.4]) = 0.3/√2
    assert r["z"] == pytest.approx(-0.25 / 0.15)
    k3 = lambda ds: sum(math.expm1(d) - d for d in ds) / len(ds)          # noqa: E731
    assert r["k3_rollout"] == pytest.approx(k3([-0.1, 0.0]))                # τ − μ
    assert r["k3_twin"] == pytest.approx(k3([0.1, 0.2]))                    # ρ − τ
    assert r["k3_rollout_ref"] == pytest.approx(k3([0.0, 0.2]))             # ρ − μ
    assert r["mean_rollout_ref"] == pytest.approx(0.1) and r["max_rollout_ref"] == pytest.approx(0.2)
    far = reference_metrics(mu + torch.tensor([[0.5, 0.7, 0.0]]), twin, ref, mask, ratio_limit=2.0)
    # u = [0.6, 0.7]: w = [0.4, 0.3], excess 0.35, sd 0.1/√2, se 0.05, z = 7
    assert far["excess"] == pytest.approx(0.35) and far["z"] == pytest.approx(7.0)
    assert reference_metrics(mu, ref, ref, mask, 2.0)["ratio"] is None       # an fp32 rollout: τ = ρ


def test_processing_slope_by_hand():
    # g = log ρ + H = [0.5, -0.5, -1.0] (Σg² = 1.5); a = log μ − log τ = [0.2, -0.1, -0.4] (Σag = 0.55)
    ref = torch.tensor([[-0.5, -1.0, -2.0]])
    ent = torch.tensor([[1.0, 0.5, 1.0]])
    mu = torch.tensor([[0.2, -0.1, -0.4]])
    p = processing_metrics(mu, torch.zeros(1, 3), ref, ent, torch.ones(1, 3))
    kappa = 0.55 / 1.5
    # residuals a − κg = [1/60, 1/12, -1/30]; Σ r²g² = (1/3600 + 1/144)/4 + 1/900
    se = math.sqrt((1 / 3600 + 1 / 144) / 4 + 1 / 900) / 1.5
    assert p["kappa"] == pytest.approx(kappa) and p["kappa_se"] == pytest.approx(se)
    # the sign test: a·g = [0.1, 0.05, 0.4], all three positive: z = (3 − 0)/√3
    assert (p["n_pos"], p["n_neg"]) == (3, 0) and p["z"] == pytest.approx(math.sqrt(3))
    assert p["temperature"] == pytest.approx(1 / (1 + kappa))
    # a orthogonal to g (Σag = 0): no slope; no tokens with g ≠ 0: nothing to fit
    flat = processing_metrics(torch.tensor([[0.2, 0.2, 0.0]]), torch.zeros(1, 3), ref, ent, torch.ones(1, 3))
    assert flat["kappa"] == 0.0 and (flat["n_pos"], flat["n_neg"], flat["z"]) == (1, 1, 0.0)
    assert processing_metrics(mu, torch.zeros(1, 3), -ent, ent, torch.ones(1, 3))["z"] == 0.0


def test_processing_slope_reads_a_temperature_off_sampled_tokens():
    """μ from softmax(z/T) at T = 0.95, ρ = softmax(z): κ̂ is 1/T − 1 = 0.0526 to first order."""
    torch.manual_seed(0)
    logits = 2.0 * torch.randn(400, 12)
    ref_all = torch.log_softmax(logits, -1)
    mu_all = torch.log_softmax(logits / 0.95, -1)
    y = torch.multinomial(mu_all.exp(), 1)                                  # tokens sampled from μ
    ent = -(ref_all.exp() * ref_all).sum(-1)
    p = processing_metrics(mu_all.gather(1, y).T, ref_all.gather(1, y).T, ref_all.gather(1, y).T, ent[None],
                           torch.ones(1, 400))
    assert p["kappa"] == pytest.approx(1 / 0.95 - 1, rel=0.1) and p["z"] > 15          # a·g > 0 on ~99% of tokens
    assert p["temperature"] == pytest.approx(0.95, abs=0.005)



def test_the_limits_are_the_measured_ones():
    """The bands and the checks' limits are measurements (the comment above BANDS and TWIN_RATIO
    in bench/calibration.py, docs/metrics.md): a change is a new measurement, made there, not a
    silent edit. Pinned here so that one is never made by accident."""
    want = {"fp32": (1e-5, 1e-8, 1e-3), "fp16": (2e-2, 5e-4, None), "bf16": (1e-1, 5e-3, None),
            "bf16+head32": (1e-1, 5e-3, None), "fp8": (1.5e-1, 3e-2, None), "int8": (1.5e-1, 4e-2, None),
            "nvfp4": (2e-1, 8e-2, None), "mxfp4": (3e-1, 2e-1, None), "bf16+router32": (1e-1, 5e-3, None),
            "fp16+router32": (2e-2, 5e-4, None),
            # the precision ladder: the carrier's band scaled by the unit roundoff (mean × f, k3 × f²), measured
            "e5m10": (0.02, 0.0005, None), "e5m9": (0.04, 0.002, None), "e5m8": (0.08, 0.008, None),
            "e8m7": (0.1, 0.005, None), "e8m6": (0.2, 0.02, None), "e8m5": (0.4, 0.08, None),
            "e8m4": (0.8, 0.32, None), "e8m3": (1.6, 1.28, None), "e8m2": (3.2, 5.12, None),
            "e8m1": (6.4, 20.48, None)}
    assert {k: (b.mean_abs, b.k3, b.max_abs) for k, b in BANDS.items()} == want
    assert TWIN_RATIO == {"fp32": 0.0, "fp16": 2.0, "bf16": 2.0, "bf16+head32": 2.0, "fp8": 1.5, "int8": 1.5,
                          "nvfp4": 1.5, "mxfp4": 1.5, "bf16+router32": 2.0, "fp16+router32": 2.0,
                          **dict.fromkeys(["e5m10", "e5m9", "e5m8", "e8m7", "e8m6", "e8m5", "e8m4", "e8m3", "e8m2",
                                           "e8m1"], 2.0)}
    assert (Z_REF, KAPPA_MAX, Z_MIN) == (4.0, 0.1, 6.0)
    with pytest.raises(AttributeError):                    # a band is a constant
        BANDS["fp16"].k3 = 1.0


def test_a_sequence_ratio_past_e50_is_clamped():
    # one sequence sums to +60 (its IS ratio e^60 clamped to e^50), the other to -60 (e^-50)
    mu = torch.tensor([[-70.0, -1.0], [-1.0, -1.0]])
    pi = torch.tensor([[-10.0, -1.0], [-31.0, -31.0]])
    m = calibration_metrics(mu, pi, torch.ones(2, 2))
    exactly = lambda x: pytest.approx(x, rel=1e-9, abs=0)                   # noqa: E731  (e^-50 is 2e-22)
    assert m["seq_log_ratio_max"] == pytest.approx(60.0)
    assert m["is_ratio_max"] == exactly(math.exp(50)) and m["is_ratio_min"] == exactly(math.exp(-50))
    both_high = calibration_metrics(mu, torch.tensor([[-10.0, -1.0], [29.0, 29.0]]), torch.ones(2, 2))
    assert both_high["is_ratio_min"] == exactly(math.exp(50))          # every sequence past +50
    both_low = calibration_metrics(torch.tensor([[-1.0, -1.0], [-1.0, -1.0]]), torch.tensor([[-31.0, -31.0],
                                   [-61.0, -1.0]]), torch.ones(2, 2))
    assert both_low["is_ratio_max"] == exactly(math.exp(-50))          # every sequence past -50


def test_reference_z_when_the_excess_has_no_spread():
    """One token, or tokens whose w_t all agree: no standard error; z is ±inf with an excess, 0
    without."""
    one = torch.ones(1, 1)                                 # dyadic values: every difference exact
    over = reference_metrics(torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), torch.tensor([[-1.625]]), one, 2.0)
    assert over["excess"] == 0.25 and over["excess_se"] == 0.0 and over["z"] == math.inf
    under = reference_metrics(torch.tensor([[-1.0]]), torch.tensor([[-1.25]]), torch.tensor([[-1.75]]), one, 2.0)
    assert under["excess"] == -0.75 and under["excess_se"] == 0.0 and under["z"] == -math.inf
    even = reference_metrics(torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), torch.tensor([[-1.75]]), one, 2.0)
    assert even["excess"] == 0.0 and even["z"] == 0.0
    same = reference_metrics(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.5]]),
                             torch.tensor([[-1.625, -2.625]]), torch.ones(1, 2), 2.0)     # w = [0.25, 0.25]: sd 0
    assert same["excess_se"] == 0.0 and same["z"] == math.inf


def test_processing_sign_test_counts_both_signs_and_its_edges():
    # g = [1, 1, 1, -1], a = [0.1, 0.2, 0.3, 0.1]: a·g = [0.1, 0.2, 0.3, -0.1]: n+ 3, n- 1, z = 2/√4
    ref = torch.tensor([[-1.0, -1.0, -1.0, -3.0]])
    ent = torch.full((1, 4), 2.0)
    p = processing_metrics(torch.tensor([[0.1, 0.2, 0.3, 0.1]]), torch.zeros(1, 4), ref, ent, torch.ones(1, 4))
    assert (p["n_pos"], p["n_neg"], p["z"]) == (3, 1, pytest.approx(1.0))
    assert p["kappa"] == pytest.approx(0.5 / 4) and p["temperature"] == pytest.approx(1 / (1 + 0.125))
    # no g at all: nothing to fit, as stored
    none = processing_metrics(torch.ones(1, 2), torch.zeros(1, 2), -ent[:, :2], ent[:, :2], torch.ones(1, 2))
    assert none == {"kappa": 0.0, "kappa_se": 0.0, "n_pos": 0, "n_neg": 0, "z": 0.0, "temperature": 1.0}
    # a slope of -1 or below is no temperature
    steep = processing_metrics(torch.tensor([[-2.0, 2.0]]), torch.zeros(1, 2), torch.tensor([[-1.0, -3.0]]),
                               ent[:, :2], torch.ones(1, 2))
    assert steep["kappa"] == pytest.approx(-2.0) and steep["temperature"] == math.inf
    warm = processing_metrics(torch.tensor([[-0.5, 0.5]]), torch.zeros(1, 2), torch.tensor([[-1.0, -3.0]]),
                              ent[:, :2], torch.ones(1, 2))
    assert warm["kappa"] == pytest.approx(-0.5) and warm["temperature"] == pytest.approx(2.0)
    # a token where g is exactly 0 carries no sign, whatever its a
    flat_g = processing_metrics(torch.tensor([[0.3, 0.1, -0.2]]), torch.zeros(1, 3), torch.tensor([[-2.0, -1.0, -3.0]]),
                                torch.full((1, 3), 2.0), torch.ones(1, 3))
    assert (flat_g["n_pos"], flat_g["n_neg"]) == (2, 0)                  # a·g = [0, 0.1, 0.2]
    same = processing_metrics(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([[-2.0, -1.0, -3.0]]),
                              torch.full((1, 3), 2.5), torch.ones(1, 3))          # μ = τ: no sign at all
    assert (same["kappa"], same["n_pos"], same["n_neg"], same["z"]) == (0.0, 0, 0, 0.0)
    edge = processing_metrics(torch.tensor([[-1.0, 1.0]]), torch.zeros(1, 2), torch.tensor([[-1.0, -3.0]]),
                              ent[:, :2], torch.ones(1, 2))
    assert edge["kappa"] == pytest.approx(-1.0) and edge["temperature"] == math.inf

class _Rope(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.tensor([1.0, 0.1, 0.01]))
        self.register_buffer("step", torch.tensor([3]))                      # not floating: not compared


def test_buffer_mismatches_by_hand():
    master = _Rope()
    assert buffer_mismatches(master, _Rope()) == []
    cast = _Rope()
    cast.inv_freq = cast.inv_freq.to(torch.bfloat16)
    assert buffer_mismatches(master, cast) == ["inv_freq is bfloat16 (master float32)"]
    moved = _Rope()
    moved.inv_freq[1] = 0.2
    assert buffer_mismatches(master, moved) == ["inv_freq differs from the master's (max |Δ| 0.1)"]
    moved.step[0] = 4
    assert len(buffer_mismatches(master, moved)) == 1
    assert buffer_mismatches(master, None) is None and buffer_mismatches(master, object()) is None



class _StepFirst(torch.nn.Module):
    """A non-floating buffer, then one the model lacks, before the floating one compared."""

    def __init__(self):
        super().__init__()
        self.register_buffer("step", torch.tensor([3]))
        self.register_buffer("only_in_master", torch.tensor([1.0]))
        self.register_buffer("inv_freq", torch.tensor([1.0, 0.1]))


def test_buffer_mismatches_look_past_buffers_they_skip():
    master, other = _StepFirst(), _StepFirst()
    del other.only_in_master
    other.inv_freq = other.inv_freq.half()
    assert buffer_mismatches(master, other) == ["inv_freq is float16 (master float32)"]


def test_the_twin_computes_in_the_rollout_format():
    """A format the training engine has arithmetic for: its compute copy (fp16 parameters); a
    rollout-only one (int8): the built-in engine's quantized layers."""
    from bench.model_formats import QuantLinear

    master = load_model(resolve_model("tiny-math"), torch.float32)
    fp16 = twin_model(master, "fp16")
    assert {p.dtype for p in fp16.parameters()} == {torch.float16} and not fp16.training
    assert not any(isinstance(m, QuantLinear) for m in fp16.modules())
    int8 = twin_model(master, "int8")
    assert any(isinstance(m, QuantLinear) for m in int8.modules()) and not int8.training
    assert next(master.parameters()).dtype == torch.float32                 # the master is copied, not changed

def test_each_check_trips_alone_and_is_named():
    ok_m = {"abs_logp_diff_mean": 1e-3, "abs_logp_diff_max": 0.1, "k3": 1e-5}
    ok_ref = {"mean_rollout": 1e-3, "mean_twin": 1e-3, "ratio": 1.0, "ratio_limit": 2.0, "excess": -1e-3,
              "excess_se": 1e-4, "z": -10.0, "k3_rollout": 1e-6, "k3_twin": 1e-6, "k3_rollout_ref": 1e-6,
              "mean_rollout_ref": 1e-3, "max_rollout_ref": 1e-2}
    ok_proc = {"kappa": 0.001, "kappa_se": 0.001, "n_pos": 10, "n_neg": 10, "z": 1.0, "temperature": 0.999}
    ok_buf = {"rollout": [], "training": None}
    kw = {"reference": ok_ref, "processing": ok_proc, "buffers": ok_buf}
    good = judge(ok_m, "bf16", "bf16", **kw)
    assert good["ok"] and good["failed"] == [] and "message" not in good
    assert good["checks"] == {"band": True, "reference": True, "processing": True, "buffers": True}
    assert good["reference"]["z_min"] == Z_REF and good["processing"]["kappa_max"] == 0.1
    cases = {
        "band": ({**ok_m, "k3": 6e-3}, kw, "k3 0.006 > 0.005"),
        "reference": (ok_m, {**kw, "reference": {**ok_ref, "mean_rollout": 2e-2, "ratio": 20.0, "z": 6.0}},
                      "20x the bf16 twin"),
        "processing": (ok_m, {**kw, "processing": {**ok_proc, "kappa": 0.35, "z": 25.0, "temperature": 0.74}},
                       "temperature of about 0.74"),
        "buffers": (ok_m, {**kw, "buffers": {"rollout": ["model.rotary_emb.inv_freq is bfloat16 (master float32)"],
                                             "training": []}}, "rollout engine: model.rotary_emb.inv_freq"),
    }
    for name, (m, k, text) in cases.items():
        bad = judge(m, "bf16", "bf16", **k)
        assert not bad["ok"] and bad["failed"] == [name], name
        assert bad["message"].startswith(f"step-0 calibration failed ({name}): ") and text in bad["message"], name
        if name in ("reference", "processing"):                 # only the causes the tripped check points to
            assert "inv_freq" not in bad["message"], name
        if name == "buffers":
            assert "inv_freq" in bad["message"] and "lm_head" not in bad["message"]
    # the limits themselves: z at the limit passes, NaN fails; the slope needs both κ and its sign z
    assert judge(ok_m, "bf16", "bf16", **{**kw, "reference": {**ok_ref, "z": Z_REF}})["ok"]
    assert judge(ok_m, "bf16", "bf16", **{**kw, "reference": {**ok_ref, "z": float("nan")}})["failed"] == [
        "reference"]
    for kappa, z in ((0.35, 3.0), (0.05, 30.0), (0.35, -30.0)):
        assert judge(ok_m, "bf16", "bf16", **{**kw, "processing": {**ok_proc, "kappa": kappa, "z": z}})["ok"]
    assert not judge(ok_m, "bf16", "bf16", **{**kw, "processing": {**ok_proc, "kappa": -0.2, "z": -30.0}})["ok"]
    # an fp32 rollout: τ = ρ, and μ must sit within fp32's band of ρ whatever the training format
    fp32_ref = {**ok_ref, "mean_twin": 0.0, "ratio": None, "z": 99.0, "mean_rollout_ref": 1e-7,
                "k3_rollout_ref": 1e-14, "max_rollout_ref": 1e-6}
    assert judge(ok_m, "fp32", "bf16", reference=fp32_ref)["ok"]            # z plays no part there
    fp32 = judge(ok_m, "fp32", "bf16", reference={**fp32_ref, "mean_rollout_ref": 2e-5})
    assert fp32["failed"] == ["reference"] and "mean |Δ| 2e-05 > 1e-05" in fp32["message"]
    # a value exactly at its band passes
    assert judge({**ok_m, "abs_logp_diff_mean": BANDS["bf16"].mean_abs, "k3": BANDS["bf16"].k3}, "bf16", "bf16")["ok"]
    # each limit itself passes: |κ| = KAPPA_MAX, a sign z = Z_MIN, μ exactly fp32's max band from ρ
    for kappa, z in ((KAPPA_MAX, 30.0), (0.35, Z_MIN), (-KAPPA_MAX, -30.0)):
        assert judge(ok_m, "bf16", "bf16", **{**kw, "processing": {**ok_proc, "kappa": kappa, "z": z}})["ok"]
    assert judge(ok_m, "fp32", "bf16", reference={**fp32_ref, "max_rollout_ref": BANDS["fp32"].max_abs})["ok"]
    # a reference fault points to the rollout side's causes, the stale head first
    ref_msg = judge(ok_m, "bf16", "bf16", **cases["reference"][1])["message"]
    assert ref_msg.endswith("a fault on the rollout side: " + "; ".join((CAUSES[2], CAUSES[0], CAUSES[3])) + ".")
    # a slope points to processing, a buffer to the cast buffer
    assert judge(ok_m, "bf16", "bf16", **cases["processing"][1])["message"].endswith(CAUSES[0] + ".")
    assert judge(ok_m, "bf16", "bf16", **cases["buffers"][1])["message"].endswith(CAUSES[1] + ".")
    # the verl runner passes k3 alone: only the band is judged
    verl = judge({"k3": 1e-4}, "bf16", "bf16")
    assert verl["ok"] and verl["checks"] == {"band": True} and "reference" not in verl


def test_a_band_the_format_itself_exceeds_is_said_to_be_the_formats():
    """SmolLM2-135M's MXFP4 rollouts at step 0 (2026-12-06): mean |Δ| 1.69 and k3 1.58 a token
    against fp16 training, beyond mxfp4's band (measured on tiny-math), with the rollout engine
    within 1.5x of its twin. The gate still fails the pair, but names the format, not the plumbing,
    when the twin (a copy of its own, in the rollout's format) alone is beyond the band; never for a
    same-format pair (the twin is the training engine) or when the reference check tripped."""
    m = {"abs_logp_diff_mean": 1.69, "abs_logp_diff_max": 12.0, "k3": 1.58}
    ref = {"mean_rollout": 1.2, "mean_twin": 1.5, "ratio": 0.8, "ratio_limit": 1.5, "excess": -1.0,
           "excess_se": 0.1, "z": -10.0, "k3_rollout": 0.9, "k3_twin": 1.1, "k3_rollout_ref": 1.3,
           "mean_rollout_ref": 1.7, "max_rollout_ref": 12.0}
    coarse = judge(m, "mxfp4", "fp16", reference=ref)
    assert coarse["failed"] == ["band"] and coarse["band_by_format"]
    assert "mxfp4 is too coarse for this model" in coarse["message"]
    assert "mean |Δ| 1.5; k3 1.1" in coarse["message"] and "lm_head" not in coarse["message"]
    # the twin within the band (a fault of the rollout engine's own, or of the training side): the usual causes
    for r, t, kw in (("mxfp4", "fp16", {**ref, "mean_twin": 0.05, "k3_twin": 0.01}),
                     ("fp8", "fp8", ref),                              # τ is π: a training fault would excuse itself
                     ("mxfp4", "fp16", {**ref, "z": 6.0})):           # the reference check tripped too
        bad = judge(m, r, t, reference=kw)
        assert "band" in bad["failed"] and "band_by_format" not in bad and CAUSES[2] in bad["message"], (r, t)


def test_reference_forward_is_pi_for_fp32_training_and_its_entropy_is_the_softmax_one():
    """For fp32 training the gate's reference replaces π: the same bits, in one part and in
    micro-batches; its entropy is −Σ p log p of the full fp32 distribution at each position."""
    from runners.algos import get_loss
    from runners.train_engine import Batch, TrainingEngine

    ref = resolve_model("tiny-math")
    tok = load_tokenizer(ref)
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("Q: 2+3\nA: ", "Q: 12*4\nA: ")]
    batch = Batch.pack([prompts[0], prompts[0], prompts[1]], [[5, 6, 7], [8], [9, 10]], tok.pad_token_id)
    cfg = get_preset("tiny")
    learner = TrainingEngine(load_model(ref, torch.float32), "fp32", cfg, get_loss("pg-seq-is"), "pg-seq-is")
    lp, ent = learner.reference_logprobs(batch)
    assert torch.equal(lp, learner.logprobs(batch))
    learner.cfg.max_tokens_per_microbatch = 12                               # two or three parts
    assert len(learner.parts([0, 1, 2], batch)) > 1
    lp2, ent2 = learner.reference_logprobs(batch)
    assert torch.equal(lp2, learner.logprobs(batch)) and torch.allclose(ent2, ent, atol=1e-5)
    with torch.no_grad():
        logits = learner.master(input_ids=batch.ids, attention_mask=batch.attn).logits.float()
    full = torch.log_softmax(logits.gather(1, batch.pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1])), -1)
    want = -(full.exp() * full).sum(-1) * batch.mask
    assert torch.allclose(ent, want, atol=1e-5) and (ent[batch.mask.bool()] > 0).all()
    assert (ent[~batch.mask.bool()] == 0).all()


def test_training_rollouts_refuse_processed_sampling():
    with pytest.raises(ValueError, match="temperature 1 and top-p 1"):
        get_preset("tiny", temperature=0.7)
    with pytest.raises(ValueError, match="temperature 1 and top-p 1"):
        get_preset("tiny", top_p=0.95)


def test_start_run_refuses_a_config_edited_after_the_preset(tmp_path):
    cfg = get_preset("tiny")
    cfg.temperature = 0.7                   # e.g. a config loaded from elsewhere
    with pytest.raises(ValueError, match="temperature 1 and top-p 1"):
        start_run(open_store(f"sqlite:///{tmp_path / 's.db'}"), "grpo", Precision("fp32", "fp32"), cfg)


# ------------------------------------------------------------------ the gate in the trainer

BUILD = ["build", "--model", "tiny-math", "--limit", "48", "--k", "8", "--engine", "torch", "--dtype", "fp32",
         "--band", "0.1", "0.9", "--json"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('calib') / 'store.db'}"
    r = CliRunner().invoke(app, [*BUILD, "--db", url])
    assert r.exit_code == 0, r.output
    return url, json.loads(r.stdout)["build_id"]


def tiny_cfg(steps=0):
    cfg = get_preset("tiny")
    cfg.prompts_per_step, cfg.samples_per_prompt, cfg.max_steps = 16, 8, steps
    cfg.eval_every = cfg.checkpoint_every = max(steps, 1)
    cfg.eval_split_m = 1
    cfg.benchmarks = []
    return cfg


def run_cell(built, tmp_path, pair: Precision, engine=None, cfg=None):
    url, build = built
    store = open_store(url)
    run_id = start_run(store, "pg-seq-is", pair, cfg or tiny_cfg(), build_id=build, ckpt_root=tmp_path,
                       rollout_engine=engine)
    with session(store) as s:
        r = s.get(Run, run_id)
        return r.status, r.stop_reason, r.calibration, r.provenance, run_id


@pytest.mark.integration
@pytest.mark.parametrize("rollout", ["fp32", "fp16", "bf16"])
def test_gate_passes_every_correct_pair(built, tmp_path, rollout):
    for train in ("fp32", "fp16", "bf16"):
        status, reason, cal, prov, _ = run_cell(built, tmp_path, Precision(rollout, train))
        assert status == "evaluated", (rollout, train, reason)
        assert cal["ok"] and cal["pair"] == f"{rollout}/{train}" and cal["tokens"] > 100, cal
        assert set(cal["checks"]) == set(CHECKS) and cal["buffers"] == {"rollout": [], "training": []}, cal
        assert prov["versions"]["torch"] and prov["split_accuracy_estimator"].startswith("avg@1")
        assert prov["preset_defaults"] == preset_defaults("tiny")          # what the Run page diffs against


class HotterRollouts(TorchEngine):
    """Fault: the rollout side samples (and reports μ) at T=0.7, the trainer scores at T=1."""

    def generate(self, prompts, n, sampling, start=0):
        from dataclasses import replace

        return super().generate(prompts, n, replace(sampling, temperature=0.7), start)


def _engine(dtype, cls=TorchEngine):
    ref = resolve_model("tiny-math")
    return cls(ref.path, dtype, model=load_model(ref, torch.float32), tokenizer=load_tokenizer(ref))


def rope_in_bf16(dtype):
    eng = _engine(dtype)
    for name, buf in eng.model.named_buffers():
        if "inv_freq" in name:
            buf.data = buf.data.to(torch.bfloat16)
    return eng


def stale_lm_head(dtype):
    """vLLM's tied-embedding trap: the reload updates embed_tokens but lm_head keeps old packed
    weights. The engine's head becomes an untied copy holding an older policy's weights (the
    master's + 0.01 noise, in the format: cast, or quantized by the head's own loader); the
    trainer's sync, which knows only the module it replaced, misses it. Any format."""
    eng = _engine(dtype)
    torch.manual_seed(0)
    old = load_model(resolve_model("tiny-math"), torch.float32).lm_head.weight.detach().clone()
    old += 0.01 * torch.randn_like(old)
    head = copy.deepcopy(eng.model.lm_head)
    if hasattr(head, "load_weight"):            # QuantLinear (fp8, int8, nvfp4), Head32Linear
        head.load_weight(old)
    else:
        head.weight = torch.nn.Parameter(old.to(head.weight.dtype))
    eng.model.lm_head = head
    return eng


FAULTS = {"temperature": lambda d: _engine(d, HotterRollouts), "rope": rope_in_bf16, "lm_head": stale_lm_head}


# the check each fault must trip at every precision (others may trip too: at fp32 the band does)
EXPECTED = {"temperature": ("processing", "temperature of about 0.7"),
            "rope": ("buffers", "rollout engine: model.rotary_emb.inv_freq is bfloat16 (master float32)"),
            "lm_head": ("reference", "reference: the ")}


@pytest.mark.integration
@pytest.mark.parametrize("pair", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_gate_fails_each_injected_fault(built, tmp_path, fault, pair):
    status, reason, cal, _, run_id = run_cell(built, tmp_path, Precision(pair, pair), engine=FAULTS[fault](pair))
    assert status == "miscalibrated" and not cal["ok"], (fault, pair, cal)
    check, text = EXPECTED[fault]
    assert check in cal["failed"] and not cal["checks"][check], (fault, pair, cal["failed"])
    assert reason.startswith(f"step-0 calibration failed ({', '.join(cal['failed'])}): ") and text in reason, reason
    if pair == "fp32":                                   # τ = ρ: the reference check is fp32's band
        assert cal["reference"]["ratio"] is None and "fp32 rollout engine differs" in reason
    elif check == "reference":
        assert cal["reference"]["z"] > Z_REF and f"x the {pair} twin's own distance" in reason
    url, _ = built
    with session(open_store(url)) as s:                  # failed before any step or evaluation
        assert s.get(Run, run_id).step == 0 and s.get(Run, run_id).peak_accuracy is None
    shown = CliRunner().invoke(app, ["runs", "show", run_id, "--json", "--db", url])
    info = json.loads(shown.stdout)
    assert info["calibration"]["ok"] is False and info["provenance"]["bench"]["commit"]


@pytest.mark.integration
@pytest.mark.parametrize("pair", ["fp8", "rollout=fp8,train=fp16", "rollout=int8,train=fp32",
                                  "rollout=nvfp4,train=fp16", "rollout=nvfp4,train=fp32"])
def test_gate_passes_sub_16_bit_rollouts(built, tmp_path, pair):
    """A correct rollout below 16 bits passes every check; its twin (the same format on the
    training side: fp8's training copy, int8's and nvfp4's quantized weights in one prefill)
    measures the format's own noise against the fp32 reference."""
    p = Precision.parse(pair)
    status, reason, cal, _, _ = run_cell(built, tmp_path, p)
    assert status == "evaluated", (pair, reason)
    assert cal["ok"] and all(cal["checks"].values()) and set(cal["checks"]) == set(CHECKS), cal
    assert cal["reference"]["mean_twin"] > 1e-4 and cal["reference"]["ratio"] < TWIN_RATIO[p.rollout], cal["reference"]
    assert cal["buffers"] == {"rollout": [], "training": []}


@pytest.mark.integration
def test_non_finite_gradients_end_a_bf16_run_diverged(built, tmp_path, monkeypatch):
    """A loss that is finite (0) but whose gradient is NaN (d√x at 0 times 0): today's bf16 run
    would skip silently forever; now every skip is counted and 3 in a row end it `diverged`."""
    import runners.trainer as trainer_mod

    def nan_grad_loss(x, cfg):
        return torch.sqrt((x.logp * x.mask).sum() * 0.0), {}

    monkeypatch.setattr(trainer_mod, "get_loss", lambda name: nan_grad_loss)
    cfg = tiny_cfg(steps=10)
    cfg.prompts_per_step, cfg.samples_per_prompt, cfg.max_nonfinite_in_a_row = 4, 4, 3
    status, reason, cal, _, run_id = run_cell(built, tmp_path, Precision("bf16", "bf16"), cfg=cfg)
    assert status == "diverged" and "3 optimizer steps in a row" in reason, reason
    url, _ = built
    info = json.loads(CliRunner().invoke(app, ["runs", "show", run_id, "--json", "--db", url]).stdout)
    assert info["steps"] == 3
    last = info["last_step"]
    assert last["skipped_steps"] == 3 and last["updates_nonfinite"] == 1 and last["grad_norm"] is None
