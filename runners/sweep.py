"""The algorithm × precision grid on one build: cells run one after another (or in `jobs`
processes); a cell that already finished on that build with the same trainer is skipped.
With the verl trainer each cell is one `bench run --trainer verl` after another: verl takes
the whole cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import select

from bench.precision import Precision
from bench.store import Run, session

from .trainer import latest_build, resolve_inputs, start_run
from .presets import get_preset

FINISHED = ("converged", "plateaued", "collapsed", "diverged", "max_steps")


def _finished_run(s, build_id: str, algo: str, p: Precision, trainer: str = "native") -> Run | None:
    return s.scalars(select(Run).where(Run.build_id == build_id, Run.algo == algo, Run.rollout_dtype == p.rollout,
                                       Run.train_dtype == p.train, Run.trainer == trainer, Run.status.in_(FINISHED))
                     .order_by(Run.created_at.desc())).first()


def _summary(s, run_id: str | None, algo: str, p: Precision, status: str | None = None) -> dict:
    r = s.get(Run, run_id) if run_id else None
    return {"algo": algo, "precision": p.name, "run": run_id, "status": status or (r.status if r else "failed"),
            "peak": r.peak_accuracy if r else None, "steps": r.step if r else 0}


def run_grid(store, db_url: str | None, algos: list[str], pairs: list[Precision], build_id: str | None,
             engine: str, preset: str, overrides: dict, jobs: int = 1, log=print,
             verl_args: list[str] | None = None) -> list[dict]:
    """Run the grid; `verl_args` (e.g. ["--verl-python", PY, "--gpus", "8"]) runs every cell
    with the verl trainer, one at a time."""
    trainer = "native" if verl_args is None else "verl"
    if verl_args is not None:
        jobs = 1
    with session(store) as s:
        build, _, _ = resolve_inputs(s, build_id, None) if build_id else (latest_build(s), None, None)
        if build is None:
            raise ValueError("no build yet: make one with `bench build --model tiny-math`")
        build_id = build.id
    cells = [(a, p) for a in algos for p in pairs]
    todo, results = [], {}
    with session(store) as s:
        for a, p in cells:
            done = _finished_run(s, build_id, a, p, trainer)
            if done:
                log(f"skip {a} {p.name}: finished as run {done.id} ({done.status})")
                results[(a, p)] = _summary(s, done.id, a, p, f"{done.status} (earlier)")
            else:
                todo.append((a, p))

    def one(cell) -> str | None:
        a, p = cell
        log(f"run {a} {p.name} on build {build_id}")
        if jobs == 1 and verl_args is None:
            cfg = get_preset(preset, **overrides)
            try:
                return start_run(store, a, p, cfg, build_id=build_id, engine=engine, preset=preset)
            except Exception as e:  # the failed run is recorded in the store; go on with the grid
                log(f"  {a} {p.name} failed: {e}")
                return None
        cmd = [sys.executable, "-m", "bench.cli", "run", "--algo", a, "--dtype", p.name, "--build", build_id,
               "--engine", engine, "--preset", preset, "--json"]
        if verl_args is not None:
            cmd += ["--trainer", "verl", *verl_args]
        for k, v in overrides.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        if db_url:
            cmd += ["--db", db_url]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            err = r.stderr[r.stderr.rfind("error:"):] if "error:" in r.stderr else r.stderr.strip()[-500:]
            log(f"  {a} {p.name} failed: {' '.join(err.split()) or r.returncode}")
            return None
        return json.loads(r.stdout)["id"]

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        ids = list(pool.map(one, todo))
    with session(store) as s:
        for (a, p), rid in zip(todo, ids):
            results[(a, p)] = _summary(s, rid, a, p)
    return [results[c] for c in cells]
