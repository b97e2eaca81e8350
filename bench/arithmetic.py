"""`arithmetic[:LEVELS]`: graded problems a 100M-parameter pretrained model partly solves, for the
sanity test of small real models (SmolLM2-135M solves ~14% of one-digit sums with a boxed-answer
instruction, ~1 in 48 MATH500 problems). Exact integer answers, which math-verify grades.

    level 1   one-digit sums                          "What is 7 + 5?"
    level 2   one-digit differences and products      "What is 9 - 4?", "What is 6 * 3?"
    level 3   a two-digit and a one-digit number      "What is 47 + 8?", "What is 23 - 6?"
    level 4   two two-digit numbers                   "What is 38 + 45?", "What is 72 - 29?"
    level 5   short word problems, one step           "Tom has 7 apples and buys 5 more. How many apples
                                                       does Tom have now?"

`arithmetic` draws the levels in turn (1, 2, 3, 4, 5, 1, …); `arithmetic:1-3` or `arithmetic:2,4`
only those. Each problem text appears once; the draw is deterministic in the seed (`--seed`);
ids hash the text (bench/problem_ids.py), so a problem keeps its id whatever else is drawn.
"""

from __future__ import annotations

import random

from bench.errors import SourceError

LEVELS = (1, 2, 3, 4, 5)
DEFAULT_LIMIT = 500
_NAMES = ("Tom", "Ana", "Li", "Sam", "Mia", "Omar", "Eva", "Raj")
_THINGS = ("apples", "books", "coins", "pencils", "stickers", "marbles", "cards", "shells")


def parse_levels(spec: str) -> tuple[int, ...]:
    """"" → every level; "2" → (2,); "1-3" → (1, 2, 3); "2,4" → (2, 4). SourceError otherwise."""
    if not spec:
        return LEVELS
    out: list[int] = []
    try:
        for part in spec.split(","):
            lo, sep, hi = part.strip().partition("-")
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        out = []
    if not out or any(x not in LEVELS for x in out):
        raise SourceError(f"arithmetic:{spec}: levels are 1-5, e.g. arithmetic:1-3 or arithmetic:2,4")
    return tuple(dict.fromkeys(out))


def item(level: int, rng: random.Random) -> tuple[str, int]:
    """One problem of `level`: (text, answer)."""
    if level == 1:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return f"What is {a} + {b}?", a + b
    if level == 2:
        a, b = rng.randint(2, 9), rng.randint(1, 9)
        if rng.random() < 0.5:
            a, b = max(a, b), min(a, b)
            return f"What is {a} - {b}?", a - b
        return f"What is {a} * {b}?", a * b
    if level == 3:
        a, b = rng.randint(10, 99), rng.randint(1, 9)
        return (f"What is {a} + {b}?", a + b) if rng.random() < 0.5 else (f"What is {a} - {b}?", a - b)
    if level == 4:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if rng.random() < 0.5:
            return f"What is {a} + {b}?", a + b
        a, b = max(a, b), min(a, b)
        return f"What is {a} - {b}?", a - b
    if level == 5:
        who, what = rng.choice(_NAMES), rng.choice(_THINGS)
        a, b = rng.randint(2, 12), rng.randint(1, 9)
        if rng.random() < 0.5:
            return f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now?", a + b
        a = a + b
        return f"{who} has {a} {what} and gives away {b}. How many {what} does {who} have left?", a - b
    raise ValueError(level)


def arithmetic_rows(spec: str, limit: int | None, seed: int = 0) -> list[dict]:
    """`limit` (default 500) problems of the levels `spec` names, levels in turn, each text once
    (a level whose distinct problems run out — level 1 has 81 — leaves the turn to the others):
    rows {"problem", "answer", "level"} for bench/problems.py."""
    levels = list(parse_levels(spec))
    n = limit or DEFAULT_LIMIT
    rng = random.Random(f"arithmetic:{seed}")
    seen: set[str] = set()
    rows: list[dict] = []
    turn = 0
    while len(rows) < n:
        if not levels:
            raise SourceError(f"arithmetic:{spec or '1-5'} has {len(rows)} distinct problems, fewer than {n}: "
                              "ask for fewer (--limit) or more levels")
        level = levels[turn % len(levels)]
        for _ in range(500):                 # a level is exhausted when 500 draws in a row repeat
            text, answer = item(level, rng)
            if text not in seen:
                break
        else:
            levels.remove(level)
            continue
        seen.add(text)
        rows.append({"problem": text, "answer": str(answer), "level": level})
        turn += 1
    return rows
