"""The pins behind "staleness K=0 reproduces the runs from before staleness existed"
(tests/runners/test_staleness.py): 3-step native runs of tiny-math on a 12-problem build, every
deterministic per-step metric and every evaluation.

Two files, two kinds of pin:

- tests/data/staleness_golden.json — the **pre-change pin**: the fp32 cases, written by the code
  from before `RunConfig.staleness` existed (`python tests/staleness_golden.py FILE`, twice, with
  identical output) on a CPU of kind `recorded_on` (`cpu_kind()`: avx512). Never regenerated.
  On that kind of CPU a run must reproduce it bit for bit; on another kind (fp32 GEMMs block
  and round in another order) within FP32_TOLERANCE: the same tokens, rewards, evaluations
  and status, the training numbers to 1e-3 relative, and the fp32 mismatch metrics — pure
  kernel-order noise, ~1e-7 — to 1e-3 absolute.
- tests/data/regression_fp16.json — a **regression snapshot**, not a pin of the code from
  before: the fp16 cases, keyed by `snapshot_key()` (CPU kind / 16-bit kernel path, run with
  BENCH_CPU_16BIT=none so the emulated kernels run on any CPU). It was written by today's code
  (`python tests/staleness_golden.py --fp16-snapshot`), and is rewritten on purpose whenever the
  engines' 16-bit arithmetic changes (it last changed with issue 20's split-K GEMMs and
  FlashAttention arithmetic); a key it lacks is recorded, not guessed.

The configs are stored whole in the files (not read from a preset), so a later change to a
preset does not move the target.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

STALENESS_KEYS = "staleness_"      # logged since staleness exists (0 at K=0): not part of "the runs of before"

BUILD = ["build", "--model", "tiny-math", "--limit", "12", "--k", "2", "--engine", "torch", "--dtype", "fp32",
         "--band", "0", "1", "--json"]

# (name, algo, precision, RunConfig overrides)
CASES = [
    ("pg-seq-is fp32", "pg-seq-is", "fp32", {}),
    ("pg-seq-is fp16", "pg-seq-is", "fp16", {}),
    ("grpo fp32", "grpo", "fp32", {}),
    ("grpo fp16", "grpo", "fp16", {}),
    ("grpo fp32 updates_per_batch=2", "grpo", "fp32", {"updates_per_batch": 2}),
    ("pg-seq-is fp16 micro-batches", "pg-seq-is", "fp16", {"max_tokens_per_microbatch": 300}),
]
FP16_SNAPSHOT_PATH = "none"       # BENCH_CPU_16BIT of the fp16 snapshot: the emulated kernels, any CPU
# metrics that compare engines (in fp32 pure kernel-order noise): absolute tolerance across CPU kinds
NOISE_METRICS = ("kl_", "chi2_", "prob_", "log_ppl_diff", "log_ppl_abs_diff", "log_ratio_slope")
FP32_TOLERANCE = {"rel": 1e-3, "noise_abs": 1e-3}


# what moves an fp32 GEMM's kernel choice besides the instruction set: the library's own switches
KERNEL_ENV = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")


def cpu_kind() -> str:
    """The CPU kind an fp32 GEMM's rounding order depends on: avx512-amx, avx512 or avx2 (a Xeon
    with AMX and AVX512-FP16 rounded the fp32 pin's loss otherwise than the avx512 CPU it was
    recorded on: measured, the cause inside oneDNN not traced). The vendor too: the recorded
    avx2 and avx512 kinds are AMD EPYCs (avx512-amx an Intel Xeon), and the math libraries pick
    their fp32 kernels by vendor and model as well as by instruction set, so an Intel CPU without
    AMX is a kind of its own ("avx512-GenuineIntel") that no snapshot claims. A library switch
    in the environment (KERNEL_ENV) makes a kind of its own as well ("avx2+ONEDNN_MAX_CPU_ISA=AVX2")."""
    from bench.kernels import _cpu_flags, cpuinfo_field

    flags = _cpu_flags()
    kind = "avx2" if "avx512f" not in flags else ("avx512-amx" if "amx_tile" in flags else "avx512")
    vendor = cpuinfo_field("vendor_id") or "unknown"
    if vendor != ("GenuineIntel" if kind == "avx512-amx" else "AuthenticAMD"):
        kind += f"-{vendor}"
    return kind + "".join(f"+{k}={os.environ[k]}" for k in KERNEL_ENV if os.environ.get(k))


def snapshot_key() -> str:
    return f"{cpu_kind()}/{FP16_SNAPSHOT_PATH}"


def close_enough(want: dict, have: dict) -> dict:
    """The metrics of one step that differ beyond FP32_TOLERANCE: {name: (want, have)}; a
    metric present on one side only differs."""
    bad = {}
    for k in set(want) | set(have):
        a, b = want.get(k), have.get(k)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            tol = (FP32_TOLERANCE["noise_abs"] if k.startswith(NOISE_METRICS)
                   else FP32_TOLERANCE["rel"] * max(abs(a), abs(b)))
            if abs(a - b) > tol:
                bad[k] = (a, b)
        elif a != b:
            bad[k] = (a, b)
    return bad


def base_config():
    from runners.presets import Benchmark, RunConfig

    cfg = RunConfig(prompts_per_step=4, samples_per_prompt=4, max_steps=3, eval_every=3, checkpoint_every=3,
                    eval_split_m=1, max_tokens=40, threads=1,
                    benchmarks=[Benchmark("synthetic-hard", "synthetic-hard", n=1, limit=8)])
    cfg.algo.max_len = 40
    return cfg


def deterministic(metrics: dict, staleness: bool = False) -> dict:
    """The metrics that do not measure the machine; `staleness_*` too only when asked."""
    from bench.machine_metrics import is_machine_metric

    return {k: v for k, v in metrics.items() if not is_machine_metric(k)
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
    from runners.plan import config_from_dict
    from runners.runs import start_run

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


def generate(dtype: str) -> dict:
    """Run every case of `dtype` (fp32 or fp16) in a fresh store."""
    import torch

    torch.set_num_threads(1)
    out = {"build_args": BUILD, "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["BENCH_HOME"] = str(Path(tmp) / "home")
        url = f"sqlite:///{Path(tmp) / 'store.db'}"
        build = make_build(url)
        for name, algo, case_dtype, over in CASES:
            if case_dtype != dtype:
                continue
            cfg = base_config()
            for k, v in over.items():
                setattr(cfg, k, v)
            config = json.loads(json.dumps(asdict(cfg)))
            out["cases"].append({"name": name, "algo": algo, "dtype": dtype, "config": config,
                                 **run_case(url, build, config, algo, dtype, Path(tmp) / "ckpt")})
    return out


SNAPSHOT = Path(__file__).parent / "data" / "regression_fp16.json"

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if sys.argv[1:] == ["--fp16-snapshot"]:          # (re)record this CPU kind's fp16 regression snapshot
        os.environ["BENCH_CPU_16BIT"] = FP16_SNAPSHOT_PATH
        snap = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {}
        snap[snapshot_key()] = generate("fp16")
        SNAPSHOT.write_text(json.dumps(snap, indent=1, sort_keys=True) + "\n")
    else:                                             # the pre-change pin: only ever by the code of before
        data = {**generate("fp32"), "recorded_on": cpu_kind()}
        Path(sys.argv[1]).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
