"""leaderboard/summary.py's value helpers by hand: missing values, the ratio's guards, the runs
a summary lists."""

import math

import pandas as pd

from leaderboard.summary import _ended, _int, _num, _ratio


def test_num_reads_finite_floats_only():
    assert _num("2.5") == 2.5 and _num(3) == 3.0
    assert _num(None) is None and _num("x") is None and _num(pd.NA) is None
    assert _num(float("nan")) is None and _num(math.inf) is None
    assert _int("7.0") == 7 and _int(None) is None


def test_ratio_needs_both_values_a_positive_denominator_and_a_non_negative_numerator():
    assert _ratio(3.0, 2.0) == 1.5 and _ratio(0.0, 2.0) == 0.0
    assert _ratio(None, 2.0) is None and _ratio(3.0, None) is None and _ratio(None, None) is None
    assert _ratio(3.0, 0.0) is None and _ratio(3.0, -1.0) is None and _ratio(-1.0, 2.0) is None


def test_ended_lists_the_known_runs_in_the_order_asked():
    runs = pd.DataFrame([{"run": "a", "seed": 0, "status": "converged", "stop_reason": "bound", "steps": 30,
                          "steps_to_target": 20, "sanity": "PASS", "kl_warning_step": None},
                         {"run": "b", "seed": 1, "status": "max_steps", "stop_reason": "", "steps": 40,
                          "steps_to_target": 35, "sanity": "FAIL", "kl_warning_step": 12}])
    out = _ended(runs, ["b", "missing", "a"])
    assert [r["run"] for r in out] == ["b", "a"]                    # an unknown id is skipped, not the rest
    assert out[0] == {"run": "b", "seed": 1, "status": "max_steps", "stop_reason": None, "steps": 40,
                      "steps_to_pass": None, "kl_warning_step": 12}
    assert out[1]["steps_to_pass"] == 20 and out[1]["kl_warning_step"] is None
