"""verl's pre-flight and launch, for `bench run --trainer verl`, the sweep and Python callers alike:
what verl 0.9.1 cannot run is refused by `runners.plan.plan_run` before anything is written
(`check_verl_cell`, re-exported here), then the interpreter is checked, the run's directory
prepared and verl's own `validate_config` run on the command (`prepare_verl_run`), and
`run_verl_plan` (which `runners.runs.run_plan` calls for a verl plan) launches it through
runners/verl_follow.py, which follows it to its end."""

from __future__ import annotations

import shutil
import uuid

from bench.precision import Precision
from bench.store import bench_home, session

from .plan import RunPlan, check_preset_fits, resolve_inputs
from .presets import RunConfig
from .verl_follow import VerlLaunch, prepare, start_verl_run
from .verl_runner import (VerlError, VerlTarget, check_verl_cell, check_verl_version, installed_verl_version,
                          missing_launch_modules, validate_cells)

__all__ = ["VerlTarget", "check_verl_cell", "prepare_verl_run", "run_verl_plan"]


def prepare_verl_run(store, algo: str, precision: Precision, cfg: RunConfig, build_id: str | None,
                     model: str | None, target: VerlTarget, dry_run: bool = False,
                     preset: str = "paper") -> tuple[VerlLaunch, str | None]:
    """The launch of one verl run, checked: verl 0.9.1 importable by `target.python` with what
    main_ppo needs to train (a dry run without verl skips both), the split and reward module
    exported to the run's directory ($BENCH_HOME/verl/<run id>; a dry run's is shared per cell),
    and verl's `validate_config` passed on the command (a refused command leaves no directory).
    Returns (the job runners/verl_follow.py launches, the verl version that validated it: None
    for a dry run without verl). The tiny preset is refused for a model other than the embedded
    ones, as for the native trainer (runners/plan.py `check_preset_fits`)."""
    with session(store) as s:
        check_preset_fits(preset, resolve_inputs(s, build_id, model)[2])
    version = installed_verl_version(target.python)
    if version is not None or not dry_run:
        check_verl_version(version)
    if not dry_run:
        missing = missing_launch_modules(target.python)
        if missing:
            raise VerlError(f"{target.python} has verl but not {' or '.join(missing)}, which main_ppo needs to "
                            "train: pip install 'verl[vllm]==0.9.1' there (a GPU machine); --dry-run works without")
    p = precision
    root = bench_home() / "verl" / (f"dry-run/{algo}-{p.rollout}-{p.train}" if dry_run else uuid.uuid4().hex[:12])
    job = prepare(store, algo, precision, cfg, build_id, model, target, root=root)
    if version is not None:
        (error,) = validate_cells(target.python, [job.argv[3:]])
        if error:
            if not dry_run:
                shutil.rmtree(root, ignore_errors=True)         # nothing half-written
            raise VerlError(f"verl's validate_config rejects this cell: {error}")
    return job, version


def run_verl_plan(store, plan: RunPlan, progress=None, log=None) -> str:
    """Launch the planned verl run (`prepare_verl_run`: verl's own checks, the run's directory) and
    follow it to its end; the run id. `log` hears that verl validated the command and where its
    log is."""
    job, version = prepare_verl_run(store, plan.algo, plan.precision, plan.cfg, plan.build_id, None, plan.verl,
                                    preset=plan.preset)
    if log:
        log(f"verl {version}: validate_config passed; verl log: {job.root}/verl.log")
    return start_verl_run(store, plan.algo, plan.precision, plan.cfg, plan.preset, job, progress=progress)
