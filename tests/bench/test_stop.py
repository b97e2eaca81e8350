"""The stop rules decide on bounds, not on single noisy readings: the convergence bound itself
(computed by hand), simulated runs at a true accuracy just below and just above the target on
the tiny preset's budget, the noise-robust peak, and the state a checkpoint carries."""

import json
from dataclasses import replace

import numpy as np
import pytest

from runners.presets import tiny
from bench.stop import (COLLAPSED, CONVERGED, PLATEAUED, StopConfig, StopState, after_eval, after_step,
                          kl_rising)

N = 120 * 4            # problems × avg@4 samples: the graded samples behind one tiny-preset reading


def simulate(p: float, cfg: StopConfig, runs: int = 1000, seed: int = 0) -> tuple[float, list[int]]:
    """`runs` runs at constant true accuracy p, read as Binomial(N, p)/N at every evaluation of
    the tiny preset's budget (every 5 steps up to 150: 30 evaluations); each run ends at its
    first verdict. Returns the converged fraction and the evaluation count at convergence."""
    preset = tiny()
    steps = range(preset.eval_every, preset.max_steps + 1, preset.eval_every)
    assert len(steps) == 30
    rng = np.random.default_rng(seed)
    readings = rng.binomial(N, p, size=(runs, len(steps))) / N
    when = []
    for r in range(runs):
        state = StopState()
        for i, step in enumerate(steps):
            verdict = after_eval(state, cfg, step, float(readings[r, i]), N)
            if verdict:
                if verdict[0] == CONVERGED:
                    when.append(i + 1)
                break
    return len(when) / runs, when


def test_a_run_truly_below_target_is_almost_never_converged():
    cfg = tiny().stop
    rate, _ = simulate(0.93, cfg)
    assert rate <= 0.01, rate
    # the worst case: no plateau ends the run, so every one of the 30 evaluations may pass on noise
    rate_all, _ = simulate(0.93, replace(cfg, patience=10 ** 9), seed=1)
    assert rate_all <= 0.01, rate_all


def test_a_run_truly_above_target_converges_within_the_budget():
    rate, when = simulate(0.97, tiny().stop)
    assert rate >= 0.95, rate
    assert np.median(when) <= tiny().stop.hold + 1, np.median(when)


def test_noisy_readings_around_the_target_are_not_converged():
    cfg = StopConfig()
    state = StopState()
    verdicts = [after_eval(state, cfg, s, a, N) for s, a in ((10, 0.954), (20, 0.943), (30, 0.955))]
    assert verdicts == [None, None, None]               # pooled 0.950667 over 1,440: bound 0.942826
    assert state.bound == pytest.approx(0.942826, abs=2e-6)
    assert state.first_at_target == 10 and state.best == 0.955   # for display only


def test_converges_on_a_pooled_bound_and_needs_hold_evaluations():
    cfg = StopConfig()
    state = StopState()
    assert after_eval(state, cfg, 10, 1.0, N) is None
    assert after_eval(state, cfg, 20, 1.0, N) is None   # 2 < hold evaluations
    status, reason = after_eval(state, cfg, 30, 1.0, N)
    assert status == CONVERGED and "lower bound 0.999" in reason
    # a small sample is not enough, however good: 3 × 8 graded samples, all correct, bound
    # 24 / (24 + z²) = 24 / 25.6423744 = 0.935951 < 0.95
    state = StopState()
    assert [after_eval(state, cfg, s, 1.0, 8) for s in (10, 20, 30)] == [None, None, None]
    assert state.bound == pytest.approx(0.935951, abs=2e-6)
    # readings of different sizes pool by their samples: (0.9·128 + 128 + 128) / 384 = 0.966667,
    # bound 0.952797 (the verl follower's test run: rewards 0.9, 1.0, 1.0 over 16 prompts × 8)
    state = StopState()
    assert after_eval(state, cfg, 20, 0.9, 128) is None and after_eval(state, cfg, 25, 1.0, 128) is None
    assert after_eval(state, cfg, 30, 1.0, 128)[0] == CONVERGED
    assert state.bound == pytest.approx(0.952797, abs=2e-6)


