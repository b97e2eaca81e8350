"""benchmarks/suite_order.py replays xdist's hand-out of units (one each, another to a worker with
≤ 2 tests pending) on a record, checked against a schedule worked by hand; and the record kept in
tests/ is one it can read, of units the suite has."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("suite_order", ROOT / "benchmarks" / "suite_order.py")
suite_order = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite_order)

# A: one test of 10 s; B to E: four tests of 1 s each (26 s in all, 13 s a worker at best)
RECORD = {"recorded": "by hand", "groups": {"A": 10.0, "B": 4.0, "C": 4.0, "D": 4.0, "E": 4.0},
          "tests": {"A": 1, "B": 4, "C": 4, "D": 4, "E": 4}}


def test_by_test_count_hands_out_the_long_unit_last_and_one_worker_runs_it_alone():
    """B to w0, C to w1; at 2 s each has two tests left and takes D, E; at 6 s w0 (first on a tie)
    has two left and takes A: w0 ends at 6 + 2 + 10 = 18, w1 at 8."""
    assert suite_order.by_test_count(RECORD) == ["B", "C", "D", "E", "A"]
    assert suite_order.simulate(suite_order.by_test_count(RECORD), RECORD) == [18.0, 8.0]


def test_longest_first_starts_the_long_unit_and_shares_the_rest():
    """A to w0, which has one test pending and takes C behind it (10 + 4 = 14); B to w1, which
    takes D at 2 s and E at 6 s (12)."""
    assert suite_order.longest_first(RECORD) == ["A", "B", "C", "D", "E"]
    assert suite_order.simulate(suite_order.longest_first(RECORD), RECORD) == [14.0, 12.0]


def test_one_worker_runs_everything_in_turn():
    assert suite_order.simulate(suite_order.longest_first(RECORD), RECORD, workers=1) == [26.0]


def test_the_record_kept_names_units_of_the_suite(capsys):
    """tests/group_seconds.json: a unit per test file or the verl group, each with its tests; the
    script reads it and prints both orders."""
    record = json.loads((ROOT / "tests" / "group_seconds.json").read_text())
    stems = {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    assert set(record["groups"]) <= stems | {"verl"}, set(record["groups"]) - stems - {"verl"}
    assert set(record["tests"]) == set(record["groups"]) and all(n > 0 for n in record["tests"].values())
    suite_order.main([])
    out = capsys.readouterr().out
    assert "by number of tests" in out and "longest first ÷ by number of tests" in out
