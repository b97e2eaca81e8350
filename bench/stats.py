"""The confidence bounds every stage shares, one definition each.

- `wilson_lower`: the one-sided Wilson score lower bound on a binomial proportion, on which the
  stop rule's `converged` rests (runners/stop.py: the successes pooled over the last evaluations).
- `wilson_interval`: the two-sided Wilson score interval with which an adaptive build decides a
  problem (datasets_build/adaptive.py).
- `t_quantile` / `t_interval`: Student's t (scipy.stats.t) and the two-sided interval for a mean
  over seeds that a leaderboard cell shows for its peak accuracy (leaderboard/cells.py).

z is the standard normal quantile (statistics.NormalDist); the formulas are in the docstrings.
"""

from __future__ import annotations

import math
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
