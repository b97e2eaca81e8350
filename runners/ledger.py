"""A run's records: the one module that writes a run's rows in the store (a bundle's import
aside, bench/bundle.py), for the native trainer, verl's follower, the sweep and verify alike.

A run's life, as its rows record it:

    create → calibration → (step, evaluations, decisions, digest)* → end | fail
                 ↑ rewind (a resume: everything after the checkpoint's step dropped)

- `create` adds the row (status running); `skip` adds or marks a seed its cell made unnecessary.
- `record_step` stores a step's metrics (a non-finite value as NULL) and moves the run's step
  and wall clock; `record_evaluations` stores avg@n scores and, for the split, the run's final
  and peak accuracy; `converged` (the stop rule's verdict at that step, never one reading ≥
  target) sets steps and wall to target.
- `rewind(step)` is the one rewind of a resume, the same for both trainers: the steps,
  evaluations, decisions and digests after `step` dropped, the run running again at `step`, its
  peak and final accuracy re-read from the evaluations left, steps to target cleared when later.
- `end` records a stop rule's verdict, `fail` an error or Ctrl-C (resumable); `run_to_end`
  calls a trainer and records either, beating a heartbeat meanwhile. A SIGTERM (a scheduler's
  kill, `timeout`, `kill PID`) stops the run as Ctrl-C does: `failed`, reason `interrupted`.
  A run started in the background by a non-interactive shell inherits SIGINT ignored (POSIX:
  every program there starts with it ignored); SIGTERM still stops it.

The heartbeat: while a run's process lives, a thread writes `runs.heartbeat_at` every
HEARTBEAT_S seconds (the store's clock of the writing host). A run still `running` whose last
sign of life (heartbeat or any update) is older than `bench.statuses.DEAD_AFTER_S` reads as
`interrupted` (bench/statuses.py `live_status`): its process was killed (the kernel, a lost
machine) without recording an end. This works on a team's PostgreSQL store across hosts,
where a process id would not.
"""

from __future__ import annotations

import signal
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from sqlalchemy import delete, select

from bench import statedigest
from bench.precision import Precision
from bench.statuses import FAILED, RUNNING, SKIPPED
from bench.store import Build, Eval, Run, RunDecision, RunDigest, RunStep, session
from bench.store.schema import utcnow

HEARTBEAT_S = 60.0              # seconds between a live run's heartbeats


