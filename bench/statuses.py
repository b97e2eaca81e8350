"""A run's status, declared once: what it means, whether the run has ended, whether
`bench run --resume` continues it, and the sanity verdict it gives. The stop rules
(runners/stop.py) return these names, the runners store them in `runs.status`, the sweep,
bundles and the leaderboard read them from here. A new status is one more row of STATUSES.

A run PASSes only when it ended `converged` (a confidence bound on split accuracy pooled over
its last evaluations reached the target, never one noisy reading); RUNNING while it goes on;
every other end is a FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Status:
    name: str
    meaning: str
    terminal: bool          # the run has ended (no step follows unless it is resumed)
    resumable: bool         # `bench run --resume` / `bench runs resume` continues it
    verdict: str            # the sanity verdict: PASS, FAIL or RUNNING


STATUSES: dict[str, Status] = {s.name: s for s in (
    Status("running", "training now, or killed while training", False, True, "RUNNING"),
    Status("converged", "the pooled lower bound of split accuracy reached the target", True, False, "PASS"),
    Status("plateaued", "the peak split accuracy stopped moving for `patience` evaluations", True, False, "FAIL"),
    Status("collapsed", "split accuracy fell far below its peak", True, False, "FAIL"),
    Status("futile", "even an optimistic projection of split accuracy stays below the target at max_steps",
           True, False, "FAIL"),
    Status("diverged", "non-finite loss, gradients or weights", True, False, "FAIL"),
    Status("max_steps", "reached max_steps without converging", True, False, "FAIL"),
    Status("failed", "stopped by an error, Ctrl-C or the step-0 calibration gate", True, True, "FAIL"),
    Status("skipped", "not run, or interrupted: an earlier seed of its cell failed, which decides the cell",
           True, False, "FAIL"),
)}

RUNNING, CONVERGED, PLATEAUED, COLLAPSED, FUTILE, DIVERGED, MAX_STEPS, FAILED, SKIPPED = (
    "running", "converged", "plateaued", "collapsed", "futile", "diverged", "max_steps", "failed", "skipped")

# ended for good by a stop rule's verdict (or max_steps), as opposed to running, failed, or skipped
# (a seed its cell's first failing seed made unnecessary: it has no verdict of its own)
FINISHED = tuple(s.name for s in STATUSES.values() if s.terminal and not s.resumable and s.name != SKIPPED)
RESUMABLE = tuple(s.name for s in STATUSES.values() if s.resumable)


def verdict(status: str | None) -> str:
    """The sanity verdict of a run with this status: PASS, RUNNING, or FAIL (any other end,
    and an unknown or missing status)."""
    s = STATUSES.get(status) if status is not None else None
    return s.verdict if s is not None else "FAIL"
