"""verl's pre-flight, for `bench run --trainer verl`, the sweep and Python callers alike: what
verl 0.9.1 cannot run is refused before anything is written (`check_verl_cell`), then the
interpreter is checked, the run's directory prepared and verl's own `validate_config` run on
the command (`prepare_verl_run`). runners/verl_follow.py then launches and follows it."""

from __future__ import annotations

import shutil
import uuid

from bench.precision import Precision
from bench.store import bench_home, session

from .plan import check_preset_fits, resolve_inputs
from .presets import RunConfig
from .verl_follow import VerlLaunch, prepare
from .verl_runner import (VerlError, VerlTarget, check_algorithm, check_overrides, check_router_replay,
                          check_staleness, check_verl_version, installed_verl_version, missing_launch_modules,
                          validate_cells)


def check_verl_cell(algo: str, cfg: RunConfig) -> None:
    """Refuse what verl 0.9.1 cannot run to its end: pg-seq-mis, a staleness K > 0, router
    replay (runners/verl_runner.py says why for each); and a --verl-override of a key the cell sets."""
    check_algorithm(algo)
    check_staleness(cfg.staleness)
    check_router_replay(cfg.router_replay)
    check_overrides(algo, cfg)


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
