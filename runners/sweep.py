"""The algorithm × precision grid on one build: cells run one after another (or `jobs` at a
time, each in a process of its own: runners/cell_process.py); a cell that already finished on
that build with the same trainer, rollout engine and settings (bench/fingerprint.py: every
setting but the seed) is skipped.
With seeds, every cell runs once per seed and a finished (cell, seed) pair is skipped; with a
staleness axis (`--staleness 0,1,2,4`: runners/staleness.py), once per K as well, a finished
(cell, K, seed) run skipped. A cell's finished runs are those of its K (runs.staleness; without
the axis, the preset's K, 0), so on-policy and stale runs never stand in for each other.
With the verl trainer the cells run one after another (runners/verl_launch.py, then
runners/verl_follow.py): verl takes the whole cluster. Its seeds are verl's (runners/verl_runner.py
`SEED_KEYS`), decided as the native trainer's are.

A cell passes only when every seed passes, so with seeds its first failing seed decides it
(`decide_early`, on by default; `SeedDecider`): once a seed of a cell ends in a FAIL status
(FAILING: a finished run that did not converge; a crash, `failed`, decides nothing), the
cell's seeds not started yet are not started, and its running ones (process cells, `jobs` > 1)
are interrupted; both are recorded as runs with status `skipped` and the reason. A finished
failing seed from an earlier sweep decides the cell the same way. The report then says "decided
after k of N seeds".

Progress: one line per training step and cell (`log`), from the trainer's progress callback in
process or relayed from a process cell, and one line when a cell ends."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import select

from bench.engines import resolve_engine
from bench.errors import ConfigError
from bench.fingerprint import fingerprint
from bench.precision import Precision
from bench.statuses import FAILED, FAILING, FINISHED, RUNNING, SKIPPED
from bench.store import Run, session
from bench.store.schema import utcnow

from . import ledger
from .cell_process import CellProcess, failure_text
from .plan import RunPlan, latest_build, plan_run, resolve_inputs
from .presets import get_preset
from .runs import run_plan
from .verl_launch import VerlTarget, check_verl_cell

def step_line(step: int, total: int | None, m: dict) -> str:
    """One training step as text: the step, mean reward and KL k3 every step; split accuracy
    (and every benchmark) at the steps that evaluated. `m`: the native trainer's step metrics
    (`reward`, `kl_k3`, `eval/<name>`) or verl's (`critic/score/mean`)."""
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    if isinstance(m.get("gate/k3"), (int, float)):
        parts.append(f"gate passed, k3 {m['gate/k3']:.2e}")
    reward = m.get("reward", m.get("critic/score/mean"))
    if isinstance(reward, (int, float)):
        parts.append(f"reward {reward:.3f}")
    evals = {k[len("eval/"):]: v for k, v in m.items() if k.startswith("eval/") and isinstance(v, (int, float))}
    if "split" in evals:
        parts.append(f"split {evals.pop('split'):.3f}")
    parts += [f"{name} {v:.3f}" for name, v in sorted(evals.items())]
    if isinstance(m.get("kl_k3"), (int, float)):
        parts.append(f"kl_k3 {m['kl_k3']:.2e}")
    return "  ".join(parts)


def _ended_line(s, run_id: str | None) -> str:
    r = s.get(Run, run_id) if run_id else None
    if r is None:
        return FAILED
    peak = "-" if r.peak_accuracy is None else f"{r.peak_accuracy:.3f}"
    return f"{r.status} after {r.step} steps, peak split {peak}"


