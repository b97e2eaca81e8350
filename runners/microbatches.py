"""How a mini-batch's rows are cut into micro-batches (forward/backward passes), each trimmed
to its longest row: pure functions of the rows' lengths (prompt + response tokens).

`in_order`: the rows in their order, a new part when the next row would take the padded size
(rows × longest row) past the budget (one part without a budget).

`by_length` (`RunConfig.group_by_length`, the default): the rows sorted by length, then cut
into the consecutive groups g that minimise the padded tokens plus a fixed cost per pass,

    cost = Σ_g ( |g| · max_{i∈g} ℓ_i  +  c ),      |g| · max_{i∈g} ℓ_i ≤ budget (or |g| = 1),

by dynamic programming over the sorted rows (ℓ ascending, so a group's longest row is its
last). c (`PASS_COST_TOKENS`) is a pass's cost that does not grow with its tokens (the
dispatch of every layer's operations, the head's chunking), counted in tokens. verl's dynamic
batch size and TRL's `group_by_length` group rows by length for the same reason; neither packs
rows into one sequence here, since CPU attention has no variable-length kernel (a packed row's
block-diagonal mask would be quadratic in the whole batch's tokens).
"""

from __future__ import annotations

import bisect

# Measured on tiny-math, one CPU thread (benchmarks/microbatch_cost.py, fp16 on an AVX512-BF16
# CPU): a forward + backward costs ~68 µs per padded token and ~5 ms per pass besides: c ≈ 77
# tokens. Rounded up to 256 so that a group is cut only for a clear saving (fewer, larger passes
# also keep more rows in each GEMM, which a GPU needs more than a CPU).
PASS_COST_TOKENS = 256


def in_order(lengths: list[int], rows: list[int], budget: int | None) -> list[list[int]]:
    """`rows` cut in order into parts of at most `budget` padded tokens (one part without a
    budget); a row longer than the budget is a part of its own."""
    if not budget:
        return [list(rows)]
    out, cur, width = [], [], 0
    for i in rows:
        w = max(width, lengths[i])
        if cur and w * (len(cur) + 1) > budget:
            out.append(cur)
            cur, w = [], lengths[i]
        cur.append(i)
        width = w
    if cur:
        out.append(cur)
    return out


def by_length(lengths: list[int], rows: list[int], budget: int | None,
              pass_cost: int = PASS_COST_TOKENS) -> list[list[int]]:
    """`rows` sorted by (length, row) and cut into the consecutive groups of least
    Σ_g (|g| · max ℓ + pass_cost) (module doc); with a budget, the groups stay within it.

    cost[i], the least cost of the first i sorted rows, is min over j < i of
    f(j) = cost[j] + (i − j)·ℓ_i + c. Where row j−1 and row j have one length,
    cost[j+1] ≤ cost[j] + ℓ_j ≤ cost[j] + ℓ_i (row j joins the last group), so f(j+1) ≤ f(j):
    only the j where a new length starts, the first j allowed and i − 1 need trying
    (O(rows × distinct lengths)). Exact without a budget; with one, the first j the budget
    allows is tried too, and a full last group can make the result slightly above the least."""
    order = sorted(rows, key=lambda r: (lengths[r], r))
    ell = [lengths[r] for r in order]
    n = len(order)
    if n == 0:
        return []
    starts = [j for j in range(1, n) if ell[j] != ell[j - 1]]        # row j has a new length
    cost, cut = [0] * (n + 1), [0] * (n + 1)
    for i in range(1, n + 1):
        w = ell[i - 1]
        lo = max(0, i - max(1, budget // w)) if budget else 0
        best, arg = None, None
        for j in (lo, *starts[bisect.bisect_left(starts, lo + 1):bisect.bisect_left(starts, i - 1)], i - 1):
            c = cost[j] + (i - j) * w + pass_cost
            if best is None or c < best:
                best, arg = c, j
        cost[i], cut[i] = best, arg
    parts, i = [], n
    while i:
        parts.append(order[cut[i]:i])
        i = cut[i]
    return parts[::-1]