def test_peak_moves_only_by_min_delta():
    cfg = StopConfig(patience=4, min_delta=0.01, plateau=True)
    state = StopState()
    after_eval(state, cfg, 0, 0.50, N)
    # creeping noise below min_delta: the raw best rises, the peak and the patience do not reset
    verdicts = [after_eval(state, cfg, s, a, N) for s, a in ((10, 0.505), (20, 0.509), (30, 0.507))]
    assert verdicts == [None, None, None]
    assert (state.peak, state.peak_step, state.evals_since_peak) == (0.50, 0, 3)
    assert (state.best, state.best_step) == (0.509, 20)
    status, reason = after_eval(state, cfg, 40, 0.508, N)
    assert status == PLATEAUED and "peak 0.500 at step 0" in reason
    # a gain of min_delta moves the peak and resets the patience
    state = StopState()
    after_eval(state, cfg, 0, 0.50, N)
    after_eval(state, cfg, 10, 0.505, N)
    assert after_eval(state, cfg, 20, 0.51, N) is None
    assert (state.peak, state.peak_step, state.evals_since_peak) == (0.51, 20, 0)


def test_collapse_is_measured_from_the_robust_peak():
    cfg = StopConfig(collapse_drop=0.3, min_delta=0.01)
    state = StopState()
    after_eval(state, cfg, 0, 0.60, N)
    after_eval(state, cfg, 10, 0.609, N)                # noise: the peak stays 0.60
    assert after_eval(state, cfg, 20, 0.305, N) is None  # 0.304 below the best reading, 0.295 below the peak
    status, reason = after_eval(state, cfg, 30, 0.30, N)
    assert status == COLLAPSED and "fell 0.300 below its peak 0.600 (step 0)" in reason


def test_state_round_trips_through_json_and_old_checkpoints_load():
    cfg = StopConfig()
    state = StopState()
    for s, a in ((0, 0.5), (10, 0.7), (20, 0.96)):
        after_eval(state, cfg, s, a, N)
    back = StopState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state and back.evals[-1] == (20, 0.96, N)
    # a checkpoint written before n was recorded: 2-tuples, no `best`, an unknown key
    old = {"evals": [[0, 0.5], [10, 0.96], [20, 0.97]], "peak": 0.97, "peak_step": 20, "evals_since_peak": 0,
           "first_at_target": 10, "kl": [0.1], "kl_warning_step": None, "retired_field": 1}
    s = StopState.from_dict(old)
    assert s.evals == [(0, 0.5, 0), (10, 0.96, 0), (20, 0.97, 0)] and (s.best, s.best_step) == (0.97, 20)
    # readings of unknown size cannot carry a convergence; three new ones can
    assert after_eval(s, cfg, 30, 1.0, N) is None and after_eval(s, cfg, 40, 1.0, N) is None
    assert after_eval(s, cfg, 50, 1.0, N)[0] == CONVERGED


# ------------------------------------------------------------------ the KL early warning

def test_kl_rising_needs_both_a_significant_slope_and_a_doubling():
    # [1, 2, 3, 5]: x̄ = 1.5, ȳ = 2.75, Sxx = 5, Sxy = 6.5, slope 1.3; residuals 0.2, −0.1, −0.4, 0.3,
    #   Σr² = 0.3, se = √(0.3 / 2 / 5) = 0.17321, t = 7.51; halves 1.5 → 4 (≥ 2×): fires
    assert kl_rising([1, 2, 3, 5], 4)
    # [1, 1, 1, 10]: halves 1 → 5.5, but slope 2.7 with residuals 1.8, −0.9, −3.6, 2.7:
    #   Σr² = 24.3, se = √(24.3 / 2 / 5) = 1.5588, t = 1.73 < 3: a jump, not a steady rise
    assert not kl_rising([1, 1, 1, 10], 4)
    # [1, 2, 2, 4]: ȳ = 2.25, Sxy = 4.5, slope 0.9; residuals 0.1, 0.2, −0.7, 0.4, Σr² = 0.7,
    #   se = √(0.7 / 2 / 5) = 0.264575, t = 3.40 (just above 3; with n − 3 in se's denominator 2.41);
    #   halves 1.5 → 3, exactly twice: fires
    assert kl_rising([1, 2, 2, 4], 4)
    # perfect lines (se = 0): [3, 5, 7, 9] doubles exactly (4 → 8), [1, 2, 3, 4] more (1.5 → 3.5)
    assert kl_rising([3, 5, 7, 9], 4) and kl_rising([1, 2, 3, 4], 4)
    # a line whose second half is not twice the first: 1.045 → 1.145, 14.5 → 24.5 (t huge)
    assert not kl_rising([1 + 0.01 * i for i in range(20)], 20)
    assert not kl_rising([10 + i for i in range(20)], 20)
    # an odd window: the first half is the shorter one; [2, 3, 4, 5, 6]: 2.5 → 5, exactly twice;
    #   0.1 higher everywhere: 2.6 → 5.1, not twice
    assert kl_rising([2, 3, 4, 5, 6], 5) and not kl_rising([2.1, 3.1, 4.1, 5.1, 6.1], 5)
    # KL is small: the doubling test is relative (10⁻³ scale, halves 1.5e-3 → 4e-3)
    assert kl_rising([1e-3, 2e-3, 3e-3, 5e-3], 4)
    # falling, flat, a short series, a too-small window
    assert not kl_rising([5, 3, 2, 1], 4) and not kl_rising([2.0] * 20, 20)
    assert not kl_rising([1, 2, 3], 4) and not kl_rising([1, 2, 4], 3)
    # only the last `window` values count: a rise long ago followed by a flat stretch
    assert not kl_rising([1, 2, 3, 5, 5, 5, 5, 5], 4) and kl_rising([9, 9, 9, 1, 2, 3, 5], 4)