def cell_runs(s, build_id: str, algo: str, p: Precision, trainer: str, staleness: int, engine: str | None,
              config_fp: str | None, statuses: tuple[str, ...], seed: int | None = None, since=None) -> list[Run]:
    """The runs of one cell — leaderboard/cells.py's key: the build (and so the model), algorithm,
    precision pair, trainer, engine (runs.engine; None: any), staleness K (runs.staleness) and
    settings fingerprint (bench/fingerprint.py of runs.config; None: any) — of `seed` (runs.seed)
    when given, in `statuses`, created at or after `since`, newest first. So another engine's or
    another learning rate's run never stands in for the cell's."""
    q = select(Run).where(Run.build_id == build_id, Run.algo == algo, Run.rollout_dtype == p.rollout,
                          Run.train_dtype == p.train, Run.trainer == trainer, Run.staleness == staleness,
                          Run.status.in_(statuses))
    if seed is not None:
        q = q.where(Run.seed == seed)
    if engine is not None:
        q = q.where(Run.engine == engine)
    if since is not None:
        q = q.where(Run.created_at >= since)
    return [r for r in s.scalars(q.order_by(Run.created_at.desc())) if config_fp is None
            or fingerprint(r.config) == config_fp]


def run_engine(engine: str, trainer: str) -> str:
    """The engine a run of the sweep records (runs.engine): verl's rollouts are vLLM's; a native
    run resolves `auto` as `bench run` does (an unavailable vllm is the cell's own failure)."""
    if trainer == "verl":
        return "vllm"
    try:
        return resolve_engine(engine)
    except ValueError:
        return engine


def parse_seeds(text: str) -> list[int]:
    """`--seeds N` means seeds 0..N-1; a comma list (`0,3,5`, or `5,` for seed 5 alone) names them."""
    try:
        if "," in text:
            seeds = [int(x) for x in text.split(",") if x.strip()]
        else:
            n = int(text)
            if n < 1:
                raise ConfigError
            seeds = list(range(n))
    except ValueError:
        raise ConfigError(f"bad --seeds {text!r}: give a count N (seeds 0..N-1) or a comma list such as 0,3,5") \
            from None
    if not seeds or any(x < 0 for x in seeds):
        raise ConfigError(f"bad --seeds {text!r}: seeds are integers >= 0")
    return list(dict.fromkeys(seeds))


def parse_staleness(text: str) -> list[int]:
    """`--staleness 0,1,2,4,8,16`: the K values of a sweep (one value is an axis of one)."""
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ks = []
    if not ks or any(k < 0 for k in ks):
        raise ConfigError(f"bad --staleness {text!r}: give integers >= 0 (optimizer steps the rollout weights lag "
                         "behind), one or a comma list such as 0,1,2,4,8,16")
    return list(dict.fromkeys(ks))


def _summary(s, run_id: str | None, algo: str, p: Precision, status: str | None = None,
             seed: int | None = None, staleness: int | None = None) -> dict:
    r = s.get(Run, run_id) if run_id else None
    return {"algo": algo, "precision": p.name, **({} if staleness is None else {"staleness": staleness}),
            **({} if seed is None else {"seed": seed}), "run": run_id,
            "status": status or (r.status if r else FAILED), "peak": r.peak_accuracy if r else None,
            "steps": r.step if r else 0}


# ------------------------------------------------------------------ the plan

@dataclass(frozen=True)
class Cell:
    """One run the grid asks for: an algorithm at a precision pair, at staleness K (None: the
    grid's one K) and seed (None: the preset's)."""

    algo: str
    precision: Precision
    staleness: int | None = None
    seed: int | None = None

    @property
    def key(self) -> tuple:
        """What a seed decides: the cell at its K."""
        return self.algo, self.precision, self.staleness

    @property
    def label(self) -> str:
        return (f"{self.algo} {self.precision.name}" + ("" if self.staleness is None else f" K={self.staleness}")
                + ("" if self.seed is None else f" seed {self.seed}"))


