"""The confidence bounds every stage shares, one definition each.

- `wilson_lower`: the one-sided Wilson score lower bound on a binomial proportion, on which the
  stop rule's `converged` rests (bench/stop.py: the successes pooled over the last evaluations).
- `wilson_interval`: the two-sided Wilson score interval with which an adaptive build decides a
  problem (datasets_build/adaptive.py).
- `t_quantile` / `t_interval`: Student's t (scipy.stats.t) and the two-sided interval for a mean
  over seeds (the old column of a cell's peak accuracy, leaderboard/cells.py: it can leave [0, 1]).
- `logit_t_interval`: the same interval on the logit scale, mapped back: the interval a cell shows
  for its peak accuracy, always inside (0, 1).
- `clopper_pearson_lower`: the one-sided exact lower bound on a binomial proportion: what k of N
  passing seeds say about one seed's pass probability.
- `permutation_p`: the exact two-sided permutation test of two samples' means: whether a code
  change moved a cell's steps or peak over its seeds (benchmarks/equivalence.py).

z is the standard normal quantile (statistics.NormalDist); the formulas are in the docstrings.
"""

from __future__ import annotations

import math
from itertools import combinations
from statistics import NormalDist


def wilson_lower(successes: float, n: float, confidence: float) -> float:
    """One-sided Wilson score lower bound at `confidence` on a binomial proportion:
    (p̂ + z²/2n − z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n), z = Φ⁻¹(confidence). `successes` may be
    fractional (an average of 0/1 rewards times n). 0.0 when n <= 0 (nothing is known)."""
    if n <= 0:
        return 0.0
    z = NormalDist().inv_cdf(confidence)
    p = min(max(successes / n, 0.0), 1.0)
    z2n = z * z / n
    rad = math.sqrt(max(p * (1 - p) / n + z2n / (4 * n), 0.0))
    return (p + z2n / 2 - z * rad) / (1 + z2n)


def wilson_interval(correct: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided Wilson score interval for a binomial proportion, clipped to [0, 1]:
    (p̂ + z²/2n ± z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n), z = Φ⁻¹(1/2 + confidence/2).
    (0, 1) when n = 0."""
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def t_quantile(p: float, df: float) -> float:
    """Inverse CDF of Student's t with `df` degrees of freedom (0 < p < 1): scipy.stats.t.ppf.
    A p outside (0, 1) or df <= 0 is a ValueError."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError("t_quantile needs 0 < p < 1 and df > 0")
    from scipy.stats import t

    return float(t.ppf(p, df))


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lower, upper): the two-sided Student-t interval for the mean of `values`,
    mean ± t(1/2 + level/2, n − 1) · s/√n with s the sample standard deviation (n − 1 in the
    denominator). None and NaN values are left out; NaN bounds for fewer than two values, NaN
    everything for none."""
    xs = [float(v) for v in values if v is not None and v == v]
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(xs) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


LOGIT_EPS = 1e-3         # proportions are clipped to [eps, 1 − eps] before the logit


def logit_t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lower, upper) for proportions: the mean of `values`, and the Student-t interval of
    `t_interval` computed on ℓᵢ = log(pᵢ/(1 − pᵢ)) (pᵢ clipped to [LOGIT_EPS, 1 − LOGIT_EPS])
    and mapped back by the logistic σ(ℓ̄ ± t(1/2 + level/2, n − 1)·s_ℓ/√n). The bounds stay in
    (0, 1) whatever the spread (a t-interval on 0.90, 0.98 and 0.99 reaches 1.08; this one
    0.999). The interval is for the logit mean, whose σ is near the mean when the spread is
    small. None and NaN are left out; NaN bounds for fewer than two values."""
    xs = [float(v) for v in values if v is not None and v == v]
    if not xs:
        return math.nan, math.nan, math.nan
    mean = sum(xs) / len(xs)
    logits = [math.log(p / (1 - p)) for p in (min(max(x, LOGIT_EPS), 1 - LOGIT_EPS) for x in xs)]
    _, lo, hi = t_interval(logits, level)
    if lo != lo:
        return mean, math.nan, math.nan
    return mean, 1 / (1 + math.exp(-lo)), 1 / (1 + math.exp(-hi))


def clopper_pearson_lower(k: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper–Pearson lower bound on a binomial proportion from k successes in
    n trials: the p with P(X ≥ k | n, p) = 1 − confidence, i.e. Beta(1 − confidence; k, n − k + 1)
    (scipy.stats.beta.ppf); 0 when k = 0. At k = n it is (1 − confidence)^(1/n): 1/1 → 0.05,
    3/3 → 0.368, 10/10 → 0.741 at 95%. n = 0 is a ValueError."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError("clopper_pearson_lower needs 0 <= k <= n and n > 0")
    if k == 0:
        return 0.0
    from scipy.stats import beta

    return float(beta.ppf(1 - confidence, k, n - k + 1))


def permutation_p(a, b) -> float:
    """Two-sided p-value of the exact permutation test of d = mean(a) − mean(b): the share of the
    C(n_a + n_b, n_a) ways to split the pooled values into groups of those sizes whose |d*| is at
    least the observed |d| (every split enumerated, the observed one among them, so p ≥ 1/C;
    ties within 1e-12 of |d| count, as scipy.stats.permutation_test counts them). 1.0 when either
    side is empty."""
    xs, ys = [float(v) for v in a], [float(v) for v in b]
    if not xs or not ys:
        return 1.0
    pooled, na, nb, total = xs + ys, len(xs), len(ys), sum(xs) + sum(ys)

    def diff(sa: float) -> float:
        return sa / na - (total - sa) / nb

    observed = abs(diff(sum(xs)))
    splits = [abs(diff(sum(pooled[i] for i in idx))) for idx in combinations(range(len(pooled)), na)]
    return sum(d >= observed - 1e-12 * max(1.0, observed) for d in splits) / len(splits)
