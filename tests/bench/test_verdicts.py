"""Verdicts that are evidence: every status's verdict, a run's status recomputed from its stored
evaluations (bench/verdicts.py), a cell's verdict with the Clopper–Pearson bound its seeds
support, and peak intervals that stay inside [0, 1]."""

import math
from dataclasses import asdict

import pandas as pd
import pytest

from bench import statuses, verdicts
from bench.stats import clopper_pearson_lower, logit_t_interval, t_interval
from leaderboard.cells import cells_frame, pass_evidence, verdict
from runners.presets import RunConfig

PROBLEMS = 100              # a build's kept problems: a split evaluation at m = 4 grades 400 samples


def test_every_status_gives_its_verdict():
    assert {name: s.verdict for name, s in statuses.STATUSES.items()} == {
        "running": "RUNNING", "converged": "PASS", "futile": "FAIL", "collapsed": "FAIL", "plateaued": "FAIL",
        "diverged": "FAIL", "miscalibrated": "FAIL", "max_steps": "UNDECIDED", "failed": "NO VERDICT",
        "skipped": "NO VERDICT", "interrupted": "NO VERDICT", "evaluated": "NO VERDICT"}
    assert statuses.verdict(None) == statuses.verdict("nonsense") == "NO VERDICT"
    assert statuses.RESUMABLE == ("running", "failed", "interrupted")
    assert statuses.EXTENDABLE == ("max_steps", "evaluated")
    assert statuses.FAILING == ("futile", "collapsed", "plateaued", "diverged", "miscalibrated")
    assert (statuses.CONVERGED, statuses.MISCALIBRATED, statuses.SKIPPED) == ("converged", "miscalibrated", "skipped")


def _config(**stop) -> dict:
    c = asdict(RunConfig(max_steps=stop.pop("max_steps", 100), eval_every=5))
    c["stop"].update(stop)
    return c


def _ev(status, accs, *, step=None, config=None, **kw) -> verdicts.Evidence:
    """A native run with split evaluations `accs` at steps 0, 5, 10, … (m = 4 of PROBLEMS)."""
    evals = [(5 * i, a, 4) for i, a in enumerate(accs)]
    return verdicts.Evidence(status=status, step=evals[-1][0] if step is None else step,
                             config=config or _config(), evals=evals, problems=PROBLEMS, **kw)


def test_a_converged_run_is_what_its_evaluations_say():
    ev = _ev("converged", [0.5, 0.97, 0.97, 0.97])
    d = verdicts.decide(ev)
    assert (d.status, d.rule, d.step, d.verdict) == ("converged", "converged", 15, "PASS")
    assert verdicts.check(ev) is None


def test_a_status_rewritten_to_converged_is_refused_naming_the_rule_and_readings():
    """The issue's exploit: a run at its budget, peak 0.938, its status alone rewritten."""
    accs = [0.6, 0.85, 0.9, 0.923, 0.922, 0.916, 0.938]
    honest = _ev("max_steps", accs, config=_config(max_steps=30))
    assert verdicts.decide(honest).verdict == "UNDECIDED" and verdicts.check(honest) is None
    problem = verdicts.check(_ev("converged", accs, config=_config(max_steps=30)))
    assert "'converged' is not supported" in problem and "no pooled 90% lower bound over 3 evaluations" in problem
    assert "they say 'max_steps' by the budget rule at step 30" in problem
    assert "0.938@30" in problem and "0.923@15" in problem


def test_max_steps_needs_the_budget_and_its_evaluation():
    short = _ev("max_steps", [0.5, 0.6, 0.7], config=_config(max_steps=30))      # stopped at 10 of 30
    assert verdicts.decide(short).status == "failed"
    assert "without an evaluation at max_steps=30" in verdicts.check(short)


def test_futility_decides_a_flat_run_and_plateau_is_off_by_default():
    flat = [0.80] * 10
    d = verdicts.decide(_ev("futile", flat))
    assert (d.status, d.step, d.verdict) == ("futile", 45, "FAIL")
    assert verdicts.check(_ev("futile", flat)) is None
    # claimed max_steps where the futility rule (on) had decided at step 45: refused
    assert "'futile' by the futile rule at step 45" in verdicts.check(_ev("max_steps", flat, step=100))
    # futility off, plateau off (today's default): the same readings decide nothing by step 50
    off = _config(futility=False)
    assert verdicts.decide(_ev("running", [0.80] * 11, config=off)).rule is None
    d = verdicts.decide(_ev("max_steps", [0.80] * 11, config={**off, "max_steps": 50}))
    assert (d.status, d.rule, d.verdict) == ("max_steps", "budget", "UNDECIDED")


def test_a_config_from_before_the_switches_is_judged_by_the_rules_of_its_day():
    """No `futility` or `plateau` key stored: futility off, plateau on, as those runs ran."""
    c = _config()
    del c["stop"]["futility"], c["stop"]["plateau"]
    d = verdicts.decide(_ev("plateaued", [0.80] * 11, config=c))
    assert (d.status, d.step) == ("plateaued", 50)
    assert verdicts.stop_config(c).futility is False and verdicts.stop_config(_config()).futility is True