@dataclass(frozen=True)
class Grid:
    """The grid's settings every cell shares, resolved once (`plan_grid`)."""

    build_id: str
    engine: str               # as given (auto resolves per run)
    recorded_engine: str      # the engine a finished run of the cell recorded (runs.engine)
    preset: str
    overrides: dict
    default_k: int            # the K of the cells without a staleness axis
    device: str
    ckpt_root: Path | None
    verl: VerlTarget | None   # None: the native trainer

    @property
    def trainer(self) -> str:
        return "native" if self.verl is None else "verl"

    def args(self, cell: Cell) -> dict:
        """The cell's overrides of the preset (its seed and K among them)."""
        return {**self.overrides, **({} if cell.seed is None else {"seed": cell.seed}),
                **({} if cell.staleness is None else {"staleness": cell.staleness})}

    def k(self, cell: Cell) -> int:
        return self.default_k if cell.staleness is None else cell.staleness

    def fingerprint(self, cell: Cell) -> str:
        return fingerprint(self.config(cell))

    def config(self, cell: Cell) -> dict:
        """The run config a run of the cell stores."""
        return {"preset": self.preset, **asdict(get_preset(self.preset, **self.args(cell)))}


def plan_grid(store, algos: list[str], pairs: list[Precision], build_id: str | None, engine: str, preset: str,
              overrides: dict, seeds: list[int] | None = None, staleness: list[int] | None = None,
              device: str = "cpu", ckpt_root=None, verl: VerlTarget | None = None) -> tuple[Grid, list[Cell]]:
    """The grid's shared settings and its cells, every grid-wide input checked before any cell
    runs: the build (given, or the latest complete one), seeds and K given once, and what verl
    cannot run."""
    with session(store) as s:
        build = resolve_inputs(s, build_id, None)[0] if build_id else latest_build(s)
        if build is None:
            raise ConfigError("no build yet: make one with `bench build --model tiny-math`")
    if seeds is not None and "seed" in overrides:
        raise ConfigError("give either a seed or seeds, not both")
    if staleness is not None and "staleness" in overrides:
        raise ConfigError("give either a staleness or a staleness axis, not both")
    default_k = overrides["staleness"] if "staleness" in overrides else get_preset(preset).staleness
    grid = Grid(build.id, engine, run_engine(engine, "native" if verl is None else "verl"), preset, overrides,
                default_k, device, ckpt_root, verl)
    cells = [Cell(a, p, k, seed) for a in algos for p in pairs for k in (staleness or [None])
             for seed in (seeds or [None])]
    if verl is not None:
        for cell in cells:
            check_verl_cell(cell.algo, get_preset(preset, **grid.args(cell)))
    return grid, cells


# ------------------------------------------------------------------ deciding a cell by its seeds

