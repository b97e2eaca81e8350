"""Cutting a mini-batch into micro-batches (runners/microbatches.py), against hand-computed
cuts and, for `by_length` without a budget, against every possible cut of the sorted rows."""

from __future__ import annotations

import itertools
import random

import pytest

from runners.microbatches import by_length, in_order


def cost(parts: list[list[int]], lengths: list[int], c: int) -> int:
    """Σ_g (|g| · max ℓ + c)."""
    return sum(len(p) * max(lengths[r] for r in p) + c for p in parts)


def test_in_order_cuts_where_the_next_row_would_pass_the_budget():
    # [0, 1] pads to 3 · 2 = 6; with row 2 it would be 6 · 3 = 18 > 12; [2, 3] is 6 · 2 = 12
    assert in_order([3, 3, 6, 2], [0, 1, 2, 3], 12) == [[0, 1], [2, 3]]
    assert in_order([3, 3, 6, 2], [3, 1], None) == [[3, 1]]          # no budget: one part, the rows' order
    assert in_order([20, 3], [0, 1], 10) == [[0], [1]]               # a row past the budget alone


@pytest.mark.parametrize("c, want", [
    (2, [[1], [0], [2, 3, 4]]),      # 3 + 7 + 32 = 42 (one group: 52; [1, 0] then the rest: 44)
    (5, [[1, 0], [2, 3, 4]]),        # 15 + 35 = 50 (one group: 55; three groups: 51)
    (20, [[1, 0, 2, 3, 4]]),         # 70 (two groups: 80)
])
def test_by_length_sorts_and_cuts_where_padding_costs_more_than_a_pass(c, want):
    lengths = [5, 1, 10, 10, 10]
    assert by_length(lengths, [4, 3, 2, 1, 0], None, c) == want


def test_by_length_equal_lengths_are_one_pass():
    assert by_length([7] * 6, [5, 0, 3, 1, 4, 2], None, 0) == [[0, 1, 2, 3, 4, 5]]
    assert by_length([7, 9], [], None) == []


def test_by_length_keeps_the_budget():
    parts = by_length([10] * 5, list(range(5)), 20, 1)
    assert len(parts) == 3 and all(len(p) * 10 <= 20 for p in parts)
    assert [r for p in parts for r in p] == [0, 1, 2, 3, 4]
    assert by_length([30, 2, 2], [0, 1, 2], 10, 0) == [[1, 2], [0]]     # a row past the budget alone


def test_by_length_is_the_least_cost_cut():
    """Against every cut of the sorted rows (2^(n−1) of them), random lengths and pass costs."""
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 9)
        lengths = [rng.randint(1, 12) for _ in range(n)]
        c = rng.choice([0, 1, 4, 16])
        rows = list(range(n))
        rng.shuffle(rows)
        got = by_length(lengths, rows, None, c)
        order = sorted(rows, key=lambda r: (lengths[r], r))
        assert [r for p in got for r in p] == order
        best = min(cost([order[a:b] for a, b in zip((0, *cuts), (*cuts, n))], lengths, c)
                   for k in range(n) for cuts in itertools.combinations(range(1, n), k))
        assert cost(got, lengths, c) == best, (lengths, c)