def test_the_gate_divergence_and_the_runs_without_an_end():
    gate = _ev("miscalibrated", [0.5], calibration={"ok": False, "failed": ["band", "reference"]})
    d = verdicts.decide(gate)
    assert (d.status, d.rule, d.step, d.verdict) == ("miscalibrated", "calibration", 0, "FAIL")
    assert "band, reference" in d.reason and verdicts.check(gate) is None
    assert "'miscalibrated' is not supported" in verdicts.check(_ev("miscalibrated", [0.5], calibration={"ok": True}))
    div = _ev("diverged", [0.5, 0.6], step=7, last_metrics={"nonfinite_in_a_row": 20})
    assert verdicts.decide(div).status == "diverged" and verdicts.check(div) is None
    assert verdicts.check(_ev("diverged", [0.5, 0.6], step=7, last_metrics={"nonfinite_in_a_row": 3}))
    assert verdicts.check(_ev("diverged", [0.5], step=3, last_metrics={"nonfinite_weights": 1.0})) is None
    # one skipped fp16 step (a null loss) at the end of a run at its budget is no divergence
    budget = _ev("max_steps", [0.5, 0.6, 0.7], config=_config(max_steps=10), last_metrics={"loss": None})
    assert verdicts.decide(budget).status == "max_steps" and verdicts.check(budget) is None
    for status in ("running", "failed", "skipped"):         # no end claimed: never refused
        ev = _ev(status, [0.5, 0.97, 0.97, 0.97])
        assert verdicts.check(ev) is None and verdicts.decide(ev).verdict == statuses.verdict(status)


def test_an_undecided_runs_projection():
    rising = _ev("max_steps", [0.80 + 0.01 * i for i in range(10)], config=_config(max_steps=45))
    reach, text = verdicts.projection(rising)
    # readings on a line of 0.002 a step: 0.89 at step 45, so 0.95 at 45 + 0.06 / 0.002 = 75; room for
    # `hold` = 3 evaluations every 5 steps past it: --max-steps 90
    assert reach == pytest.approx(75.0) and "near step 75" in text and "--max-steps 90" in text
    reach, text = verdicts.projection(_ev("max_steps", [0.9, 0.9, 0.88, 0.87], config=_config(max_steps=15)))
    assert reach is None and "would not reach 0.95" in text


@pytest.mark.parametrize("k, n, lower", [(1, 1, 0.05), (3, 3, 0.3684), (10, 10, 0.7411), (9, 10, 0.6058),
                                         (0, 5, 0.0), (4, 10, 0.1500)])
def test_clopper_pearson_lower_bound(k, n, lower):
    assert clopper_pearson_lower(k, n) == pytest.approx(lower, abs=1e-4)
    if k == n:
        assert clopper_pearson_lower(k, n) == pytest.approx(0.05 ** (1 / n), rel=1e-12)   # the closed form


def test_clopper_pearson_refuses_no_trials():
    with pytest.raises(ValueError):
        clopper_pearson_lower(0, 0)


def test_cell_verdict_from_its_seeds():
    assert verdict(["PASS", "PASS"]) == "PASS"
    assert verdict(["PASS", "FAIL", "RUNNING"]) == "FAIL"             # a rule's FAIL decides
    assert verdict(["PASS", "UNDECIDED"]) == "UNDECIDED"
    assert verdict(["PASS", "NO VERDICT"]) == "UNDECIDED"            # an error decides nothing
    assert verdict(["PASS", "RUNNING"]) == "RUNNING" and verdict([]) == "UNDECIDED"
    assert pass_evidence(1, 1) == "1/1 pass: p ≥ 0.05" and pass_evidence(3, 3) == "3/3 pass: p ≥ 0.37"
    assert pass_evidence(9, 10) == "9/10 pass: p ≥ 0.61" and pass_evidence(10, 10) == "10/10 pass: p ≥ 0.74"


def test_a_cells_figures_over_seeds():
    runs = pd.DataFrame({
        "run": [f"r{i}" for i in range(3)], "model": "m", "build": "b", "algo": "grpo", "precision": "fp16",
        "trainer": "native", "engine": "torch", "staleness": 0, "config_fp": "fp", "seed": [0, 1, 2],
        "status": ["converged", "converged", "max_steps"], "sanity": ["PASS", "PASS", "UNDECIDED"],
        "decided_by": ["converged", "converged", "budget"], "decided_step": [60, 75, 80],
        "peak_accuracy": [0.90, 0.98, 0.99], "steps_to_target": [60, 75, None], "steps": [60, 75, 80]})
    c = cells_frame(runs).iloc[0]
    assert (c.sanity, c.passes, c.evidence) == ("UNDECIDED", "2/3", "2/3 pass: p ≥ 0.14")
    assert c.pass_lower == pytest.approx(clopper_pearson_lower(2, 3))
    assert 0 < c.peak_ci_lo < c.peak_mean < c.peak_ci_hi < 1 and c.peak_t_hi > 1       # the old one leaves [0, 1]
    assert c.early == "seed 0: PASS by converged at step 60; seed 1: PASS by converged at step 75"


def test_logit_interval_stays_in_the_unit_interval():
    mean, lo, hi = logit_t_interval([0.90, 0.98, 0.99])
    # by hand: logits ln 9, ln 49, ln 99 = 2.197225, 3.891820, 4.595120; mean 3.561388, sd 1.232625;
    # t(0.975, 2) = 4.302653
    half = 4.302653 * 1.232625 / math.sqrt(3)
    assert mean == pytest.approx(0.956667, abs=1e-6)
    assert lo == pytest.approx(1 / (1 + math.exp(-(3.561388 - half))), abs=1e-5)
    assert hi == pytest.approx(1 / (1 + math.exp(-(3.561388 + half))), abs=1e-5)
    assert t_interval([0.90, 0.98, 0.99])[2] > 1 and 0 < lo < hi < 1
    for peaks in ([1.0, 1.0, 0.99], [0.0, 0.01], [0.5, 0.51, 0.49, 0.5]):
        _, lo, hi = logit_t_interval(peaks)
        assert 0 < lo <= hi < 1
    assert all(math.isnan(x) for x in logit_t_interval([0.9])[1:])
