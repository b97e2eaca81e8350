"""The algorithm × precision grid on one build: cells run one after another (or in `jobs`
processes); a cell that already finished on that build with the same trainer, rollout engine and
settings (bench/fingerprint.py: every setting but the seed) is skipped.
With seeds, every cell runs once per seed and a finished (cell, seed) pair is skipped; with a
staleness axis (`--staleness 0,1,2,4`: runners/staleness.py), once per K as well, a finished
(cell, K, seed) run skipped. A cell's finished runs are those of its K (runs.staleness; without
the axis, the preset's K, 0), so on-policy and stale runs never stand in for each other.
With the verl trainer each cell is one `bench run --trainer verl` after another: verl takes
the whole cluster.

A cell passes only when every seed passes, so with seeds its first failing seed decides it
(`decide_early`, on by default): once a seed of a cell ends in a FAIL status (FAIL_STATUSES: a
finished run that did not converge; a crash, `failed`, decides nothing), the cell's seeds not
started yet are not started, and its running ones (subprocess cells, `jobs` > 1) are
interrupted; both are recorded as runs with status `skipped` and the reason. A finished failing
seed from an earlier sweep decides the cell the same way. The report then says "decided after
k of N seeds".

Progress: one line per training step and cell (`log`), from the trainer's progress callback
in process, or relayed from a subprocess cell's stderr, where `bench run --progress-lines`
prints each step as a `progress: ` line; and one line when a cell ends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from sqlalchemy import select

from bench.engines import resolve_engine
from bench.errors import ConfigError
from bench.fingerprint import fingerprint
from bench.precision import Precision
from bench.statuses import FAILED, FAILING, FINISHED, RUNNING, SKIPPED
from bench.store import Build, Run, session
from bench.store.schema import utcnow

from .runs import latest_build, resolve_inputs, start_run
from .presets import get_preset

# a seed ending so (a rule's FAIL) decides its cell; one undecided at its budget does not
FAIL_STATUSES = FAILING
PROGRESS_PREFIX = "progress: "     # a step line on a subprocess cell's stderr (`bench run --progress-lines`)


def step_line(step: int, total: int | None, m: dict) -> str:
    """One training step as text: the step, mean reward and KL k3 every step; split accuracy
    (and every benchmark) at the steps that evaluated. `m`: the native trainer's step metrics
    (`reward`, `kl_k3`, `eval/<name>`) or verl's (`critic/score/mean`)."""
    parts = [f"step {step}/{total}" if total else f"step {step}"]
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