def _finite(v) -> float | None:
    """A metric as stored: a float, or None for NaN, ±inf or a missing value."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if v == v and abs(v) != float("inf") else None


# ------------------------------------------------------------------ the row

def create(s, run_id: str, model_id, build_id: str, algo: str, precision: Precision, trainer: str, engine: str,
           config: dict, checkpoint_dir: Path | str | None, provenance: dict | None, **columns) -> None:
    """Add the new run's row (status running unless `columns` say otherwise) in the open session
    `s`; `columns`: more of its columns (a re-run's copy keeps seed, staleness, calibration)."""
    ckpt = None if checkpoint_dir is None else str(checkpoint_dir)
    s.add(Run(id=run_id, model_id=model_id, build_id=build_id, algo=algo, rollout_dtype=precision.rollout,
              train_dtype=precision.train, trainer=trainer, engine=engine, config=config,
              status=columns.pop("status", RUNNING), checkpoint_dir=ckpt, provenance=provenance,
              heartbeat_at=utcnow(), **columns))


def skip(store, build_id: str, algo: str, p: Precision, config: dict, engine: str, reason: str,
         run_id: str | None = None, trainer: str = "native") -> str:
    """Mark run `run_id` (one interrupted because its cell was decided) skipped with `reason`, or,
    without it, add a run row of status `skipped` (of `trainer`) for a seed never started; returns its id."""
    with session(store) as s:
        if run_id is not None:
            run = s.get(Run, run_id)
            run.status, run.stop_reason = SKIPPED, reason
            return run_id
        rid = uuid.uuid4().hex[:12]
        create(s, rid, s.get(Build, build_id).model_id, build_id, algo, p, trainer, engine, config, None, None,
               status=SKIPPED, stop_reason=reason)
        return rid


# ------------------------------------------------------------------ what a run records

def record_calibration(store, run_id: str, result: dict) -> None:
    """The step-0 gate's result (bench/calibration.py) as the run's `calibration`."""
    with session(store) as s:
        s.get(Run, run_id).calibration = result


def record_step(store, run_id: str, step: int, metrics: dict, wall: float, kl_warning_step: int | None,
                converged: bool = False) -> None:
    """Store step `step`'s metrics (non-finite as NULL); the run's step is the latest stored and
    its wall clock `wall`; `converged`: the stop rule's verdict at this step sets steps to target."""
    clean = {k: _finite(v) for k, v in metrics.items()}
    with session(store) as s:
        s.merge(RunStep.from_metrics(run_id, step, clean))
        run = s.get(Run, run_id)
        run.step, run.wall_s = max(run.step or 0, step), wall
        run.kl_warning_step = kl_warning_step
        if converged:
            run.steps_to_target, run.wall_to_target = step, wall


def record_evaluations(store, run_id: str, step: int, scores: dict[str, tuple[int, float]]) -> None:
    """Store avg@n `scores` {benchmark: (n, score)} of step `step` (a non-finite score is not
    stored); the split's sets the run's final accuracy and, when higher, its peak."""
    with session(store) as s:
        for name, (n, v) in scores.items():
            if _finite(v) is not None:
                s.merge(Eval(run_id=run_id, step=step, benchmark=name, n=n, score=float(v)))
        split = _finite(scores.get("split", (0, None))[1])
        if split is not None:
            run = s.get(Run, run_id)
            run.final_accuracy = split
            if run.peak_accuracy is None or split > run.peak_accuracy:
                run.peak_accuracy = split


def record_decisions(store, run_id: str, shadow: dict, rule_on: Callable[[str], bool], replace: bool = False) -> None:
    """Store the stop rules' shadow decisions {rule: (step, status, reason)} (bench/stop.py: every
    rule, on or off, `rule_on(rule)` says which); `replace`: drop the stored ones first (a replay
    under a larger budget)."""
    with session(store) as s:
        if replace:
            s.execute(delete(RunDecision).where(RunDecision.run_id == run_id))
        for rule, (step, status, reason) in shadow.items():
            s.merge(RunDecision(run_id=run_id, rule=rule, step=step, status=status, reason=reason,
                                rule_on=rule_on(rule)))


def record_digest(store, run_id: str, step: int, digest: str) -> None:
    """The training state's digest at step `step` (bench/statedigest.py, this scheme) and its link
    in the chain over the run's digests."""
    with session(store) as s:
        prev = s.scalars(select(RunDigest.chain).where(RunDigest.run_id == run_id, RunDigest.step < step)
                         .order_by(RunDigest.step.desc()).limit(1)).first()
        s.merge(RunDigest(run_id=run_id, step=step, digest=digest, scheme=statedigest.SCHEME,
                          chain=statedigest.link(prev or statedigest.genesis(run_id), step, digest,
                                                 statedigest.SCHEME)))


def rewind(store, run_id: str, step: int) -> list[tuple[int, dict]]:
    """A resume from the checkpoint of step `step`: the run's steps, evaluations, decisions and
    digests after it dropped; the run running again at `step`, its peak and final accuracy re-read
    from the split evaluations left, its steps to target cleared when they lie after `step`.
    Returns the steps kept [(step, metrics)], in order (verl's follower replays them)."""
    with session(store) as s:
        for table in (RunStep, Eval, RunDecision, RunDigest):
            s.execute(delete(table).where(table.run_id == run_id, table.step > step))
        run = s.get(Run, run_id)
        run.step, run.status, run.stop_reason, run.heartbeat_at = step, RUNNING, None, utcnow()
        split = list(s.scalars(select(Eval.score).where(Eval.run_id == run_id, Eval.benchmark == "split")
                               .order_by(Eval.step)))
        run.peak_accuracy, run.final_accuracy = (max(split), split[-1]) if split else (None, None)
        if run.steps_to_target is not None and run.steps_to_target > step:
            run.steps_to_target = run.wall_to_target = None
        return [(r.step, dict(r.metrics)) for r in
                s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step))]


