"""The training forward + backward with the rows grouped by length (`group_by_length`, the
default) against one padded batch (`--no-group-by-length`), on the demo's step: tiny-math,
pg-seq-is, 64 prompts × 8 responses, one torch thread; and the fixed cost of a pass, in
tokens (runners/microbatches.py's PASS_COST_TOKENS).

    python benchmarks/microbatch_cost.py [--steps 6] [--dtype fp16] [--threads 1]

Both trainers start from the same weights and seed and run in turn, step by step (this
machine's speed drifts within minutes); a step's training time is its `time_train` metric (the
π_old/π_θ forward, backward, AdamW), the rollout and grading excluded. The first step is a
warm-up. The pass cost: forward + backward of k = 1 … 64 rows of one step's batch of about its
median length, fitted as seconds = a · padded tokens + b; b / a is the pass's fixed cost in
tokens.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time

import torch

from bench.models import resolve_model
from bench.precision import Precision
from bench.problems import Problem
from bench.provenance import cpu_summary
from bench.store import open_store
from bench.synthetic import synthetic_examples
from runners.logprobs import response_logprobs
from runners.plan import RunPlan
from runners.presets import get_preset
from runners.trainer import NativeTrainer


def trainer(problems: list[Problem], dtype: str, grouped: bool, threads: int) -> NativeTrainer:
    cfg = get_preset("tiny")
    cfg.threads, cfg.benchmarks, cfg.group_by_length = threads, [], grouped
    store = open_store(f"sqlite:///{tempfile.mkdtemp()}/b.db")
    plan = RunPlan("pg-seq-is", Precision(dtype, dtype), cfg, "bench", "bench", resolve_model("tiny-math"), "torch",
                   "cpu")
    return NativeTrainer(store, "bench", plan, problems, None)


def padded(parts: list[list[int]], lengths: list[int]) -> int:
    return sum(len(p) * max(lengths[i] for i in p) for p in parts)


def pass_cost(t: NativeTrainer, batch, repeats: int = 5) -> tuple[float, float]:
    """(a, b) of seconds = a · padded tokens + b, fitted by least squares over forward +
    backward passes of k = 1 … 64 rows of `batch` (a step's) of about its median length (the
    width near-constant, so b is the pass's cost that does not grow with its rows); the
    fastest of `repeats` each."""
    order = sorted(range(len(batch.lengths)), key=lambda i: batch.lengths[i])
    mid = len(order) // 2
    xs, ys = [], []
    for k in (1, 2, 4, 8, 16, 32, 64):
        ids, attn, tok, pos, m = batch.rows(order[mid - k // 2:mid - k // 2 + k])
        times = []
        for _ in range(repeats):
            t.learner.compute.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            (response_logprobs(t.learner.compute, ids, attn, tok, pos) * m).sum().backward()
            times.append(time.perf_counter() - t0)
        xs.append(ids.shape[0] * ids.shape[1])
        ys.append(min(times))
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return a, my - a * mx


def _sampling(t: NativeTrainer):
    from bench.engines import Sampling

    c = t.cfg
    return Sampling(c.temperature, c.top_p, c.max_tokens, seed=c.seed * 1_000_003)


def demo_problems() -> list[Problem]:
    """The 300 synthetic problems the demo's builds draw from."""
    return [Problem(r["id"], r["problem"], r["answer"]) for r in synthetic_examples("test", 300)]


def first_step(dtype: str, threads: int) -> tuple[NativeTrainer, list[int], object]:
    """A grouped-by-length trainer of the demo's cell in `dtype` (math-verify's warnings off, torch
    at `threads`), its step-0 prompts and their rollouts packed as the trainer packs them (a Batch)."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    torch.set_num_threads(threads)
    t = trainer(demo_problems(), dtype, True, threads)
    idx = t._step_prompts(0)
    _, batch, *_ = t._rollouts(idx, _sampling(t))
    return t, idx, batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--dtype", default="fp16", help="rollout = train format (the demo's positive control: fp16)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    torch.set_num_threads(a.threads)
    problems = demo_problems()
    sides = {"grouped": trainer(problems, a.dtype, True, a.threads), "one batch": trainer(problems, a.dtype, False,
                                                                                         a.threads)}
    times = {k: [] for k in sides}
    passes = {k: [] for k in sides}
    for step in range(a.steps):
        for name, t in sides.items():
            m = t.train_step()
            t.step += 1
            if step:
                times[name].append(m["time_train"])
                passes[name].append(m["micro_batches"])
    # the padded tokens of one batch cut each way
    g = sides["grouped"]
    _, batch, *_ = g._rollouts(g._step_prompts(0), _sampling(g))
    rows = list(range(len(batch.lengths)))
    tokens = {name: padded(t.learner.parts(rows, batch), batch.lengths) for name, t in sides.items()}
    a_s, b_s = pass_cost(g, batch)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"training forward + backward + AdamW, tiny-math pg-seq-is {a.dtype}, 64 × 8, {a.threads} thread(s), "
          f"median of {a.steps - 1} steps; {cpu_summary()}")
    print(f"  real tokens of a step-0 batch: {sum(batch.lengths)}")
    for k in sides:
        print(f"  {k:9s}  {med[k]:6.3f} s/step  passes {statistics.median(passes[k]):.0f}  padded tokens {tokens[k]} "
              f"({tokens[k] / sum(batch.lengths):.2f}× the real ones)")
    print(f"  ratio grouped / one batch: {med['grouped'] / med['one batch']:.2f}")
    print(f"  a pass: {a_s * 1e6:.1f} µs per padded token + {b_s * 1e3:.1f} ms → fixed cost {b_s / a_s:.0f} tokens "
          f"(PASS_COST_TOKENS)")
    for t in sides.values():
        t.close()


if __name__ == "__main__":
    main()
