"""One native run of a sweep's cell in a process of its own (`bench sweep --jobs N`): the
process trains the cell's `RunPlan` (planned in the sweep's process by runners/plan.py
`plan_run`, as every native run is) through runners.runs.run_plan and sends each step's numbers
back, then how it ended; the sweep hands the steps to the same progress callback an in-process
cell calls (`follow`) and may interrupt it (`interrupt`: SIGINT, so the run records itself
failed, resumable, as Ctrl-C would). A process of its own because torch's thread pool and the
rollout engine are per process: two cells in one process would contend for both."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import tempfile
import traceback
from dataclasses import dataclass

from .plan import RunPlan

STEP, DONE, ERROR, INTERRUPTED = "step", "done", "error", "interrupted"


@dataclass(frozen=True)
class CellEnd:
    """How a process cell ended: its run id (None when it ended before returning one) and, for
    an error, its message; `interrupted` when SIGINT (or SIGTERM) stopped it."""

    run_id: str | None
    error: str | None = None
    interrupted: bool = False


def _numbers(metrics: dict) -> dict:
    """A step's metrics that are numbers (what crosses the process boundary)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


def failure_text(e: BaseException) -> str:
    """A cell's failure in one line: a user error's own message (BenchError), else the exception's
    type and message (a bug, whose traceback the cell's log keeps)."""
    from bench.errors import BenchError

    return str(e) if isinstance(e, BenchError) else f"{type(e).__name__}: {e}"


def _main(url: str, plan: RunPlan, out, log_path: str) -> None:
    """The cell's process: its output to `log_path`, the store at `url` opened, the cell run, how
    it ended reported to the queue `out`. SIGINT (`CellProcess.interrupt`) is Ctrl-C for the
    run; once the run has ended it is ignored, so the end still reaches the sweep."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with open(log_path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    store = None
    try:
        from bench.store import open_store

        from .runs import run_plan

        store = open_store(url)
        run_id = run_plan(store, plan, progress=lambda step, total, m: out.put((STEP, (step, total, _numbers(m)))))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        end = (DONE, run_id)
    except KeyboardInterrupt:
        end = (INTERRUPTED, None)
    except Exception as e:        # a started run records itself failed (run_to_end); the sweep goes on
        traceback.print_exc()
        end = (ERROR, failure_text(e))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out.put(end)
    if store is not None:
        store.dispose()
    for child in multiprocessing.active_children():     # nothing the run started outlives the cell, nor
        child.terminate()                               # holds its exit (Python joins its children then)


class CellProcess:
    """A started process training `plan` against the store at `url` (spawned: a fresh interpreter,
    as a new `bench run` would be). Its output (torch's and the engines' warnings, a traceback)
    goes to its own log file, `log_path`, removed when the cell ends well."""

    def __init__(self, url: str, plan: RunPlan):
        ctx = multiprocessing.get_context("spawn")
        self._out = ctx.Queue()
        fd, self.log_path = tempfile.mkstemp(prefix=f"bench-cell-{plan.algo}-", suffix=".log")
        os.close(fd)
        self._proc = ctx.Process(target=_main, args=(url, plan, self._out, self.log_path), name=f"cell {plan.algo}")
        self._proc.start()

    def interrupt(self) -> None:
        """SIGINT the cell (a no-op once it ended)."""
        if self._proc.is_alive():
            try:
                os.kill(self._proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    def follow(self, progress=None) -> CellEnd:
        """Call `progress(step, total, metrics)` for each step as it arrives (start_run's callback);
        return how the cell ended once it did."""
        while True:
            try:
                kind, value = self._out.get(timeout=0.5)
            except queue.Empty:
                if self._proc.is_alive():
                    continue
                try:                                   # it ended: what it sent last is in the queue, or nothing
                    kind, value = self._out.get(timeout=1)
                except queue.Empty:
                    self._proc.join()
                    return CellEnd(None, f"the cell's process ended with exit code {self._proc.exitcode} "
                                         f"(its output: {self.log_path})")
            if kind == STEP:
                if progress is not None:
                    progress(*value)
                continue
            self._proc.join()
            if kind == ERROR:
                return CellEnd(None, f"{value} (its output: {self.log_path})")
            os.unlink(self.log_path)
            return CellEnd(value if kind == DONE else None, None, kind == INTERRUPTED)
