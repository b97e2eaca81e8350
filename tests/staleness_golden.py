"""The golden runs behind "staleness K=0 reproduces the runs from before staleness existed"
(tests/test_staleness.py): a few 3-step native runs of tiny-math on a 12-problem build, every
deterministic per-step metric and every evaluation stored in tests/data/staleness_golden.json.

The file was written by the code before `RunConfig.staleness` existed:
    python tests/staleness_golden.py tests/data/staleness_golden.json
(twice, with identical output: the runs are deterministic). When the built-in rollout engine
took vLLM's 16-bit kernels (bench/rollout_kernels.py), and again when both engines' 16-bit
attention became upcast on CPUs without fp16 instructions (bench/precision.py:
upcast_attention), the fp16 cases were regenerated with the same command (on such a CPU:
avx512_bf16, no avx512_fp16); the fp32 cases stayed byte for byte, so only they still pin the code from
before staleness. The configs are stored whole in
the file (not read from a preset), so a later change to a preset does not move the target.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

# per-step metrics that measure the machine, not the run
NONDETERMINISTIC = ("time_", "tokens_per_s", "train_tokens_per_s", "peak_memory_mb", "wall_s")
STALENESS_KEYS = "staleness_"      # logged since staleness exists (0 at K=0): not part of "the runs of before"

BUILD = ["build", "--model", "tiny-math", "--limit", "12", "--k", "2", "--engine", "torch", "--dtype", "fp32",
         "--band", "0", "--band", "1", "--json"]

# (name, algo, precision, RunConfig overrides)
CASES = [
    ("pg-seq-is fp32", "pg-seq-is", "fp32", {}),
    ("pg-seq-is fp16", "pg-seq-is", "fp16", {}),
    ("grpo fp32", "grpo", "fp32", {}),
    ("grpo fp16", "grpo", "fp16", {}),
    ("grpo fp32 updates_per_batch=2", "grpo", "fp32", {"updates_per_batch": 2}),
    ("pg-seq-is fp16 micro-batches", "pg-seq-is", "fp16", {"max_tokens_per_microbatch": 300}),
]


def base_config():
    from runners.presets import Benchmark, RunConfig

    cfg = RunConfig(prompts_per_step=4, samples_per_prompt=4, max_steps=3, eval_every=3, checkpoint_every=3,
                    eval_split_m=1, max_tokens=40, threads=1,
                    benchmarks=[Benchmark("synthetic-hard", "synthetic-hard", n=1, limit=8)])
    cfg.algo.max_len = 40
    return cfg


def deterministic(metrics: dict, staleness: bool = False) -> dict:
    """The metrics that do not measure the machine; `staleness_*` too only when asked."""
    return {k: v for k, v in metrics.items() if not any(k.startswith(p) or k == p for p in NONDETERMINISTIC)
            and (staleness or not k.startswith(STALENESS_KEYS))}


def make_build(url: str) -> str:
    from typer.testing import CliRunner

    from bench.cli import app

    r = CliRunner().invoke(app, [*BUILD, "--db", url])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["build_id"]


def run_case(url: str, build: str, config: dict, algo: str, dtype: str, ckpt_root: Path) -> dict:
    """One run from a stored config (asdict form): its steps' deterministic metrics and evals."""
    from sqlalchemy import select

    from bench.precision import Precision
    from bench.store import Eval, Run, RunStep, open_store, session
    from runners.trainer import config_from_dict, start_run

    store = open_store(url)
    run_id = start_run(store, algo, Precision.parse(dtype), config_from_dict(config), build_id=build,
                       ckpt_root=ckpt_root)
    with session(store) as s:
        run = s.get(Run, run_id)
        steps = s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step)).all()
        evals = s.scalars(select(Eval).where(Eval.run_id == run_id).order_by(Eval.step, Eval.benchmark)).all()
        return {"status": run.status, "peak_accuracy": run.peak_accuracy, "final_accuracy": run.final_accuracy,
                "calibration": run.calibration,
                "steps": [{"step": st.step, "metrics": deterministic(st.metrics)} for st in steps],
                "evals": [[e.step, e.benchmark, e.n, e.score] for e in evals]}


def generate() -> dict:
    import torch

    torch.set_num_threads(1)
    out = {"build_args": BUILD, "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["BENCH_HOME"] = str(Path(tmp) / "home")
        url = f"sqlite:///{Path(tmp) / 'store.db'}"
        build = make_build(url)
        for name, algo, dtype, over in CASES:
            cfg = base_config()
            for k, v in over.items():
                setattr(cfg, k, v)
            config = json.loads(json.dumps(asdict(cfg)))
            out["cases"].append({"name": name, "algo": algo, "dtype": dtype, "config": config,
                                 **run_case(url, build, config, algo, dtype, Path(tmp) / "ckpt")})
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    data = generate()
    Path(sys.argv[1]).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
