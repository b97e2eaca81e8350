"""verl runs' pooled bound counts each graded sample once: a verl run's split accuracy is the
training reward over the last pass over the split (ceil(split / B) steps), so evaluations more
often than that share steps, and the stop rule's n must be the distinct graded samples of the
pooled evaluations. Hand-computed numbers; no verl needed."""

import math
from statistics import NormalDist

import pytest

from runners.presets import get_preset
from bench.stats import wilson_lower
from bench.stop import pooled_steps
from runners.verl_follow import Follower

Z = NormalDist().inv_cdf(0.9)           # the stop rule's one-sided 90% bound


def test_pooled_steps_by_hand():
    # the paper's split (1,460 problems) at B=16: a pass is 92 steps; evaluations every 10 steps
    width = math.ceil(1460 / 16)
    assert width == 92
    steps = pooled_steps([92, 102, 112], width)
    assert steps == list(range(112)) and len(steps) == 92 + 2 * 10        # not 3 × 92 = 276
    assert 3 * width / len(steps) == pytest.approx(2.464, abs=1e-3)        # the overstatement of before
    assert pooled_steps([2, 5, 8], 2) == [0, 1, 3, 4, 6, 7]                # windows apart: nothing shared
    assert pooled_steps([2, 3, 4], 2) == [0, 1, 2, 3]
    assert pooled_steps([1], 3) == [0] and pooled_steps([], 3) == []


def follower(**overrides) -> Follower:
    """B=2 prompts × G=2 on a 4-problem split: a pass is 2 steps (8 graded responses); an
    evaluation every step once a pass has run; the bound pools the last 3 (hold)."""
    cfg = get_preset("tiny", prompts_per_step=2, samples_per_prompt=2, eval_every=1, max_steps=100, **overrides)
    return Follower(store=None, run_id="r", cfg=cfg, split_size=4)


def test_overlapping_windows_pool_their_distinct_samples():
    f = follower()
    rewards = [1.0, 0.5, 1.0, 0.75]
    for step, r in enumerate(rewards, 1):
        f.track(step, {"reward": r})
    # evaluations at steps 2, 3, 4: windows (1, .5), (.5, 1), (1, .75) → .75, .75, .875, 8 samples each
    assert [(s, a, n) for s, a, n in f.state.evals] == [(2, 0.75, 8), (3, 0.75, 8), (4, 0.875, 8)]
    # pooled: steps 1-4 once each, mean 3.25 / 4 = 0.8125 over 4 × 2 × 2 = 16 samples
    assert f.pooled() == (pytest.approx(0.8125), 16)
    assert f.state.bound == pytest.approx(wilson_lower(0.8125 * 16, 16, 0.9))
    # the same bound written out: (p + z²/2n − z√(p(1−p)/n + z²/4n²)) / (1 + z²/n), p = .8125, n = 16
    p, n = 0.8125, 16
    by_hand = (p + Z * Z / (2 * n) - Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))) / (1 + Z * Z / n)
    assert f.state.bound == pytest.approx(by_hand, rel=1e-12) and by_hand == pytest.approx(0.66082, abs=1e-5)


def test_a_run_at_every_reward_one_is_not_passed_on_double_counted_samples():
    """All rewards 1: the bound is 1 / (1 + z²/n). Over the 16 distinct samples 0.9069 < 0.92;
    counting the three windows' 24 (before) gave 0.9360 and a false 'converged'."""
    f = follower()
    f.cfg.stop.target = 0.92
    verdicts = [f.track(step, {"reward": 1.0}) for step in range(1, 5)]
    assert verdicts == [None] * 4
    assert f.state.bound == pytest.approx(1 / (1 + Z * Z / 16)) and f.state.bound == pytest.approx(0.90691, abs=1e-5)
    assert 1 / (1 + Z * Z / 24) == pytest.approx(0.93595, abs=1e-5)        # what 24 samples would have given
    # the next evaluation pools steps 2-5: still 16 distinct samples, never more than 2 + 2 × 1 steps
    f.track(5, {"reward": 1.0})
    assert f.pooled() == (1.0, 16)


def test_replayed_steps_rebuild_the_same_pool():
    """Resume replays the stored steps with their stored split accuracy (runners/verl_follow.py:
    replay_for_resume): the pool and the bound come out as they were."""
    live, replayed = follower(), follower()
    rewards = [0.25, 0.5, 1.0, 0.75, 0.5]
    for step, r in enumerate(rewards, 1):
        m = {"reward": r}
        live.track(step, m)
        replayed.track(step, {"reward": r}, split_acc=m.get("eval/split"), may_eval=False)
    assert replayed.state.evals == live.state.evals and replayed.pooled() == live.pooled()
    assert replayed.state.bound == live.state.bound
    assert live.pooled() == (pytest.approx((0.5 + 1.0 + 0.75 + 0.5) / 4), 16)      # steps 2-5