def _warning_step(series, window):
    cfg, state = StopConfig(kl_window=window), StopState()
    fired = [step for step, kl in enumerate(series, 1) if after_step(state, cfg, step, kl)]
    assert fired == ([] if state.kl_warning_step is None else [state.kl_warning_step])   # fires once
    return state.kl_warning_step


def test_kl_warning_stays_quiet_on_noise_and_on_a_slow_rise():
    rng = np.random.default_rng(0)
    noisy = list(1e-3 * (1 + 0.3 * rng.standard_normal(200)))     # flat KL with ±30 % noise
    assert _warning_step(noisy, 20) is None
    slow = [1e-3 * (1 + 0.02 * t) for t in range(200)]             # +2 % of the start per step
    assert _warning_step(slow, 20) is None                          # window halves never double


def test_kl_warning_fires_at_the_hand_checked_step_of_a_rise():
    # KL flat at 1 up to step 10, then 1 + (t − 10): window 6, halves of 3 steps
    series = [1.0] * 10 + [1.0 + k for k in range(1, 11)]
    # step 11 [1 1 1 1 1 2]: halves 1 → 1.33, not doubled
    # step 12 [1 1 1 1 2 3]: halves 1 → 2; ȳ = 1.5, Sxx = 17.5, Sxy = 6.5, slope 0.371429, residuals
    #   0.428571, 0.057143, −0.314286, −0.685714, −0.057143, 0.571429, Σr² = 1.085714,
    #   se = √(1.085714 / 4 / 17.5) = 0.124540, t = 2.982 < 3: not yet
    # step 13 [1 1 1 2 3 4]: halves 1 → 3; Sxy = 11, slope 0.628571, the same Σr² (mirror image),
    #   t = 5.047: fires
    assert _warning_step(series, 6) == 13
    assert not kl_rising(series[:12], 6) and kl_rising(series[:13], 6)


def test_defaults_are_the_documented_ones():
    """StopConfig's defaults (the module docstring) and a fresh StopState: nothing read yet."""
    assert StopConfig() == StopConfig(target=0.95, hold=3, confidence=0.9, patience=10, min_delta=0.01,
                                      collapse_drop=0.3, kl_window=20)
    # futility on (0 false FAIL in 35 real runs), plateaued off (1 false FAIL in 17 sound ones)
    assert (StopConfig().futility, StopConfig().plateau, StopConfig().collapse) == (True, False, True)
    assert StopState() == StopState(evals=[], peak=-1.0, peak_step=0, evals_since_peak=0, best=-1.0, best_step=0,
                                    bound=None, first_at_target=None, kl=[], kl_warning_step=None)


