"""What the order of the suite's files costs under pytest-xdist's `--dist loadgroup`, simulated from
a recorded run (tests/group_seconds.json, written by `--record-group-seconds`).

xdist's scheduler (xdist/scheduler/loadscope.py, 3.8) hands each worker one unit (a file, or the
verl group), then a second to a worker whose unit has at most two tests left, and so again after
every test a worker finishes; the run ends when the last worker does. This replays that rule with
each unit's recorded seconds spread evenly over its tests, for xdist's default order (units by
number of tests, most first) and the suite's (tests/xdist_order.py: recorded seconds, longest
first), and prints each worker's end and the ratio of the two runs' lengths. The simulation leaves
out collection, start-up and the workers' contention for memory and cores.

    python benchmarks/suite_order.py [--record tests/group_seconds.json] [--workers 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections import deque
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
RECORD = TESTS / "group_seconds.json"
# the suite's own ordering rule, replayed as the suite runs it
_spec = importlib.util.spec_from_file_location("_xdist_order", TESTS / "xdist_order.py")
_xdist_order = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_xdist_order)


def by_test_count(record: dict) -> list[str]:
    """xdist's default order (`--loadscope-reorder`): units by number of tests, most first. xdist
    breaks ties by collection order, which the record does not keep: here by the record's order
    (longest first), an approximation among units of equal counts."""
    return sorted(record["groups"], key=lambda g: -record["tests"][g])


def longest_first(record: dict) -> list[str]:
    """tests/xdist_order.py's order (its `longest_first`): units by recorded seconds, longest first."""
    return _xdist_order.longest_first(list(record["groups"]), lambda g: g, record["groups"])


def simulate(order: list[str], record: dict, workers: int = 2) -> list[float]:
    """Each worker's end (seconds from the start) when xdist hands out the units of `order`:
    one each, then another to any worker with ≤ 2 of its tests pending, checked at the start and
    after every test it finishes. A unit's tests take its seconds ÷ its tests each."""
    work = deque(order)
    queues: list[deque] = [deque() for _ in range(workers)]
    clock = [0.0] * workers

    def assign(w: int) -> None:
        g = work.popleft()
        n = max(record["tests"][g], 1)
        queues[w].extend([record["groups"][g] / n] * n)

    for w in range(workers):
        if work:
            assign(w)
    for w in range(workers):
        if work and len(queues[w]) <= 2:
            assign(w)
    while any(queues):
        w = min((w for w in range(workers) if queues[w]), key=lambda w: clock[w] + queues[w][0])
        clock[w] += queues[w].popleft()
        if work and len(queues[w]) <= 2:
            assign(w)
    return clock


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", type=Path, default=RECORD)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    record = json.loads(a.record.read_text())
    total = sum(record["groups"].values())
    print(f"record: {record['recorded']}; {len(record['groups'])} units, {sum(record['tests'].values())} tests, "
          f"{total:.0f} s of tests; {a.workers} workers")
    ends = {}
    for name, order in (("by number of tests (xdist's default)", by_test_count(record)),
                        ("longest first (tests/xdist_order.py)", longest_first(record))):
        ends[name] = clock = simulate(order, record, a.workers)
        print(f"  {name}: workers end at {', '.join(f'{c:.0f}' for c in clock)} s; the run {max(clock):.0f} s, "
              f"{max(clock) - min(clock):.0f} s on one worker alone; the last units {', '.join(order[-3:])}")
    old, new = (max(c) for c in ends.values())
    print(f"longest first ÷ by number of tests: {new / old:.3f} (the ideal, all seconds ÷ {a.workers}: "
          f"{total / a.workers / old:.3f})")


if __name__ == "__main__":
    main()
