"""The shared confidence bounds (bench/stats.py) against hand-computed values: the one-sided
Wilson lower bound (the stop rule), the two-sided Wilson interval (adaptive builds), Student's t
quantile against the statistical tables, the seed interval of a cell and the exact permutation
test."""

import math

import pytest

from bench.stats import permutation_p, t_interval, t_quantile, wilson_interval, wilson_lower


def test_wilson_lower_bound_by_hand():
    # 470/480 at 90% one-sided: z = Φ⁻¹(0.9) = 1.2815516, z² = 1.6423744, p̂ = 0.9791667
    #   z²/n = 0.0034216, z²/2n = 0.0017108
    #   p̂(1−p̂)/n = 0.9791667·0.0208333/480 = 4.24986e-5, z²/4n² = 1.7821e-6, sum 4.42807e-5,
    #   √ = 0.0066544, ×z = 0.0085279
    #   (0.9791667 + 0.0017108 − 0.0085279) / (1 + 0.0034216) = 0.9723496 / 1.0034216 = 0.969034
    assert wilson_lower(470, 480, 0.9) == pytest.approx(0.969034, abs=2e-6)
    # all correct: p̂ = 1 leaves n / (n + z²) = 480 / 481.6423744 = 0.996590
    assert wilson_lower(480, 480, 0.9) == pytest.approx(0.996590, abs=2e-6)
    # 50/100 at 95% one-sided: z = 1.6448536, z² = 2.7055434, z²/n = 0.0270554, z²/2n = 0.0135277
    #   √(0.25/100 + z²/4n²) = √(0.0025 + 0.0000676) = 0.0506719, ×z = 0.0833478
    #   (0.5 + 0.0135277 − 0.0833478) / 1.0270554 = 0.4301799 / 1.0270554 = 0.418848
    assert wilson_lower(50, 100, 0.95) == pytest.approx(0.418848, abs=2e-6)
    assert wilson_lower(0, 0, 0.9) == 0.0
    assert wilson_lower(0, 480, 0.9) == 0.0
    # one sample, correct: n / (n + z²) = 1 / 2.6423744 = 0.378447
    assert wilson_lower(1, 1, 0.9) == pytest.approx(0.378447, abs=2e-6)
    # p̂ is clamped to [0, 1]
    assert wilson_lower(500, 480, 0.9) == wilson_lower(480, 480, 0.9)
    assert wilson_lower(-5, 480, 0.9) == 0.0


def test_wilson_by_hand():
    lo, hi = wilson_interval(0, 16, 0.9)                      # z = 1.6449: upper = z²/(n + z²)
    z2 = 1.6448536269514722 ** 2
    assert lo == 0 and hi == pytest.approx(z2 / (16 + z2))
    lo, hi = wilson_interval(5, 10, 0.95)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 0, 0.9) == (0.0, 1.0)


T_0975 = {1: 12.706204736174707, 2: 4.302652729911275, 4: 2.7764451051977987, 9: 2.2621571627409915,
          29: 2.045229642132703}       # Student t, 0.975 quantile (statistical tables)


def test_t_quantile_matches_the_tables():
    for df, t in T_0975.items():
        assert t_quantile(0.975, df) == pytest.approx(t, rel=1e-9)
    assert t_quantile(0.025, 4) == pytest.approx(-T_0975[4], rel=1e-9)


def test_t_interval_by_hand():
    mean, lo, hi = t_interval([0.96, 0.98, 0.90])
    # mean 0.94666…; deviations 0.01333…, 0.03333…, −0.04666…; s² = (0.000177… + 0.001111… + 0.002177…)/2
    s = math.sqrt((0.04 / 3) ** 2 / 2 + (0.1 / 3) ** 2 / 2 + (0.14 / 3) ** 2 / 2)
    half = 4.302652729911275 * s / math.sqrt(3)
    assert mean == pytest.approx(2.84 / 3)
    assert s == pytest.approx(0.0416333199893, rel=1e-9)
    assert (lo, hi) == (pytest.approx(2.84 / 3 - half), pytest.approx(2.84 / 3 + half))
    assert lo == pytest.approx(0.843243, abs=1e-6) and hi == pytest.approx(1.050090, abs=1e-6)
    m1, lo1, hi1 = t_interval([0.7])
    assert m1 == 0.7 and math.isnan(lo1) and math.isnan(hi1)
    assert all(math.isnan(x) for x in t_interval([None, float("nan")]))
    # 90%: t(0.95, 2) = 2.919985580 (tables) in place of 4.302652730
    _, lo90, _ = t_interval([0.96, 0.98, 0.90], 0.90)
    assert lo90 == pytest.approx(2.84 / 3 - 2.919985580355 * s / math.sqrt(3), rel=1e-9)


def test_t_quantile_refuses_what_has_no_quantile():
    for p, df in ((0.0, 3), (1.0, 3), (0.5, 0), (-0.1, 2)):
        with pytest.raises(ValueError, match="t_quantile"):
            t_quantile(p, df)


def test_permutation_p_by_hand():
    # [1, 2, 3] vs [4, 5, 6]: |d| = 3 in 2 of the C(6, 3) = 20 splits (the observed one and its mirror)
    assert permutation_p([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)
    # [1, 2] vs [3]: splits {1,2}|{3} d = −1.5, {1,3}|{2} d = 0, {2,3}|{1} d = 1.5 → 2 of 3
    assert permutation_p([1, 2], [3]) == pytest.approx(2 / 3)
    # 5 vs 5 seeds, disjoint: only the observed split and its mirror reach |d| → 2/252, below 0.05
    assert permutation_p([50, 52, 54, 56, 58], [60, 62, 64, 66, 68]) == pytest.approx(2 / 252)
    # scipy.stats.permutation_test's exact answer for these (0.0397: 10 of 252)
    assert permutation_p([55, 60, 50, 65, 55], [70, 75, 60, 80, 65]) == pytest.approx(10 / 252)
    assert permutation_p([0.9, 0.95], [0.9, 0.95]) == 1.0 and permutation_p([3.0], [3.0]) == 1.0
    assert permutation_p([], [1.0, 2.0]) == 1.0
