"""Grading throughput: bench's grader (verdict cache + process pool, hard timeouts) vs a plain
loop calling math-verify's parse/verify on every answer, on a realistic build-shaped set: the
embedded model's responses, 40 per problem.

    python benchmarks/grading.py [--problems 100] [--k 40]
"""

from __future__ import annotations

import argparse
import logging
import time

from bench.engines import Sampling, make_engine
from bench.grading import Grader, extract
from bench.models import PLAIN_TEMPLATE, TINY_MATH_DIR
from bench.problems import synthetic_examples


def plain_loop(responses, golds) -> int:
    from math_verify import parse, verify

    correct = 0
    for r, g in zip(responses, golds):
        ext = extract(r)
        if ext is None:
            continue
        correct += bool(verify(parse(f"${g}$"), parse(f"\\boxed{{{ext}}}")))
    return correct


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--k", type=int, default=40)
    a = ap.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    rows = synthetic_examples("test", a.problems)
    engine = make_engine("torch", str(TINY_MATH_DIR), "fp32")
    out = engine.generate([PLAIN_TEMPLATE.format(problem=r["problem"]) for r in rows], a.k, Sampling(max_tokens=64))
    responses = [s.text for row in out for s in row]
    golds = [r["answer"] for r in rows for _ in range(a.k)]
    t0 = time.perf_counter()
    n_plain = plain_loop(responses, golds)
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    with Grader() as g:
        verdicts = g.grade(responses, golds)
        unique = len(g.cache)
    t_ours = time.perf_counter() - t0
    n_ours = sum(v.correct for v in verdicts)
    print(f"{len(responses)} responses ({a.problems} problems × {a.k}); {unique} unique (answer, gold) pairs")
    print(f"  plain math-verify loop  {len(responses) / t_plain:8.1f} answers/s  ({n_plain} correct)")
    print(f"  bench grader            {len(responses) / t_ours:8.1f} answers/s  "
          f"({n_ours} correct, pool start included)")
    print(f"  ratio: {t_plain / t_ours:.2f}x")


if __name__ == "__main__":
    main()
