"""leaderboard/summary.py's value helpers by hand: missing values, the ratio's guards, the runs
a summary lists."""

import math

import pandas as pd
import pytest

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
                          "steps_to_target": 35, "sanity": "UNDECIDED", "kl_warning_step": 12,
                          "decided_by": "budget", "decided_step": 40, "projection": "its line would not reach 0.95"}])
    out = _ended(runs, ["b", "missing", "a"])
    assert [r["run"] for r in out] == ["b", "a"]                    # an unknown id is skipped, not the rest
    assert out[0] == {"run": "b", "seed": 1, "status": "max_steps", "verdict": "UNDECIDED", "decided_by": "budget",
                      "decided_step": 40, "stop_reason": None, "steps": 40, "steps_to_pass": None,
                      "kl_warning_step": 12, "projection": "its line would not reach 0.95", "evidence_problem": None}
    assert out[1]["steps_to_pass"] == 20 and out[1]["kl_warning_step"] is None


def _cells(**extra):
    rows = [{"model": "m", "build": "b", "trainer": "native", "algo": a, "precision": p, "kl_k3_median": v,
             "sanity": "FAIL", "passes": 0, "status": "max_steps", "steps_to_pass_median": None, "runs": [], **extra}
            for a, p, v in (("grpo", "bf16", 6e-4), ("grpo", "fp16", 2e-4), ("gspo", "bf16", 1e-3))]
    return pd.DataFrame(rows)


def test_mismatch_ratios_with_and_without_a_staleness_column():
    from leaderboard.summary import mismatch_ratios

    (r,) = mismatch_ratios(_cells())                                   # gspo has no fp16 cell: no ratio
    assert (r["algo"], r["staleness"]) == ("grpo", 0) and r["ratio"] == pytest.approx(3.0)
    (r,) = mismatch_ratios(_cells(staleness=2))
    assert r["staleness"] == 2


def test_report_summary_reads_a_missing_staleness_as_0():
    from leaderboard.summary import report_summary

    runs = pd.DataFrame(columns=["run"])
    assert [c["staleness"] for c in report_summary(_cells(), runs)["per_cell"]] == [0, 0, 0]
    assert [c["staleness"] for c in report_summary(_cells(staleness=2), runs)["per_cell"]] == [2, 2, 2]


# the conditions a report records (leaderboard.summary.CONDITIONS besides model and source)
COND = {"engine": "torch", "limit": 8, "n": 4, "max_tokens": 64, "device": "cpu", "cpu_16bit": "none"}


def test_offline_ratios_need_both_formats_and_kl_k3():
    from leaderboard.summary import offline_ratios

    rows = [{"model": "m", "source": "s", "rollout_dtype": d, "train_dtype": d, "kl_k3": v, "created_at": t, **COND}
            for d, v, t in (("bf16", 4e-4, 1), ("fp16", 1e-4, 2), ("bf16", 8e-4, 3))]
    (r,) = offline_ratios(pd.DataFrame(rows))
    assert r["ratio"] == pytest.approx(8.0)                                        # the newest bf16 report
    assert offline_ratios(pd.DataFrame(rows[:1])) == []                # bf16 alone: no ratio
    assert offline_ratios(pd.DataFrame([{**r, "source": "t"} for r in rows[1:2]] + rows[:1])) == []
    assert offline_ratios(None) == [] and offline_ratios(pd.DataFrame()) == []
    assert offline_ratios(pd.DataFrame(rows).drop(columns="kl_k3")) == []


def test_ratios_come_sorted_by_their_keys():
    from leaderboard.summary import mismatch_ratios, offline_ratios

    cells = pd.concat([_cells().assign(algo="zz"), _cells()])          # "zz" rows first
    assert [r["algo"] for r in mismatch_ratios(cells)] == ["grpo", "zz"]
    rows = [{"model": "m", "source": s, "rollout_dtype": d, "train_dtype": d, "kl_k3": 1e-4, **COND}
            for s in ("z", "a") for d in ("bf16", "fp16")]
    assert [r["source"] for r in offline_ratios(pd.DataFrame(rows))] == ["a", "z"]
