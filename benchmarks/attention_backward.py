"""torch's CPU attention (`scaled_dot_product_attention`, the flash kernel transformers' sdpa path
calls) forward and backward per format, at the demo's training shapes: tiny-math's 4 heads of
dimension 32, rows as long as a prompt and its response (128 rows × 48 positions, 32 × 100),
causal (the trainer's rows also carry a padding mask, which this leaves out), one torch thread.
The ratio to fp32 beside each: where a CPU's native 16-bit kernels are slower than fp32 at these
shapes, the trainer of a 16-bit cell pays it (the kernel the trainer and the
rollout engine run is chosen by the CPU's 16-bit path, bench/kernels.py, not by speed).

    python benchmarks/attention_backward.py [--repeats 5] [--threads 1]

Fastest of `--repeats` each after one untimed round, the formats in turn within a repeat."""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from bench.kernels import cpu_kernel_path
from bench.provenance import cpu_summary

SHAPES = ((128, 48), (32, 100))              # (rows, positions)
HEADS, HEAD_DIM = 4, 32                      # tiny-math's
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def one(rows: int, width: int, dtype: torch.dtype, generator: torch.Generator) -> tuple[float, float]:
    """(forward, backward) seconds of one causal attention over [rows, HEADS, width, HEAD_DIM]."""
    q, k, v = (torch.randn(rows, HEADS, width, HEAD_DIM, generator=generator).to(dtype).requires_grad_()
               for _ in range(3))
    t0 = time.perf_counter()
    loss = F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()
    t1 = time.perf_counter()
    loss.backward()
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    best = {(s, d): (float("inf"), float("inf")) for s in SHAPES for d in DTYPES}
    for repeat in range(a.repeats + 1):              # the first round warms the kernels up, untimed
        for s in SHAPES:
            for d, dt in DTYPES.items():
                f, b = one(*s, dt, g)
                if repeat:
                    best[s, d] = (min(best[s, d][0], f), min(best[s, d][1], b))
    print(f"scaled_dot_product_attention, {HEADS} heads × {HEAD_DIM}, causal, {a.threads} thread(s), fastest of "
          f"{a.repeats}, torch {torch.__version__}; {cpu_summary()}; 16-bit kernels: {cpu_kernel_path()}")
    for rows, width in SHAPES:
        f32, b32 = best[(rows, width), "fp32"]
        for d in DTYPES:
            f, b = best[(rows, width), d]
            print(f"  {rows:4d} rows × {width:3d} positions  {d:4s}  forward {f * 1e3:6.1f} ms ({f / f32:4.2f}× fp32)  "
                  f"backward {b * 1e3:6.1f} ms ({b / b32:4.2f}× fp32)")


if __name__ == "__main__":
    main()
