"""Catch table of the step-0 calibration gate (bench/calibration.py): each of the gate test's own
plumbing faults (tests/bench/test_calibration.py: rollout temperature 0.7, RoPE inv_freq in bf16 in
the rollout engine, a stale untied lm_head that the weight sync misses) injected into the
built-in rollout engine, per precision pair, judged by the gate as it was (the band check alone:
`before`) and as it is (`after`: band, reference, processing, buffers), on one CPU kernel path.

    BENCH_CPU_16BIT=none python benchmarks/calibration_catch.py      # CPUs without AVX512-BF16/FP16
    BENCH_CPU_16BIT=all  python benchmarks/calibration_catch.py      # torch's native 16-bit kernels

The step-0 batch is the trainer's: `--prompts` tiny-math problems × `--n` responses (T = 1, at most
64 tokens), the rollout engine synced from the master as the trainer syncs a given engine, scored
by `runners.trainer.step0_gate`. Per row: the pair statistic k3(μ→π) and its band, the reference
ratio k3(μ→τ)/k3(τ→ρ) and its limit, the processing slope κ and its z, and the checks that
tripped. The last lines give, per rollout format, the largest ratio and |κ| of a correct pair and
the smallest of each fault: the margins of TWIN_RATIO and KAPPA_MAX (re-measure them here after a
change to either engine's kernels), and the gate's extra time per pair.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

DEFAULT_PAIRS = "fp32;fp16;bf16;rollout=fp8,train=fp16;rollout=fp8,train=fp32;rollout=int8,train=fp16;" \
                "rollout=int8,train=fp32;rollout=nvfp4,train=fp16;rollout=nvfp4,train=fp32"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default=DEFAULT_PAIRS, help="pairs separated by ; (bench's --dtype syntax)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=1, help="prompt sets (synthetic train problems, seeds 0..k-1)")
    ap.add_argument("--quiet", action="store_true", help="no per-row table: the margins and the verdict line only")
    ap.add_argument("--faults", default="none,temperature,rope,lm_head", help="which of none and the test's faults")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import test_calibration as tc          # the gate test's faults, as the test injects them
    from bench import calibration
    from bench.engines import Sampling
    from bench.models import load_model, load_tokenizer, render_prompt, resolve_model
    from bench.kernels import cpu_kernel_path
    from bench.precision import parse_list
    from bench.synthetic import synthetic_examples
    from runners.algos import get_loss
    from runners.presets import get_preset
    from runners.train_engine import Batch, TrainingEngine
    from runners.trainer import step0_gate

    pairs = parse_list(args.pairs)
    ref = resolve_model("tiny-math")
    tok = load_tokenizer(ref)
    cfg = get_preset("tiny")
    learners = {t: TrainingEngine(load_model(ref, torch.float32), t, cfg, get_loss("pg-seq-is"), "pg-seq-is")
                for t in dict.fromkeys(p.train for p in pairs)}
    faults = {k: v for k, v in {"none": tc._engine, **tc.FAULTS}.items() if k in args.faults.split(",")}
    print(f"# calibration catch table: CPU kernel path {cpu_kernel_path()} (BENCH_CPU_16BIT="
          f"{os.environ.get('BENCH_CPU_16BIT', '')!r}), {args.seeds} x ({args.prompts} prompts x {args.n}), "
          f"torch {torch.__version__}")
    print("| pair | fault | k3(μ→π) | band | before | ratio | c, z | κ | sign z | after | tripped |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    worst: dict[tuple[str, str], dict[str, float]] = {}
    extra: dict[str, list[float]] = {}
    base: dict[str, list[float]] = {}
    wrong, caught, missed, caught_before = [], [], [], 0
    for seed in range(args.seeds):
        problems = synthetic_examples("train", args.prompts, seed=seed)
        prompts = [render_prompt(ref, tok, p["problem"]) for p in problems]
        prompt_ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
        for r in dict.fromkeys(p.rollout for p in pairs):
            for fault, make in faults.items():
                eng = make(r)
                eng.update_weights(next(iter(learners.values())).master.named_parameters())   # as the trainer does
                samples = eng.generate(prompts, args.n, Sampling(1.0, 1.0, args.max_tokens, seed=30_000_001 + seed))
                flat = [s for row in samples for s in row]
                batch = Batch.pack([ids for ids in prompt_ids for _ in range(args.n)], [s.token_ids for s in flat],
                                   tok.pad_token_id)
                mu = torch.zeros(batch.mask.shape)
                for i, s in enumerate(flat):
                    mu[i, :len(s.logprobs)] = torch.tensor(s.logprobs)
                for pair in (p for p in pairs if p.rollout == r):
                    learner = learners[pair.train]
                    t0 = time.perf_counter()
                    pi = learner.logprobs(batch)
                    t1 = time.perf_counter()
                    after = step0_gate(learner, eng, pair, batch, mu)
                    t2 = time.perf_counter()
                    extra.setdefault(pair.name, []).append((t2 - t1) - (t1 - t0))
                    base.setdefault(pair.name, []).append(t1 - t0)
                    before = calibration.judge(calibration.calibration_metrics(mu, pi, batch.mask), r, pair.train)
                    ref_, proc = after["reference"], after["processing"]
                    ratio = "—" if ref_["ratio"] is None else f"{ref_['ratio']:.3g}"
                    limit = ("fp32 band" if r == "fp32" else f"{ref_['ratio_limit']:g}x, z {ref_['z']:+.1f}")
                    row = (f"| {pair.name} | {fault} | {after['k3']:.2e} | {after['band']['k3']:.0e} | "
                           f"{'pass' if before['ok'] else '**FAIL**'} | {ratio} | {limit} | {proc['kappa']:+.3f} | "
                           f"{proc['z']:+.1f} | {'pass' if after['ok'] else '**FAIL**'} | "
                           f"{', '.join(after['failed']) or '—'} |")
                    if not args.quiet or (fault == "none") != after["ok"]:
                        print(row, flush=True)
                    if fault == "none" and not after["ok"]:
                        wrong.append(f"{pair.name}")
                    if fault != "none":
                        (caught if not after["ok"] else missed).append(f"{pair.name}/{fault}")
                        caught_before += not before["ok"]
                    w = worst.setdefault((pair.name, fault), {"ratio": [], "kappa": []})
                    w["ratio"].append(ref_["ratio"] if ref_["ratio"] is not None else ref_["mean_rollout_ref"])
                    w.setdefault("z", []).append(ref_["z"] if ref_["ratio"] is not None else math.nan)
                    w.setdefault("zk", []).append(abs(proc["z"]))
                    w["kappa"].append(abs(proc["kappa"]))
                eng.close()
    print()
    print("margins (correct pairs: largest over seeds; faults: smallest):")
    for pair in pairs:
        ok = worst.get((pair.name, "none"), {"ratio": [math.nan], "kappa": [math.nan]})
        line = [f"  {pair.name:24s} correct ratio ≤ {max(ok['ratio']):.3g} (z ≤ {max(ok.get('z', [math.nan])):.1f})"
                f"  |κ| ≤ {max(ok['kappa']):.3g} (|z| ≤ {max(ok.get('zk', [math.nan])):.1f})"]
        for fault in (f for f in tc.FAULTS if f in faults):
            w = worst[(pair.name, fault)]
            line.append(f"{fault} ratio ≥ {min(w['ratio']):.3g} (z ≥ {min(w['z']):.1f}) |κ| ≥ {min(w['kappa']):.3g}")
        print(";  ".join(line))
    print("  (fp32 rollouts: 'ratio' is mean |log ρ − log μ| itself, within fp32's band "
          f"{calibration.BANDS['fp32']}); TWIN_RATIO = {calibration.TWIN_RATIO}; KAPPA_MAX = {calibration.KAPPA_MAX}, "
          f"Z_MIN = {calibration.Z_MIN}, Z_REF = {calibration.Z_REF}")
    med = lambda v: sorted(v)[len(v) // 2]                                            # noqa: E731
    print("gate's extra time per pair, s (median over runs; in brackets the old gate's one π forward): " + ", ".join(
        f"{k} {med(v):.2f} ({med(base[k]):.2f})" for k, v in extra.items()))
    print("correct pairs failed:", ", ".join(wrong) or "none")
    print(f"faults caught: {len(caught)} of {len(caught) + len(missed)} (before: {caught_before}); missed: "
          + (", ".join(missed) or "none"))

if __name__ == "__main__":
    main()
