"""The order in which the suite's test files reach pytest-xdist's two workers, and the record it
is made from.

`./bench.sh test` runs `-n 2 --dist loadgroup`: a file (or the verl group) is one unit of work,
run whole by one worker (tests/conftest.py). xdist hands units out in a fixed order as workers
free up; by default it sorts them by their number of tests. Bench's costliest files hold few
tests (test_real_model: one test of five minutes on a Zen 3), so that order handed the longest
out last: replayed on the record (benchmarks/suite_order.py), one worker ran alone for the last
316 s of a 1,623 s run. Here the units are handed out longest first (the longest-processing-time
rule of list scheduling), by the seconds each took in a recorded full run (`group_seconds.json`);
a unit the record does not know (a new file) goes last, in collection order. Measured on that
Zen 3 (2026-12-07): both workers busy 1,466 s and ending together at 1,485 s, the whole suite in
1,493 s.

`pytest -n 2 --dist loadgroup --record-group-seconds=PATH` (e.g. `./bench.sh test
--record-group-seconds=tests/group_seconds.json`; with the `=`: a separate word can be taken for
a path to test before this file's option is known) writes that record from a whole suite that
passed, and the summary says how long each worker was busy and when it ended: the gap between
their ends is what the order costs."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).with_name("group_seconds.json")


def group_of(nodeid: str) -> str | None:
    """The xdist_group a test's node id carries under `--dist loadgroup` ("…::test@group"), by
    xdist's own rule (an "@" after the last "]": a parameter may hold one)."""
    return nodeid[nodeid.rfind("@") + 1:] if nodeid.rfind("@") > nodeid.rfind("]") else None


def longest_first(items: list, group, seconds: dict[str, float]) -> list:
    """`items` reordered by their group's recorded `seconds`, longest first; a group without a
    record after every recorded one; within a group, and among unrecorded groups, the collection
    order kept (tests of a file may depend on their order)."""
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(group(item), i)
    return sorted(items, key=lambda item: (-seconds.get(group(item), -1.0), first[group(item)]))


def group_name(item) -> str:
    """The unit of work an item belongs to: "verl" for every verl test (one Ray cluster and one verl
    job at a time), else its file's name."""
    return "verl" if item.get_closest_marker("verl") else item.path.stem


def pytest_itemcollected(item):
    """Under pytest-xdist (`./bench.sh test` runs `-n 2 --dist loadgroup`), a test file runs on one
    worker, so its module fixtures (builds, short runs) are made once, and every verl test runs on
    one worker."""
    if item.config.pluginmanager.hasplugin("xdist"):
        item.add_marker(pytest.mark.xdist_group(group_name(item)))


def pytest_addoption(parser):
    parser.addoption("--record-group-seconds", metavar="PATH", default=None,
                     help="--record-group-seconds=PATH (with the =) writes each xdist group's seconds in this "
                          "run (setup, call and teardown of its tests) to PATH as JSON: the record "
                          "tests/xdist_order.py orders the groups by")


def pytest_configure(config):
    global _times
    if getattr(config.option, "dist", "no") == "loadgroup" and RECORD.is_file():
        # the order of longest_first below, not xdist's by number of tests
        config.option.loadscopereorder = False
    if not hasattr(config, "workerinput"):          # the controller (or a run without workers)
        _times = _Times()


def pytest_collection_modifyitems(config, items):
    # a worker of `--dist loadgroup` (xdist sets `loadgroup` there); a run without workers keeps its order
    if getattr(config.option, "loadgroup", False) and RECORD.is_file():
        items[:] = longest_first(items, group_name, json.loads(RECORD.read_text())["groups"])


class _Times:
    """What the controller hears of its workers' tests: seconds by group and by worker, and when
    each worker's last report came."""

    def __init__(self):
        self.start = time.monotonic()
        self.groups: dict[str, float] = defaultdict(float)
        self.busy: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)
        self.group_tests: dict[str, set] = defaultdict(set)
        self.ended: dict[str, float] = {}

    def add(self, report) -> None:
        gateway = getattr(getattr(report, "node", None), "gateway", None)
        group = group_of(report.nodeid)
        if gateway is None or group is None:          # not a worker's report under --dist loadgroup
            return
        self.groups[group] += report.duration
        self.busy[gateway.id] += report.duration
        self.tests[gateway.id] += report.when == "teardown"
        self.group_tests[group].add(report.nodeid)
        self.ended[gateway.id] = time.monotonic() - self.start


_times: _Times | None = None


def pytest_runtest_logreport(report):
    if _times is not None:
        _times.add(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _times is None or not _times.busy:
        return
    t = _times
    terminalreporter.write_line("xdist workers: " + "; ".join(
        f"{w} {t.tests[w]} tests, busy {t.busy[w]:.0f} s, last report at {t.ended[w]:.0f} s" for w in sorted(t.busy)))
    path = config.getoption("--record-group-seconds")
    whole = (exitstatus == 0 and not terminalreporter.stats.get("deselected")
             and config.args_source == pytest.Config.ArgsSource.TESTPATHS)
    if path and not whole:
        terminalreporter.write_line(f"group seconds NOT written to {path}: only a whole suite that passed "
                                    "(no paths given, nothing deselected) makes a record")
    elif path:
        from bench.provenance import cpu_name

        record = {"recorded": f"{time.strftime('%Y-%m-%d')}, {cpu_name()}, {len(t.busy)} workers",
                  "groups": {g: round(s, 1) for g, s in sorted(t.groups.items(), key=lambda kv: -kv[1])},
                  "tests": {g: len(t.group_tests[g]) for g in sorted(t.groups, key=lambda g: -t.groups[g])}}
        Path(path).write_text(json.dumps(record, indent=1) + "\n")
        terminalreporter.write_line(f"group seconds written to {path}")