def test_edge_readings_zero_ties_the_target_and_single_samples():
    cfg = StopConfig(patience=4, min_delta=0.01)
    state = StopState()
    after_eval(state, cfg, 10, 0.0, N)                 # a first reading of 0 is the peak
    assert (state.peak, state.peak_step, state.evals_since_peak) == (0.0, 10, 0)
    after_eval(state, cfg, 20, 0.005, N)               # below min_delta above a peak of 0: no move
    assert (state.peak, state.peak_step, state.evals_since_peak) == (0.0, 10, 1)
    after_eval(state, cfg, 30, 0.6, N)
    after_eval(state, cfg, 40, 0.6, N)                 # a tie keeps the first best step
    assert (state.best, state.best_step) == (0.6, 30)
    assert state.first_at_target is None
    after_eval(state, cfg, 50, 0.95, N)                # exactly the target counts as at target
    assert state.first_at_target == 50
    # readings of one graded sample each still pool: 3 correct of 3, bound 3 / (3 + z²) = 0.646
    state = StopState()
    for s in (10, 20, 30):
        after_eval(state, cfg, s, 1.0, 1)
    assert state.bound == pytest.approx(3 / (3 + 1.2815516 ** 2), abs=1e-6)


def test_old_checkpoints_keep_their_best_and_find_it_by_accuracy():
    evals = [[0, 0.5, 8], [10, 0.97, 8], [20, 0.96, 8]]
    s = StopState.from_dict({"evals": evals})
    assert (s.best, s.best_step) == (0.97, 10)                         # the best reading, not the last
    s = StopState.from_dict({"evals": evals, "best": 0.5, "best_step": 0})
    assert (s.best, s.best_step) == (0.5, 0)                           # a stored best is kept as it was
    assert StopState.from_dict({}) == StopState()


# ------------------------------------------------------------------ futility and shadow decisions

def test_futility_projection_by_hand():
    # (0, 0.5), (10, 0.6), (20, 0.7), n = 100 each, to step 40 at 90%: x̄ = 10, ȳ = 0.6,
    #   Sxx = 100·(100 + 0 + 100) = 20,000, b = 100·(1 + 0 + 1)/20,000 = 0.01, residuals 0 (φ = 1),
    #   P = 0.6 + 0.01·30 = 0.9, se = √(0.24·(1/300 + 900/20,000)) = √0.0116 = 0.1077033,
    #   P + z·se = 0.9 + 1.2815516·0.1077033 = 1.038028
    from bench.stop import futility_projection

    p, hi, b = futility_projection([(0, 0.5, 100), (10, 0.6, 100), (20, 0.7, 100)], 40, 0.9)
    assert (p, hi, b) == pytest.approx((0.9, 1.038028, 0.01), abs=2e-6)
    # a fall is projected flat: b = −0.01 reported, P = ȳ = 0.6, the same se
    p, hi, b = futility_projection([(0, 0.7, 100), (10, 0.6, 100), (20, 0.5, 100)], 40, 0.9)
    assert (p, hi, b) == pytest.approx((0.6, 0.738028, -0.01), abs=2e-6)
    # readings that wobble more than sampling explains widen the bound: 0.5, 0.7, 0.6 give
    #   b = 0.005, residuals −0.05, 0.1, −0.05, Σnr² = 1.5, φ = 1.5/(1·0.24) = 6.25,
    #   P = 0.75, se = √(6.25·0.0116) = 0.269258, P + z·se = 1.095067
    p, hi, b = futility_projection([(0, 0.5, 100), (10, 0.7, 100), (20, 0.6, 100)], 40, 0.9)
    assert (p, hi, b) == pytest.approx((0.75, 1.095067, 0.005), abs=2e-6)
    # unequal n weight the fit: the line through (0, 0.5)×300 and (10, 0.6)×100, (20, 0.7)×100
    #   has x̄ = 6, ȳ = 0.56, Sxx = 300·36 + 100·16 + 100·196 = 32,000, b = (300·6·0.06 + 100·4·0.04
    #   + 100·14·0.14)/32,000 = 0.01
    assert futility_projection([(0, 0.5, 300), (10, 0.6, 100), (20, 0.7, 100)], 40, 0.9)[2] == pytest.approx(0.01)
    # too few readings (n = 0 ones do not count), or all at one step: no projection
    assert futility_projection([(0, 0.5, 100), (10, 0.6, 0), (20, 0.7, 100)], 40, 0.9) is None
    assert futility_projection([(5, 0.5, 100)] * 3, 40, 0.9) is None