def note(run: Run, key: str, **entry) -> None:
    """Append `entry` to the list `key` of the run's provenance (a resume on another device:
    `resumes`; an extension: `extends`); `run`: a row of an open session."""
    prov = run.provenance or {}
    run.provenance = {**prov, key: [*prov.get(key, []), entry]}


def extend(run: Run, max_steps: int, old_max_steps: int) -> None:
    """An undecided run's budget raised to `max_steps` (`bench runs extend`): its stored config's,
    the extension noted in its provenance, the run running again; `run`: a row of an open session."""
    run.config = {**run.config, "max_steps": max_steps}
    note(run, "extends", **{"step": run.step, "from": old_max_steps, "to": max_steps})
    run.status, run.stop_reason = RUNNING, None


# ------------------------------------------------------------------ the end

def fail(store, run_id: str, e: BaseException) -> None:
    """Mark a run failed (resumable) by the exception that stopped it."""
    with session(store) as s:
        run = s.get(Run, run_id)
        if run is None:                  # `create` itself failed: there is no row to mark
            return
        run.status = FAILED
        run.stop_reason = "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"[:1000]


def end(store, run_id: str, status: str, reason: str) -> None:
    """The run's end: its status (a stop rule's verdict) and the reason, as the run left it."""
    with session(store) as s:
        run = s.get(Run, run_id)
        run.status, run.stop_reason, run.updated_at = status, reason[:4000], utcnow()


def beat(store, run_id: str) -> None:
    """One heartbeat: the run's process is alive now."""
    with session(store) as s:
        run = s.get(Run, run_id)
        if run is not None:
            run.heartbeat_at = utcnow()


@contextmanager
def heartbeat(store, run_id: str, every: float | None = None):
    """Beat every `every` seconds (default HEARTBEAT_S) in a daemon thread while the block runs (a
    failed beat, e.g. a store briefly locked, is made up by the next)."""
    every = HEARTBEAT_S if every is None else every
    stop = threading.Event()

    def loop():
        while not stop.wait(every):
            try:
                beat(store, run_id)
            except Exception:       # noqa: BLE001 — a missed beat is the next one's to make up
                pass

    thread = threading.Thread(target=loop, name=f"heartbeat-{run_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


class Terminated(KeyboardInterrupt):
    """The KeyboardInterrupt a SIGTERM raises (`sigterm_as_interrupt`): an interrupt like Ctrl-C,
    which a sweep passes on to its cells' processes (Ctrl-C reaches them itself)."""


@contextmanager
def sigterm_as_interrupt():
    """While the block runs (in the main thread), SIGTERM raises `Terminated` as Ctrl-C's SIGINT
    raises KeyboardInterrupt, so the run records its end rather than dying `running` (and verl, in
    its own session, is stopped by its follower rather than outliving bench)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if old is None else old)


@contextmanager
def _interrupts_held():
    """While the block runs (in the main thread), a SIGINT or SIGTERM (one not ignored) is held, and
    raised as KeyboardInterrupt after it: a second Ctrl-C, or a sweep passing a SIGTERM on to a cell
    that had the group's, does not cut the record of the first."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, h in old.items():
        if h is not signal.SIG_IGN:
            signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, signal.SIG_DFL if h is None else h)
    if held:
        raise Terminated if held[0] == signal.SIGTERM else KeyboardInterrupt


def run_to_end(store, run_id: str, train: Callable[[], tuple[str, str]],
               create: Callable[[], None] | None = None) -> None:
    """Call `train` (returns (status, reason)) under a heartbeat and record its end; any exception
    (Ctrl-C or SIGTERM included) marks the run failed, resumable, and is raised again. `create`
    makes a new run's row first, with interrupts held until it is committed: a Ctrl-C as the run
    starts is recorded against its row, never leaving it `running` with no process behind it."""
    try:
        if create is not None:
            with _interrupts_held():
                create()
        with sigterm_as_interrupt(), heartbeat(store, run_id):
            status, reason = train()
    except BaseException as e:
        with _interrupts_held():
            fail(store, run_id, e)
        raise
    end(store, run_id, status, reason)