def _relay(cmd: list[str], on_line, on_start=None) -> tuple[int, str, str]:
    """Run `cmd`; every `progress: ` line of its stderr goes to `on_line` as it arrives;
    `on_start(proc)` is called with the process once it runs (so it can be interrupted).
    Returns (exit code, stdout, the rest of stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    if on_start is not None:
        on_start(proc)
    stdout: list[str] = []
    reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)
    reader.start()
    rest = []
    for line in proc.stderr:
        if line.startswith(PROGRESS_PREFIX):
            on_line(line[len(PROGRESS_PREFIX):].rstrip())
        else:
            rest.append(line)
    code = proc.wait()
    reader.join()
    return code, "".join(stdout), "".join(rest)


def _finished_run(s, build_id: str, algo: str, p: Precision, trainer: str = "native",
                  seed: int | None = None, staleness: int = 0, engine: str | None = None,
                  config_fp: str | None = None) -> Run | None:
    """The newest finished run of the cell at staleness K (of the cell, K and `seed`, when given;
    the seed is the run's config["seed"], kept in runs.seed, K its config["staleness"], kept in
    runs.staleness). The cell is leaderboard/cells.py's: with `engine` (runs.engine) and
    `config_fp` (bench/fingerprint.py of runs.config) given, only a run of that engine and those
    settings counts, so another engine's or another learning rate's run never stands in."""
    q = select(Run).where(Run.build_id == build_id, Run.algo == algo, Run.rollout_dtype == p.rollout,
                          Run.train_dtype == p.train, Run.trainer == trainer, Run.status.in_(FINISHED),
                          Run.staleness == staleness)
    if seed is not None:
        q = q.where(Run.seed == seed)
    if engine is not None:
        q = q.where(Run.engine == engine)
    runs = s.scalars(q.order_by(Run.created_at.desc()))
    return next((r for r in runs if config_fp is None or fingerprint(r.config) == config_fp), None)


def run_engine(engine: str, trainer: str) -> str:
    """The engine a run of the sweep records (runs.engine): verl's rollouts are vLLM's; a native
    run resolves `auto` as `bench run` does (an unavailable vllm is the cell's own failure)."""
    if trainer == "verl":
        return "vllm"
    try:
        return resolve_engine(engine)
    except ValueError:
        return engine


def cell_fingerprint(preset: str, args: dict) -> str:
    """The settings fingerprint of the run config a cell of the sweep stores: the preset with the
    cell's overrides (its seed and K among them), as runs.config keeps it."""
    return fingerprint({"preset": preset, **asdict(get_preset(preset, **args))})


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


def _cell_runs(s, build_id: str, algo: str, p: Precision, seed: int | None, staleness: int, engine: str,
               config_fp: str, statuses: tuple[str, ...], since=None) -> list[Run]:
    """Native runs of the cell, seed and K in `statuses` (created at or after `since`), newest first."""
    q = select(Run).where(Run.build_id == build_id, Run.algo == algo, Run.rollout_dtype == p.rollout,
                          Run.train_dtype == p.train, Run.trainer == "native", Run.staleness == staleness,
                          Run.engine == engine, Run.status.in_(statuses))
    if seed is not None:
        q = q.where(Run.seed == seed)
    if since is not None:
        q = q.where(Run.created_at >= since)
    return [r for r in s.scalars(q.order_by(Run.created_at.desc())) if fingerprint(r.config) == config_fp]


def record_skipped(store, build_id: str, algo: str, p: Precision, config: dict, engine: str, reason: str,
                   run_id: str | None = None) -> str:
    """Mark run `run_id` (one interrupted because its cell was decided) skipped with `reason`, or,
    without it, add a run row of status `skipped` for a seed never started; returns its id."""
    with session(store) as s:
        if run_id is not None:
            run = s.get(Run, run_id)
            run.status, run.stop_reason = SKIPPED, reason
            return run_id
        rid = uuid.uuid4().hex[:12]
        s.add(Run(id=rid, model_id=s.get(Build, build_id).model_id, build_id=build_id, algo=algo,
                  rollout_dtype=p.rollout, train_dtype=p.train, trainer="native", engine=engine, config=config,
                  status=SKIPPED, stop_reason=reason))
        return rid


def _summary(s, run_id: str | None, algo: str, p: Precision, status: str | None = None,
             seed: int | None = None, staleness: int | None = None) -> dict:
    r = s.get(Run, run_id) if run_id else None
    return {"algo": algo, "precision": p.name, **({} if staleness is None else {"staleness": staleness}),
            **({} if seed is None else {"seed": seed}), "run": run_id,
            "status": status or (r.status if r else FAILED), "peak": r.peak_accuracy if r else None,
            "steps": r.step if r else 0}


def run_grid(store, db_url: str | None, algos: list[str], pairs: list[Precision], build_id: str | None,
             engine: str, preset: str, overrides: dict, jobs: int = 1, log=print,
             verl_args: list[str] | None = None, seeds: list[int] | None = None,
             ckpt_root=None, progress: bool = True, device: str = "cpu",
             staleness: list[int] | None = None, decide_early: bool = True) -> list[dict]:
    """Run the grid; `verl_args` (e.g. ["--verl-python", PY, "--gpus", "8"]) runs every cell
    with the verl trainer, one at a time. `seeds` runs every cell once per seed (the run
    config's `seed`), skipping the (cell, seed) pairs that already finished; without it a cell
    is run once with the preset's seed and skipped when any of its runs finished. `progress`:
    `log` one line per step of every cell (`<algo> <precision>[ seed N] step …`) and one
    when it ends. `device`: where native cells train (bench/device.py). `staleness`: run every
    cell (and seed) once per K, skipping the finished (cell, K, seed) runs; without it every cell
    runs at the K of the overrides or the preset, and only its runs at that K count as finished.
    `decide_early` (with seeds, native): a cell's first failing seed decides it (module doc)."""
    from .verl_runner import check_algorithm, check_router_replay, check_staleness

    trainer = "native" if verl_args is None else "verl"
    if verl_args is not None:
        jobs = 1
    with session(store) as s:
        build, _, _ = resolve_inputs(s, build_id, None) if build_id else (latest_build(s), None, None)
        if build is None:
            raise ConfigError("no build yet: make one with `bench build --model tiny-math`")
        build_id = build.id
    if seeds is not None and "seed" in overrides:
        raise ConfigError("give either a seed or seeds, not both")
    if staleness is not None and "staleness" in overrides:
        raise ConfigError("give either a staleness or a staleness axis, not both")
    default_k = overrides["staleness"] if "staleness" in overrides else get_preset(preset).staleness
    for k in staleness or [default_k]:
        if verl_args is not None:
            check_staleness(k)
    if verl_args is not None:
        check_router_replay(bool(overrides.get("router_replay")))
        for a in algos:
            check_algorithm(a)
    cells = [(a, p, k, seed) for a in algos for p in pairs for k in (staleness or [None]) for seed in (seeds or [None])]

    def where(k, seed) -> str:
        return ("" if k is None else f" K={k}") + ("" if seed is None else f" seed {seed}")

    def cell_args(k, seed) -> dict:
        return {**overrides, **({} if seed is None else {"seed": seed}), **({} if k is None else {"staleness": k})}

    todo, results = [], {}
    recorded_engine = run_engine(engine, trainer)
    decide = decide_early and seeds is not None and trainer == "native"
    decided: dict[tuple, str] = {}       # (algo, precision, K) → why the cell is decided
    with session(store) as s:
        for a, p, k, seed in cells:
            done = _finished_run(s, build_id, a, p, trainer, seed, default_k if k is None else k, recorded_engine,
                                 cell_fingerprint(preset, cell_args(k, seed)))
            if done:
                log(f"skip {a} {p.name}{where(k, seed)}: finished as run {done.id} ({done.status})")
                results[(a, p, k, seed)] = _summary(s, done.id, a, p, f"{done.status} (earlier)", seed, k)
                if decide and done.status in FAIL_STATUSES:
                    decided.setdefault((a, p, k), f"seed {seed} ended {done.status} (run {done.id})")
            else:
                todo.append((a, p, k, seed))
    lock = threading.Lock()
    running: dict[tuple, list] = {}      # (algo, precision, K) → the subprocesses of its running seeds

    def skip_reason(why: str, at: int | None = None) -> str:
        start = "not run" if at is None else f"interrupted at step {at}"
        return f"{start}: the cell was decided when {why} (a cell passes only when every seed passes)"

    def skip(cell, why: str) -> str:
        a, p, k, seed = cell
        cfg_fp = cell_fingerprint(preset, cell_args(k, seed))
        with session(store) as s:
            kk = default_k if k is None else k
            earlier = _cell_runs(s, build_id, a, p, seed, kk, recorded_engine, cfg_fp, (SKIPPED,))
        if earlier:
            return earlier[0].id
        config = {"preset": preset, **asdict(get_preset(preset, **cell_args(k, seed)))}
        log(f"skip {a} {p.name}{where(k, seed)}: cell decided ({why})")
        return record_skipped(store, build_id, a, p, config, recorded_engine, skip_reason(why))

    def after(cell, rid: str | None, since) -> str | None:
        """Decide the cell on a failing seed (interrupting its running seeds); mark this seed
        skipped when it was interrupted for another seed's failure."""
        a, p, k, seed = cell
        key = (a, p, k)
        with session(store) as s:
            r = s.get(Run, rid) if rid else None
            status = r.status if r else None
        with lock:
            why = decided.get(key)
            if why is None and status in FAIL_STATUSES:
                decided[key] = f"seed {seed} ended {status} (run {rid})"
                for proc in running.get(key, []):
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGINT)     # the run records itself failed, then is marked skipped
                return rid
        if why is None or status in FINISHED:
            return rid
        with session(store) as s:     # interrupted (or crashed while the cell was being decided)
            kk = default_k if k is None else k
            fp = cell_fingerprint(preset, cell_args(k, seed))
            mine = _cell_runs(s, build_id, a, p, seed, kk, recorded_engine, fp, (*FINISHED, FAILED, RUNNING), since)
            mine_id, mine_status, at = (mine[0].id, mine[0].status, mine[0].step) if mine else (None, None, None)
        if mine_status in FINISHED:   # it ended before the interruption reached it (its output was cut)
            return mine_id
        if mine_id is not None:
            return record_skipped(store, build_id, a, p, {}, recorded_engine, skip_reason(why, at), mine_id)
        return skip(cell, why)

    def one(cell) -> str | None:
        a, p, k, seed = cell
        at = where(k, seed)
        if decide:
            with lock:
                why = decided.get((a, p, k))
            if why is not None:
                return skip(cell, why)
        log(f"run {a} {p.name}{at} on build {build_id}")
        since = utcnow()
        rid = _one(cell)
        if decide:
            rid = after(cell, rid, since)
        if progress and rid is not None:
            with session(store) as s:
                log(f"  {a} {p.name}{at}: {_ended_line(s, rid)}")
        return rid

    def _one(cell) -> str | None:
        a, p, k, seed = cell
        key = (a, p, k)
        at = where(k, seed)
        args = cell_args(k, seed)
        label = f"{a} {p.name}{at}"
        if jobs == 1 and verl_args is None:
            cfg = get_preset(preset, **args)
            cb = (lambda step, total, m: log(f"  {label} {step_line(step, total, m)}")) if progress else None
            try:
                return start_run(store, a, p, cfg, build_id=build_id, engine=engine, preset=preset,
                                 ckpt_root=ckpt_root, progress=cb, device=device)
            except Exception as e:  # the failed run is recorded in the store; go on with the grid
                log(f"  {label} failed: {e}")
                return None
        cmd = [sys.executable, "-m", "bench.cli", "run", "--algo", a, "--dtype", p.spec, "--build", build_id,
               "--engine", engine, "--preset", preset, "--json"]
        if verl_args is not None:
            cmd += ["--trainer", "verl", *verl_args]
        else:
            cmd += ["--device", device]
        for k, v in args.items():
            flag = k.replace('_', '-')
            cmd += [f"--{flag}" if v else f"--no-{flag}"] if isinstance(v, bool) else [f"--{flag}", str(v)]
        if ckpt_root is not None:
            cmd += ["--checkpoint-dir", str(ckpt_root)]
        if db_url:
            cmd += ["--db", db_url]
        if progress:
            cmd += ["--progress-lines"]
        def started(proc):
            with lock:
                running.setdefault(key, []).append(proc)
                cancel = decide and key in decided
            if cancel:                    # decided while this one was being launched
                proc.send_signal(signal.SIGINT)

        code, stdout, stderr = _relay(cmd, lambda line: log(f"  {label} {line}"), on_start=started)
        with lock:
            running[key] = [x for x in running.get(key, []) if x.args is not cmd]
        if code != 0:
            with lock:
                why = decided.get(key) if decide else None
            if why is not None:            # interrupted by us: `after` records it skipped (or finished)
                log(f"  {label} interrupted: the cell was decided when {why}")
                return None
            err = stderr[stderr.rfind("error:"):] if "error:" in stderr else stderr.strip()[-500:]
            log(f"  {label} failed: {' '.join(err.split()) or code}")
            return None
        return json.loads(stdout)["id"]

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        ids = list(pool.map(one, todo))
    with session(store) as s:
        for (a, p, k, seed), rid in zip(todo, ids):
            results[(a, p, k, seed)] = _summary(s, rid, a, p, seed=seed, staleness=k)
    return [results[c] for c in cells]