class SeedDecider:
    """A cell passes only when every seed passes, so its first failing seed decides it (module
    doc): which cells are decided and why, and the running seeds to interrupt when one is. The
    grid's cells run on a pool of threads: the state is read and written under the lock (the
    interrupts are sent outside it)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._lock = threading.Lock()
        self._why: dict[tuple, str] = {}
        self._running: dict[tuple, list[CellProcess]] = {}
        self._stopped = False

    def why(self, key: tuple) -> str | None:
        """Why the cell is decided; None while it is not."""
        with self._lock:
            return self._why.get(key)

    def decide(self, key: tuple, why: str) -> bool:
        """Decide the cell for `why` unless it is decided already (then False), interrupting its
        running seeds; a no-op (False) when deciding early is off."""
        if not self.enabled:
            return False
        with self._lock:
            if key in self._why:
                return False
            self._why[key] = why
            running = list(self._running.get(key, []))
        for proc in running:
            proc.interrupt()      # the run records itself failed; the grid then marks it skipped
        return True

    def interrupt_all(self) -> None:
        """Interrupt every running seed, and any started from now on (the sweep itself was stopped)."""
        with self._lock:
            self._stopped = True
            running = [p for procs in self._running.values() for p in procs]
        for proc in running:
            proc.interrupt()

    def started(self, key: tuple, proc: CellProcess) -> None:
        """A seed of the cell started in `proc` (interrupted at once if the cell was decided, or the sweep
        stopped, meanwhile)."""
        with self._lock:
            self._running.setdefault(key, []).append(proc)
            cancel = key in self._why or self._stopped
        if cancel:
            proc.interrupt()

    def ended(self, key: tuple, proc: CellProcess) -> None:
        with self._lock:
            self._running[key] = [p for p in self._running.get(key, []) if p is not proc]


def skip_reason(why: str, at: int | None = None) -> str:
    start = "not run" if at is None else f"interrupted at step {at}"
    return f"{start}: the cell was decided when {why} (a cell passes only when every seed passes)"


# ------------------------------------------------------------------ running the grid

class _GridRun:
    """The grid's cells run against `store`: each through `run_cell` (in this process, in one of
    its own, or through verl), its seeds decided by `decider`, its progress sent to `log`."""

    def __init__(self, store, grid: Grid, decider: SeedDecider, jobs: int, log, progress: bool):
        self.store, self.grid, self.decider, self.jobs, self.log, self.progress = (store, grid, decider, jobs, log,
                                                                                 progress)

    def step_log(self, cell: Cell):
        """The progress callback of a cell: one line per step (None when progress is off)."""
        if not self.progress:
            return None
        return lambda step, total, m: self.log(f"  {cell.label} {step_line(step, total, m)}")

    def __call__(self, cell: Cell) -> str | None:
        """Run one cell (or skip it when its cell was decided); its run id."""
        why = self.decider.why(cell.key)
        if why is not None:
            return self.skip(cell, why)
        self.log(f"run {cell.label} on build {self.grid.build_id}")
        since = utcnow()
        rid = self.run_cell(cell)
        if self.decider.enabled:
            rid = self.after(cell, rid, since)
        if self.progress and rid is not None:
            with session(self.store) as s:
                self.log(f"  {cell.label}: {_ended_line(s, rid)}")
        return rid

    def run_cell(self, cell: Cell) -> str | None:
        g = self.grid
        cfg = get_preset(g.preset, **g.args(cell))
        try:
            plan = plan_run(self.store, cell.algo, cell.precision, cfg, g.build_id, None, g.engine, g.device,
                            g.preset, g.ckpt_root, g.verl)
            if self.jobs == 1:
                return run_plan(self.store, plan, progress=self.step_log(cell),
                                log=lambda msg: self.log(f"  {cell.label}: {msg}"))
        except Exception as e:  # the failed run is recorded in the store; go on with the grid
            self.log(f"  {cell.label} failed: {failure_text(e)}")
            return None
        return self._in_own_process(cell, plan)

    def _in_own_process(self, cell: Cell, plan: RunPlan) -> str | None:
        proc = CellProcess(self.store.url.render_as_string(hide_password=False), plan)
        self.decider.started(cell.key, proc)
        try:
            end = proc.follow(self.step_log(cell))
        finally:
            self.decider.ended(cell.key, proc)
        if end.run_id is None:
            why = self.decider.why(cell.key)
            if why is not None:            # interrupted by us: `after` records it skipped (or finished)
                self.log(f"  {cell.label} interrupted: the cell was decided when {why}")
            else:
                self.log(f"  {cell.label} " + ("interrupted" if end.interrupted else f"failed: {end.error}"))
        return end.run_id

    def skip(self, cell: Cell, why: str) -> str:
        """Record a seed not started because its cell was decided (once: an earlier sweep's record stands)."""
        g = self.grid
        with session(self.store) as s:
            earlier = cell_runs(s, g.build_id, cell.algo, cell.precision, g.trainer, g.k(cell), g.recorded_engine,
                                g.fingerprint(cell), (SKIPPED,), cell.seed)
        if earlier:
            return earlier[0].id
        self.log(f"skip {cell.label}: cell decided ({why})")
        return ledger.skip(self.store, g.build_id, cell.algo, cell.precision, g.config(cell), g.recorded_engine,
                           skip_reason(why), trainer=g.trainer)

    def after(self, cell: Cell, rid: str | None, since) -> str | None:
        """Decide the cell on a failing seed (interrupting its running seeds); mark this seed
        skipped when it was interrupted for another seed's failure."""
        with session(self.store) as s:
            r = s.get(Run, rid) if rid else None
            status = r.status if r else None
        if status in FAILING and self.decider.decide(cell.key, f"seed {cell.seed} ended {status} (run {rid})"):
            return rid
        why = self.decider.why(cell.key)
        if why is None or status in FINISHED:
            return rid
        g = self.grid
        with session(self.store) as s:     # interrupted (or crashed while the cell was being decided)
            mine = cell_runs(s, g.build_id, cell.algo, cell.precision, g.trainer, g.k(cell), g.recorded_engine,
                             g.fingerprint(cell), (*FINISHED, FAILED, RUNNING), cell.seed, since)
            mine_id, mine_status, at = (mine[0].id, mine[0].status, mine[0].step) if mine else (None, None, None)
        if mine_status in FINISHED:   # it ended before the interruption reached it (its output was cut)
            return mine_id
        if mine_id is not None:
            return ledger.skip(self.store, g.build_id, cell.algo, cell.precision, {}, g.recorded_engine,
                               skip_reason(why, at), mine_id)
        return self.skip(cell, why)


def run_grid(store, algos: list[str], pairs: list[Precision], build_id: str | None, engine: str, preset: str,
             overrides: dict, jobs: int = 1, log=print, verl: VerlTarget | None = None,
             seeds: list[int] | None = None, ckpt_root=None, progress: bool = True, device: str = "cpu",
             staleness: list[int] | None = None, decide_early: bool = True) -> list[dict]:
    """Run the grid; with `verl` every cell runs on the verl trainer, one at a time. `seeds` runs
    every cell once per seed (the run config's `seed`), skipping the (cell, seed) pairs that
    already finished; without it a cell is run once with the preset's seed and skipped when any
    of its runs finished. `progress`: `log` one line per step of every cell (`<algo>
    <precision>[ seed N] step …`) and one when it ends. `device`: where native cells train
    (bench/device.py). `staleness`: run every cell (and seed) once per K, skipping the finished
    (cell, K, seed) runs; without it every cell runs at the K of the overrides or the preset,
    and only its runs at that K count as finished. `decide_early` (with seeds): a cell's
    first failing seed decides it (module doc)."""
    grid, cells = plan_grid(store, algos, pairs, build_id, engine, preset, overrides, seeds, staleness, device,
                            ckpt_root, verl)
    decider = SeedDecider(decide_early and seeds is not None)
    todo, results = [], {}
    with session(store) as s:
        for cell in cells:
            done = next(iter(cell_runs(s, grid.build_id, cell.algo, cell.precision, grid.trainer, grid.k(cell),
                                       grid.recorded_engine, grid.fingerprint(cell), FINISHED, cell.seed)), None)
            if done:
                log(f"skip {cell.label}: finished as run {done.id} ({done.status})")
                results[cell] = _summary(s, done.id, cell.algo, cell.precision, f"{done.status} (earlier)",
                                         cell.seed, cell.staleness)
                if done.status in FAILING:
                    decider.decide(cell.key, f"seed {cell.seed} ended {done.status} (run {done.id})")
            else:
                todo.append(cell)
    one = _GridRun(store, grid, decider, 1 if verl is not None else jobs, log, progress)
    if one.jobs == 1:           # on this thread: Ctrl-C reaches the cell (verl's follower stops verl on it)
        ids = [one(cell) for cell in todo]
    else:
        pool = ThreadPoolExecutor(max_workers=one.jobs)
        try:
            with ledger.sigterm_as_interrupt():
                ids = list(pool.map(one, todo))
        except KeyboardInterrupt as e:  # Ctrl-C reached the running cells too (one process group); a SIGTERM
            if isinstance(e, ledger.Terminated):    # may have come to this process alone: passed on
                decider.interrupt_all()
            pool.shutdown(wait=False, cancel_futures=True)      # start no more
            raise
        pool.shutdown()
    with session(store) as s:
        for cell, rid in zip(todo, ids):
            results[cell] = _summary(s, rid, cell.algo, cell.precision, seed=cell.seed, staleness=cell.staleness)
    return [results[c] for c in cells]
