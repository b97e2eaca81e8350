"""Step-0 training–inference mismatch of the built-in engines, per precision pair, on one CPU
kernel path: the rollout engine samples `--prompts` × `--n` responses (T = 1, ≤ 64 tokens) from
tiny-math, the training engine scores the same tokens, and the table gives k3 per token, the
mean |Δ log p|, and the share of tokens whose log-probability differs at all (a pair whose share
is 0 computes bit for bit alike: its mismatch is not measured but absent).

    BENCH_CPU_16BIT=none python benchmarks/engine_mismatch.py [--pairs all|fp16;bf16;...]

Run it with BENCH_CPU_16BIT=none (the path of a CPU without AVX512-BF16/FP16) and =all (torch's
native 16-bit kernels) to compare the paths; unset, the CPU's own flags decide.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default="all", help="`all`, `all16` or pairs separated by ; (bench's --dtype syntax)")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from bench import kernels, precision
    from bench.provenance import cpu_summary
    from runners.offline_mismatch import step0_pairs

    pairs = precision.parse_list(args.pairs)
    print(f"{cpu_summary()}; kernel path (BENCH_CPU_16BIT): {kernels.cpu_kernel_path()}; "
          f"torch {torch.__version__}; {args.prompts} prompts x {args.n}")
    t = time.perf_counter()
    rows = step0_pairs(pairs, args.prompts, args.n)
    print(f"{'pair':28} {'tokens':>6} {'k3/token':>10} {'mean|dlogp|':>11} {'differ':>7}")
    for r in rows:
        print(f"{r['pair']:28} {r['tokens']:6d} {r['k3']:10.3g} {r['abs_dlogp']:11.3g} {r['differ']:7.1%}")
    print(f"({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
