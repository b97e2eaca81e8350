"""One native run of a sweep's cell in a process of its own (`bench sweep --jobs N`): the
process calls runners.runs.start_run with the cell's typed arguments (`CellRun`) and sends each
step's numbers back, then how it ended; the sweep hands the steps to the same progress callback
an in-process cell calls (`follow`) and may interrupt it (`interrupt`: SIGINT, so the run
records itself failed, resumable, as Ctrl-C would). A process of its own because torch's thread
pool and the rollout engine are per process: two cells in one process would contend for both."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
from dataclasses import dataclass
from pathlib import Path

from bench.precision import Precision

from .presets import RunConfig

STEP, DONE, ERROR, INTERRUPTED = "step", "done", "error", "interrupted"


@dataclass(frozen=True)
class CellRun:
    """start_run's arguments for one run of a cell."""

    algo: str
    precision: Precision
    cfg: RunConfig
    build_id: str
    engine: str
    preset: str
    device: str
    ckpt_root: Path | None = None


@dataclass(frozen=True)
class CellEnd:
    """How a process cell ended: its run id (None when it ended before returning one) and, for
    an error, its message; `interrupted` when SIGINT stopped it."""

    run_id: str | None
    error: str | None = None
    interrupted: bool = False


def _numbers(metrics: dict) -> dict:
    """A step's metrics that are numbers (what crosses the process boundary)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


def _main(url: str, cell: CellRun, out) -> None:
    """The cell's process: open the store at `url`, run the cell, report to the queue `out`."""
    from bench.store import open_store

    from .runs import start_run

    store = open_store(url)
    try:
        run_id = start_run(store, cell.algo, cell.precision, cell.cfg, build_id=cell.build_id, engine=cell.engine,
                           preset=cell.preset, ckpt_root=cell.ckpt_root, device=cell.device,
                           progress=lambda step, total, m: out.put((STEP, (step, total, _numbers(m)))))
    except KeyboardInterrupt:
        out.put((INTERRUPTED, None))
    except Exception as e:        # recorded in the store by run_to_end; the sweep goes on with the grid
        out.put((ERROR, f"{type(e).__name__}: {e}"))
    else:
        out.put((DONE, run_id))
    finally:
        store.dispose()


class CellProcess:
    """A started process running `cell` against the store at `url` (spawned: a fresh interpreter,
    as a new `bench run` would be)."""

    def __init__(self, url: str, cell: CellRun):
        ctx = multiprocessing.get_context("spawn")
        self._out = ctx.Queue()
        self._proc = ctx.Process(target=_main, args=(url, cell, self._out), name=f"cell {cell.algo}")
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
                    return CellEnd(None, f"the cell's process ended with exit code {self._proc.exitcode}")
            if kind == STEP:
                if progress is not None:
                    progress(*value)
                continue
            self._proc.join()
            return CellEnd(value if kind == DONE else None, value if kind == ERROR else None, kind == INTERRUPTED)