def test_futility_needs_its_window_and_a_horizon_and_says_why():
    from bench.stop import FUTILE

    cfg = StopConfig(futility=True, futility_window=4)
    flat = [(s, 0.80, 708) for s in (0, 5, 10, 15)]
    state = StopState()
    assert [after_eval(state, cfg, s, a, n, max_steps=30) for s, a, n in flat[:3]] == [None] * 3   # 3 < window
    status, reason = after_eval(state, cfg, 15, 0.80, 708, max_steps=30)
    assert status == FUTILE and "max_steps=30" in reason and "steps 0–15" in reason and "2832 graded" in reason
    assert "projected flat" not in reason                        # a flat trend is projected as it is
    state = StopState()                                          # a falling one: "projected flat", in words
    falling = [(s, a, 708) for s, a in ((0, 0.83), (5, 0.82), (10, 0.81), (15, 0.80))]
    *_, (status, reason) = [after_eval(state, cfg, s, a, n, max_steps=30) for s, a, n in falling]
    assert status == FUTILE and "trend -0.200 per 100 steps, projected flat" in reason
    state = StopState()                                          # no horizon (verl): never futile
    assert [after_eval(state, cfg, s, a, n) for s, a, n in flat] == [None] * 4 and FUTILE not in state.shadow
    # the same readings with a long way to go: P + z·se at step 1,000 is far above 0.95
    state = StopState()
    assert [after_eval(state, cfg, s, a, n, max_steps=1000) for s, a, n in flat] == [None] * 4


def test_a_rule_that_is_off_is_recorded_but_does_not_stop_the_run():
    from bench.stop import FUTILE, first_decisions

    history = [(s, 0.80, 708) for s in range(0, 80, 5)]         # flat at 0.80: futile, then plateaued
    off = StopConfig(futility=False, plateau=False, futility_window=4, patience=5)
    state = StopState()
    assert [after_eval(state, off, s, a, n, max_steps=100) for s, a, n in history] == [None] * len(history)
    # futile at step 40: window steps s−15..s, x̄ = s − 7.5, Sxx = 708·125 = 88,500, p̄q̄ = 0.16,
    #   0.80 + 1.644854·√(0.16·(1/2,832 + (107.5 − s)²/88,500)) < 0.95 ⇔ 107.5 − s < 67.6 ⇔ s > 39.9;
    #   plateaued at step 25: five evaluations after the peak at step 0
    assert state.shadow[FUTILE][:2] == [40, FUTILE] and state.shadow[PLATEAUED][:2] == [25, PLATEAUED]
    assert CONVERGED not in state.shadow and COLLAPSED not in state.shadow
    # on, a rule stops the run at the step its shadow names; with both on, the sooner one
    for cfg, index, status in ((replace(off, futility=True), 8, FUTILE), (replace(off, plateau=True), 5, PLATEAUED),
                               (replace(off, futility=True, plateau=True), 5, PLATEAUED)):
        state = StopState()
        verdicts = [after_eval(state, cfg, s, a, n, max_steps=100) for s, a, n in history]
        assert verdicts[index][0] == status and all(v is None for v in verdicts[:index]), (cfg, verdicts)
    on = replace(off, futility=True, plateau=True)
    # recomputed from the history, the shadow decisions are the recorded ones, rule on or off
    assert first_decisions(history, off, 100) == first_decisions(history, on, 100)
    recorded = StopState()
    for s, a, n in history:
        after_eval(recorded, off, s, a, n, max_steps=100)
    assert first_decisions(history, off, 100) == recorded.shadow


def test_futility_error_rates_on_simulated_runs():
    """runners/stop_sim.py at a fixed seed, 400 runs per shape at the real n (708): no rising
    run called futile (<= 1%), every clear plateau called futile by max_steps (>= 95%), and the
    NVFP4-like plateau decided before the plateaued rule decides it."""
    from runners.stop_sim import SHAPES, error_rates, simulate

    cfg = replace(StopConfig(), futility=True)
    results = [simulate(s, cfg, 400, seed=i) for i, s in enumerate(SHAPES)]
    rates = error_rates(results)
    assert rates["false_fail"] <= 0.01, rates
    assert rates["false_continue"] <= 0.05, rates
    nvfp4 = next(r for r in results if "0.89" in r["shape"])
    assert nvfp4["futile_step_median"] <= 0.85 * nvfp4["plateaued_step_median"], nvfp4
    assert all(r["converged"] >= 0.8 for r in results if r["passes"]), results
