"""The synthetic MATH-style problems behind the embedded `tiny-math` model: the SFT pool the model
was trained on, the held-out `test` split and `synthetic-hard` (two-step problems of large
products the SFT pool excludes), each deterministic in its seed. bench/problems.py loads them as
the `synthetic[:split]` and `synthetic-hard` sources; bench/tinymath.py trains on the pool."""

from __future__ import annotations

import functools
import hashlib
import random

from bench.errors import SourceError
from bench.problem_ids import last_boxed, problem_id


SYNTHETIC_SPLITS = ("train", "test", "synthetic-hard")
SYNTHETIC_KINDS = ("add", "sub", "mul", "two-step")


def _synthetic_item(kind: str, rng: random.Random) -> tuple[str, str, str]:
    """One problem: (kind, problem text, worked solution ending in \\boxed{answer})."""
    if kind == "add":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return kind, f"Compute {a}+{b}.", f"{a}+{b}={a + b}. \\boxed{{{a + b}}}"
    if kind == "sub":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return kind, f"Compute {a}-{b}.", f"{a}-{b}={a - b}. \\boxed{{{a - b}}}"
    if kind == "mul":
        a, b = rng.randint(2, 29), rng.randint(2, 9)
        return kind, f"Compute {a}*{b}.", f"{a}*{b}={a * b}. \\boxed{{{a * b}}}"
    if kind == "two-step":
        return (kind, *_two_step(rng.randint(2, 29), rng.randint(2, 9), rng.randint(0, 99)))
    raise ValueError(kind)


def _two_step(a: int, b: int, c: int) -> tuple[str, str]:
    p = a * b
    return f"Compute {a}*{b}-{c}.", f"{a}*{b}={p}. {p}-{c}={p - c}. \\boxed{{{p - c}}}"


def _is_test(problem: str, test_fraction: float) -> bool:
    """Train/test assignment by hash of the text, so a problem never lands in both."""
    return int(hashlib.sha1(problem.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < test_fraction


# The supervised training pool of the shipped tiny-math weights (bench/tinymath.py TrainConfig
# defaults): synthetic_examples("train", SFT_POOL, seed=SFT_SEED, distinct=False).
SFT_POOL = 20000
SFT_SEED = 0
# synthetic-hard's difficulty knob: a*b at least this. Base accuracy of the first 64 (fp32 avg@4,
# T=0.6): >= 180 → 0.19–0.23, >= 182 → 0.13, >= 190 → 0.08–0.11, >= 200 → 0.06–0.08.
HARD_MIN_PRODUCT = 182


@functools.lru_cache(maxsize=1)
def _hard_candidates(test_fraction: float = 0.1) -> tuple[tuple[int, int, int], ...]:
    """Every (a, b, c) of synthetic-hard, in a fixed order: two-step problems "Compute a*b-c."
    at the hard end of the trained range (a*b >= HARD_MIN_PRODUCT: the largest products, a
    three-digit minuend; a in 21..29, b in 7..9, c in 0..99; 1,422 problems), held out twice
    over: on the train side of the train/test hash (never in the test split, so never in a
    build's split) and not in the supervised pool the shipped weights were trained on (so
    never seen by the model). Operands outside the trained range (a >= 30, c >= 100, b >= 10)
    are no use: the model scores 0–4% there, and RL on the split cannot reach them."""
    sft = {r["problem"] for r in synthetic_examples("train", SFT_POOL, seed=SFT_SEED, distinct=False)}
    out = []
    for a in range(2, 30):
        for b in range(2, 10):
            if a * b < HARD_MIN_PRODUCT:
                continue
            for c in range(100):
                text = _two_step(a, b, c)[0]
                if not _is_test(text, test_fraction) and text not in sft:
                    out.append((a, b, c))
    return tuple(out)


def _synthetic_hard(n: int, seed: int) -> list[dict]:
    """The first `n` of a seeded shuffle of `_hard_candidates()` (so the first 64 stay the
    first 64 whatever `n`)."""
    cands = list(_hard_candidates())
    if n > len(cands):
        raise SourceError(f"cannot draw {n} distinct synthetic synthetic-hard problems (there are {len(cands)})")
    random.Random(f"synthetic-hard:{seed}").shuffle(cands)
    out = []
    for a, b, c in cands[:n]:
        text, sol = _two_step(a, b, c)
        out.append({"id": f"syn-synthetic-hard-{problem_id(text)}", "kind": "two-step", "problem": text,
                    "solution": sol, "answer": last_boxed(sol)})
    return out


def synthetic_examples(split: str, n: int, seed: int = 0, test_fraction: float = 0.1,
                       distinct: bool = True) -> list[dict]:
    """`n` synthetic problems of `split` ("train", "test" or "synthetic-hard"), with kind,
    worked solution and answer. Deterministic in (split, n, seed); kinds cycle evenly.
    `distinct=False` draws with repeats (a training pool larger than the small kinds allow).

    `synthetic-hard`, the tiny preset's stand-in for AIME, is held-out two-step problems from
    the hardest end of the trained range (see `_hard_candidates`). The shipped base model
    solves 0.125–0.141 of the first 64 (the tiny preset's benchmark: avg@4 at T=0.6, top-p 0.95,
    64 tokens, torch engine, the trainer's eval seeds for steps 0/10/20; fp32 0.125/0.137/0.137,
    bf16 0.129/0.141/0.137, fp16 0.125/0.137/0.137). It fails mostly at the second step, the
    three-digit subtraction, which training on a split of the same kinds improves: pg-seq-is in
    fp32 on the default tiny build (tiny preset, 60 steps) read 0.125, 0.148, 0.148, 0.117,
    0.145, 0.191, 0.176 at steps 0, 10, …, 60 while split accuracy rose 0.49 → 0.81 (each
    reading ±0.02 of sampling noise)."""
    if split not in SYNTHETIC_SPLITS:
        raise SourceError(f"unknown synthetic split {split!r}; choose one of {', '.join(SYNTHETIC_SPLITS)}")
    if split == "synthetic-hard":
        return _synthetic_hard(n, seed)
    rng = random.Random(f"{split}:{seed}")
    kinds = list(SYNTHETIC_KINDS)
    seen: set[str] = set()
    out: list[dict] = []
    misses = {k: 0 for k in kinds}
    turn = 0
    while len(out) < n:
        if not kinds:
            raise SourceError(f"cannot draw {n} distinct synthetic {split} problems")
        kind, text, sol = _synthetic_item(kinds[turn % len(kinds)], rng)
        fresh = not (distinct and text in seen)
        if _is_test(text, test_fraction) != (split == "test"):
            fresh = False
        if not fresh:
            misses[kind] += 1
            if misses[kind] > 2000:          # this kind has no distinct problems left: drop it
                kinds.remove(kind)
            continue
        misses[kind] = 0
        turn += 1
        seen.add(text)
        out.append({"id": f"syn-{split}-{problem_id(text)}", "kind": kind, "problem": text,
                    "solution": sol, "answer": last_boxed(sol)})
    return out
