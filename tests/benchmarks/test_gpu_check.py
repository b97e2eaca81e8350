"""benchmarks/gpu_check.py: the shrunk check runs on a CPU and writes the JSON the full check
writes on a GPU (every section, no error); a spent budget skips sections and still writes it;
the memory formula's parameter count is the model's."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.integration
def test_shrunk_check_writes_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    r = _run("--shrink", "--device", "cpu", "--out", str(out), "--budget-s", "1800")    # a loaded CI machine too
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["schema"] == "bench-gpu-check/1" and res["shrink"] is True and res["device"] == "cpu"
    assert not res["errors"] and not res["skipped"], (res["errors"], res["skipped"])
    assert {"torch", "transformers", "device_name"} <= set(res["environment"])
    assert res["model"]["params"] == res["model"]["params_formula"]
    for d in ("bf16", "fp16"):
        x = res["rollout"][d]
        assert x["tokens"] == x["prompts"] * x["samples_per_prompt"] * x["new_tokens"]      # no EOS: full rows
        assert x["tokens_per_s"] > 0 and x["peak_memory_mb"] > 0
    assert set(res["train_step"]) == {"16", "64"}
    for n, x in res["train_step"].items():
        assert x["response_tokens"] == int(n) and x["optimizer_steps"] == x["applied"] == 4
        assert x["micro_batches"] > 1 + x["optimizer_steps"]                                 # micro-batched
        assert x["seconds"] > 0 and x["tokens_per_s"] > 0 and x["peak_memory_mb"] > 0 and x["computed_peak_mb"] > 0
        assert all(math.isfinite(v) for v in x["grad_norm"])
    for model in ("tiny-math", "random-1.5b"):
        pairs = res["mismatch"][model]
        assert set(pairs) == {"fp32", "bf16", "fp16"}
        for d, x in pairs.items():
            assert {"prob_abs_diff_mean", "kl_k3", "log_ratio_slope", "tokens"} <= set(x)
        assert pairs["fp32"]["kl_k3"] < pairs["fp16"]["kl_k3"] < pairs["bf16"]["kl_k3"]     # the paper's order
    sm = res["smollm2"]                                  # SmolLM2-135M's shapes (shrunk), the small preset's sizes
    assert sm["model"]["params"] == sm["model"]["params_formula"]                        # Llama: no q/k/v bias, tied
    for d in ("bf16", "fp16"):
        x = sm["rollout"][d]
        assert x["tokens"] == x["prompts"] * x["samples_per_prompt"] * x["new_tokens"] and x["tokens_per_s"] > 0
    (step,) = sm["train_step"].values()
    assert step["train_dtype"] == "fp16" and step["algo"] == "pg-seq-is" and step["gradient_checkpointing"]
    assert step["optimizer_steps"] == step["applied"] == 1 and step["micro_batches"] > 2
    assert set(sm["mismatch"]) == {"fp32", "bf16", "fp16"}
    assert sm["mismatch"]["fp32"]["kl_k3"] < sm["mismatch"]["bf16"]["kl_k3"]
    assert set(res["computed_memory"]) == {"0.5B (Qwen2.5-0.5B)", "1.5B (R1-Distill-Qwen-1.5B)",
                                           "7B (R1-Distill-Qwen-7B)"}
    assert res["wall_s"] > 0


@pytest.mark.slow
def test_a_spent_budget_skips_sections_and_still_writes_the_json(tmp_path):
    out = tmp_path / "g.json"
    r = _run("--shrink", "--device", "cpu", "--budget-s", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert not res["rollout"] and not res["train_step"] and not res["mismatch"]
    assert not res["smollm2"]
    assert len(res["skipped"]) == 7 and all(v.startswith("time budget") for v in res["skipped"].values())


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no CUDA")
def test_cuda_without_cuda_is_refused(tmp_path):
    r = _run("--device", "cuda", "--out", str(tmp_path / "x.json"))
    assert r.returncode == 2 and "CUDA is not available" in r.stderr and not (tmp_path / "x.json").exists()


def test_memory_formula_counts_the_parameters():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from transformers import AutoConfig, AutoModelForCausalLM

    for name, c in gpu_check.MODELS.items():
        c = dict(c or json.loads(gpu_check.CONFIG.read_text()))
        c.pop("architectures", None)
        cfg = AutoConfig.for_model(c.pop("model_type", "qwen2"), **c)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        assert sum(p.numel() for p in model.parameters()) == gpu_check.param_count(c), name
    m = gpu_check.memory_model(json.loads(gpu_check.CONFIG.read_text()), 32768, True)
    assert m["static"]["master_fp32"] == 4 * m["params"] and m["static_total"] == 22 * m["params"]
    stale = gpu_check.memory_model(json.loads(gpu_check.CONFIG.read_text()), 32768, True, staleness=4)
    assert stale["static_total"] == 24 * m["params"] and stale["host"] == 16 * m["params"] and m["host"] == 0
    assert "| 1.5B (R1-Distill-Qwen-1.5B) | 1.78B |" in gpu_check.memory_table()
