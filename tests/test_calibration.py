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

from bench.calibration import BANDS, band_for, calibration_metrics, judge
from bench.cli import app
from bench.engines.torch_engine import TorchEngine
from bench.models import load_model, load_tokenizer, resolve_model
from bench.precision import Precision
from bench.store import Run, open_store, session
from runners.presets import get_preset, preset_defaults
from runners.trainer import start_run


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
        assert status == "max_steps", (rollout, train, reason)
        assert cal["ok"] and cal["pair"] == f"{rollout}/{train}" and cal["tokens"] > 100, cal
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
    weights. Untie it, give it the weights of an older policy; the trainer's sync misses it."""
    eng = _engine(dtype)
    old = eng.model.lm_head.weight.detach().clone()
    torch.manual_seed(0)
    old += 0.01 * torch.randn_like(old)
    eng.model.lm_head.weight = torch.nn.Parameter(old)
    return eng


@pytest.mark.integration
@pytest.mark.parametrize("fault,pair", [
    ("temperature", "fp32"), ("temperature", "fp16"), ("rope", "fp32"), ("lm_head", "fp32")])
def test_gate_fails_each_injected_fault(built, tmp_path, fault, pair):
    engine = {"temperature": lambda d: _engine(d, HotterRollouts), "rope": rope_in_bf16,
              "lm_head": stale_lm_head}[fault](pair)
    status, reason, cal, _, run_id = run_cell(built, tmp_path, Precision(pair, pair), engine=engine)
    assert status == "failed" and not cal["ok"], (fault, cal)
    assert reason.startswith("step-0 calibration failed") and "inv_freq" in reason
    url, _ = built
    with session(open_store(url)) as s:                  # failed before any step or evaluation
        assert s.get(Run, run_id).step == 0 and s.get(Run, run_id).peak_accuracy is None
    shown = CliRunner().invoke(app, ["runs", "show", run_id, "--json", "--db", url])
    info = json.loads(shown.stdout)
    assert info["calibration"]["ok"] is False and info["provenance"]["bench"]["commit"]


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
