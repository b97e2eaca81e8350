"""A run's status, declared once: what it means, whether the run has ended, whether
`bench run --resume` continues it, whether `bench runs extend` gives it a larger budget, and the
sanity verdict it gives. The stop rules (bench/stop.py) return these names, the runners store
them in `runs.status`, the sweep, bundles, the report and the leaderboard read them from here.
A new status is one more row of STATUSES.

Three verdicts, each a claim about the run's own stored evidence (bench/verdicts.py recomputes
it from the evaluations, never from the label alone):

- PASS: `converged`: the confidence bound on split accuracy pooled over the last evaluations
  reached the target (never one noisy reading).
- FAIL: only where a rule with a measured error rate decided it: `futile`, `collapsed`,
  `plateaued` (where on), `diverged` (non-finite loss, gradients or weights), and
  `miscalibrated` (the step-0 calibration gate: a plumbing fault, not a precision effect).
- UNDECIDED: `max_steps`: the budget ran out before any rule decided; `bench runs extend RUN
  --max-steps N` continues it.

RUNNING while a run goes on. A run whose process was killed without recording an end (the
kernel, a lost machine) stays `running` in the store; its heartbeat stops (runners/ledger.py),
and every reader shows it `interrupted` (`live_status`), resumable. `failed` (an error or
Ctrl-C), `skipped` (a seed its cell's first FAIL made unnecessary) and `interrupted` give no
verdict at all (NO_VERDICT): an error says nothing about the algorithm or the precision.
`evaluated` (a run with `--max-steps 0`: the step-0 gate and evaluation only, as the
equivalence protocol's sweep makes) is a measurement, not a leaderboard cell (IN_CELLS).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

PASS, FAIL, UNDECIDED, RUNNING_VERDICT, NO_VERDICT = "PASS", "FAIL", "UNDECIDED", "RUNNING", "NO VERDICT"
VERDICTS = (PASS, FAIL, UNDECIDED, RUNNING_VERDICT, NO_VERDICT)


@dataclass(frozen=True)
class Status:
    name: str
    meaning: str
    terminal: bool          # the run has ended (no step follows unless it is resumed or extended)
    resumable: bool         # `bench run --resume RUN` continues it
    extendable: bool        # `bench runs extend RUN --max-steps N` continues it under a larger budget
    verdict: str            # the sanity verdict: one of VERDICTS
    kind: str = "fail"      # how the app colours it (leaderboard/colours.py): pass, pending, early, undecided, fail
    in_cells: bool = True   # a seed of its leaderboard cell (a measurement that trained nothing is not)


STATUSES: dict[str, Status] = {s.name: s for s in (
    Status("running", "training now (a run killed while training reads `interrupted`)", False, True, False,
           RUNNING_VERDICT, kind="pending"),
    Status("converged", "the pooled lower bound of split accuracy reached the target", True, False, False, PASS,
           kind="pass"),
    Status("futile", "even an optimistic projection of split accuracy stays below the target at max_steps",
           True, False, False, FAIL, kind="early"),
    Status("collapsed", "split accuracy fell far below its peak", True, False, False, FAIL),
    Status("plateaued", "the peak split accuracy stopped moving for `patience` evaluations (a rule off by default)",
           True, False, False, FAIL),
    Status("diverged", "non-finite loss, gradients or weights", True, False, False, FAIL),
    Status("miscalibrated", "the step-0 calibration gate: μ and π of the same tokens at identical weights differ "
           "beyond the pair's limits (a plumbing fault)", True, False, False, FAIL),
    Status("max_steps", "reached max_steps before any rule decided", True, False, True, UNDECIDED, kind="undecided"),
    Status("failed", "stopped by an error or Ctrl-C", True, True, False, NO_VERDICT, kind="undecided"),
    Status("interrupted", "its process stopped without recording an end (killed: no heartbeat for "
           "DEAD_AFTER_S); read, never stored: the store still says running", True, True, False, NO_VERDICT,
           kind="undecided"),
    Status("evaluated", "--max-steps 0: the step-0 calibration gate and evaluation only; a measurement, "
           "no cell of the leaderboard", True, False, True, NO_VERDICT, kind="undecided", in_cells=False),
    Status("skipped", "not run, or interrupted: an earlier seed of its cell failed, which decides the cell",
           True, False, False, NO_VERDICT, kind="early"),
)}

(RUNNING, CONVERGED, FUTILE, COLLAPSED, PLATEAUED, DIVERGED, MISCALIBRATED, MAX_STEPS, FAILED, INTERRUPTED,
 EVALUATED, SKIPPED) = STATUSES
DEAD_AFTER_S = 600.0    # a running run silent this long (10 heartbeats, runners/ledger.py) reads as interrupted

# ended for good by a stop rule's verdict, the gate or the budget, as opposed to running, failed,
# or skipped (a seed its cell's first failing seed made unnecessary: it has no verdict of its own)
FINISHED = tuple(s.name for s in STATUSES.values() if s.terminal and not s.resumable and s.name != SKIPPED)
STORED = tuple(s for s in STATUSES if s != INTERRUPTED)     # what a runner writes (interrupted is read only)
RESUMABLE = tuple(s.name for s in STATUSES.values() if s.resumable)
EXTENDABLE = tuple(s.name for s in STATUSES.values() if s.extendable)
FAILING = tuple(s.name for s in STATUSES.values() if s.verdict == FAIL)       # the statuses whose verdict is FAIL
NOT_IN_CELLS = tuple(s.name for s in STATUSES.values() if not s.in_cells)


def verdict(status: str | None) -> str:
    """The sanity verdict of a run with this status (the table's); NO_VERDICT for an unknown or
    missing status."""
    s = STATUSES.get(status) if status is not None else None
    return s.verdict if s is not None else NO_VERDICT

# a build's status (builds.status), one table too: name → meaning
BUILD_STATUSES = {
    "running": "rolling out, or killed while rolling out (`bench build` with the same settings resumes it)",
    "complete": "every problem graded; the split is saved (a run reads only a complete build)",
    "failed": "stopped by an error or Ctrl-C (`bench build` with the same settings resumes it)",
}
BUILD_RUNNING, BUILD_COMPLETE, BUILD_FAILED = BUILD_STATUSES


def last_sign(heartbeat_at, updated_at):
    """A run's last sign of life: its heartbeat, else its last update; None where it has neither
    (a missing value may come as None, NaN or NaT: none equals itself)."""
    def present(x) -> bool:
        return x is not None and x == x

    sign = heartbeat_at if present(heartbeat_at) else updated_at
    return sign if present(sign) else None


def live_status(status: str | None, last_sign: datetime | None, now: datetime | None = None) -> str | None:
    """The status a reader shows: `interrupted` for a run still `running` in the store whose last
    sign of life (`last_sign`: its heartbeat, else its last update; naive UTC) is more than
    DEAD_AFTER_S before `now` (default: the current UTC time); otherwise the stored status."""
    if status != RUNNING or last_sign is None:
        return status
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    return INTERRUPTED if now - last_sign > timedelta(seconds=DEAD_AFTER_S) else status
