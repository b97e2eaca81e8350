"""Grading throughput: bench's grader (verdict cache + process pool, hard timeouts) vs a plain
loop calling math-verify's parse/verify on every answer, on a realistic build-shaped set: the
embedded model's responses, 40 per problem.

    python benchmarks/grading.py [--problems 100] [--k 40] [--pad-chars 25000] [--workers 1,2]

`--pad-chars N` puts N characters of reasoning-like text (prose, fractions, braces, an early
`\boxed{}` that is not the answer) before each response, the length of an R1-style answer;
`--workers` times the grader once per pool size (its scaling with cores). The CPU's flags and
the core count are printed beside the ratios.
"""

from __future__ import annotations

import argparse
import logging
import time

from bench.engines import Sampling, make_engine
from bench.grading import Grader, extract
from bench.models import PLAIN_TEMPLATE, TINY_MATH_DIR
from bench.provenance import cpu_summary
from bench.synthetic import synthetic_examples


def plain_loop(responses, golds) -> int:
    from math_verify import parse, verify

    correct = 0
    for r, g in zip(responses, golds):
        ext = extract(r)
        if ext is None:
            continue
        correct += bool(verify(parse(f"${g}$"), parse(f"\\boxed{{{ext}}}")))
    return correct


def padding(n: int) -> str:
    """About n characters of an R1-style chain of thought, without a final answer."""
    unit = ("Let me check this step by step: \\frac{a}{b} + \\frac{c}{d} = \\frac{ad + bc}{bd}, so "
            "the first guess \\boxed{0} was wrong. ")
    return (unit * (n // len(unit) + 1))[:n] + "\n" if n else ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--k", type=int, default=40)
    ap.add_argument("--pad-chars", type=int, default=0, help="characters of reasoning before each response")
    ap.add_argument("--workers", default="2", help="grader pool sizes to time, e.g. 1,2")
    a = ap.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    rows = synthetic_examples("test", a.problems)
    engine = make_engine("torch", str(TINY_MATH_DIR), "fp32")
    out = engine.generate([PLAIN_TEMPLATE.format(problem=r["problem"]) for r in rows], a.k, Sampling(max_tokens=64))
    pad = padding(a.pad_chars)
    responses = [pad + s.text for row in out for s in row]
    golds = [r["answer"] for r in rows for _ in range(a.k)]
    t0 = time.perf_counter()
    n_plain = plain_loop(responses, golds)
    t_plain = time.perf_counter() - t0
    print(f"{len(responses)} responses ({a.problems} problems × {a.k}, {len(responses[0]):,} characters the first); "
          f"{cpu_summary()}")
    print(f"  plain math-verify loop  {len(responses) / t_plain:8.1f} answers/s  ({n_plain} correct)")
    first = None
    for workers in [int(w) for w in a.workers.split(",")]:
        t0 = time.perf_counter()
        with Grader(workers=workers) as g:
            verdicts = g.grade(responses, golds)
            unique = len(g.cache)
        t_ours = time.perf_counter() - t0
        first = first or t_ours
        n_ours = sum(v.correct for v in verdicts)
        print(f"  bench grader, {workers} worker(s) {len(responses) / t_ours:8.1f} answers/s  ({n_ours} correct, "
              f"{unique} unique pairs, pool start included): {t_plain / t_ours:.2f}x the loop, "
              f"{first / t_ours:.2f}x the first pool size")


if __name__ == "__main__":
    main()
