"""What `bench run`, its verl form, `bench sweep`, `bench tolerance` and `bench compare` share: the
progress bar of a run, the line or JSON a run or a grid ends with, the preset a build's model takes,
and a seeded run as a one-cell sweep."""

from __future__ import annotations

import contextlib
import json
from typing import Optional

import typer
from rich.table import Table

from bench import statuses
from bench.cli import _progress, _store, console, fail, out
from bench.cli.options import Preset


# the ends a command reports with exit 1: an error or Ctrl-C, and the calibration gate's plumbing fault
_EXIT_1 = (statuses.FAILED, statuses.MISCALIBRATED)


# what a run's progress line shows of its step metrics, where present: (label, key, format)
_PROGRESS_FIELDS = (("gate k3", "gate/k3", ".1e"), ("reward", "reward", ".2f"), ("split", "eval/split", ".2f"),
                    ("kl", "kl_k1", ".1e"))


def _run_progress(prog, task):
    def cb(step, total, m):
        parts = [f"{name} {m[key]:{fmt}}" for name, key, fmt in _PROGRESS_FIELDS if m.get(key) is not None]
        prog.update(task, completed=step, total=total, rate=" ".join(parts))
    return cb


@contextlib.contextmanager
def _step_progress(bar_callback):
    """The step callback for a run: a progress bar updated by `bar_callback(prog, task)`."""
    with _progress("steps") as prog:
        yield bar_callback(prog, prog.add_task("steps", total=None, rate=""))


def _print_run_end(run_id: str, store, as_json: bool = False) -> None:
    """The ended run as JSON, or its summary line (exit 1 when it failed: a verl run that
    failed returns here rather than raising)."""
    if as_json:
        from bench.cli.runs import _run_info

        out.print_json(json.dumps(_run_info(store, run_id), default=str))
        return
    from rich.markup import escape

    from bench.store import Run, session

    with session(store) as s:
        r = s.get(Run, run_id)
        peak = "-" if r.peak_accuracy is None else f"{r.peak_accuracy:.3f}"
        via = " (verl)" if r.trainer == "verl" else ""
        out.print(f"run [bold]{r.id}[/]{via} {r.algo} {r.rollout_dtype}/{r.train_dtype}: {r.status} after {r.step} "
                  f"steps ({r.wall_s:.0f}s); peak split accuracy {peak}; {escape(r.stop_reason or '')}",
                  highlight=False)
    if r.status in _EXIT_1:
        raise typer.Exit(1)


def _preset_values() -> dict[str, dict]:
    """{preset: its knobs}: the defaults each generated option's help names."""
    from runners.presets import PRESETS, preset_knobs

    return {name: preset_knobs(name) for name in PRESETS}


def _chosen_preset(preset: Optional[Preset], store, build_id, model, device: str, trainer: str) -> Preset:
    """The preset given, else the one the build's model takes on this device (runners/plan.py
    `preset_for`: verl runs on GPUs); the knobs' own bounds were checked before the store is read."""
    if preset is not None:
        return preset
    from runners.plan import default_preset

    return Preset(default_preset(store, build_id, model, "cuda" if trainer == "verl" else device))


def _seed_list(seeds: str, overrides: dict) -> list[int]:
    from runners.sweep import parse_seeds

    if overrides.get("seed") is not None:
        fail("give --seed or --seeds, not both")
    return parse_seeds(seeds)


def _seeded_run(algo, dtype, build_id, model, engine, preset, overrides, seeds, checkpoint_dir, as_json, db,
                device: str = "cpu", decide_early: bool = True, verl=None) -> None:
    """`bench run --seeds`: the one cell once per seed, as a one-cell sweep (on verl: `verl`, its target)."""
    from bench.precision import Precision
    from runners.sweep import run_grid
    from runners.plan import resolve_inputs

    if not algo:
        fail("give --algo (see `bench run --algo list`)")
    seed_list = _seed_list(seeds, overrides)
    store = _store(db)
    preset = _chosen_preset(preset, store, build_id, model, device, "native" if verl is None else "verl").value
    pairs = [Precision.parse(dtype)]
    if model and not build_id:
        from bench.store import session

        with session(store) as s:
            build_id = resolve_inputs(s, None, model)[0].id
    results = run_grid(store, [algo], pairs, build_id, engine, preset,
                       {k: v for k, v in overrides.items() if v is not None}, 1,
                       log=_log, seeds=seed_list, verl=verl,
                       ckpt_root=checkpoint_dir, device=device, decide_early=decide_early)
    _print_grid(results, as_json)


def _log(msg: str) -> None:
    """A sweep's log line on stderr, never wrapped (a step line is longer than 80 columns)."""
    console.print(msg, highlight=False, markup=False, soft_wrap=True)


def _print_grid(results: list[dict], as_json: bool = False) -> None:
    """The grid's table (a seed column when seeded) or its JSON; exit 1 when a cell failed."""
    if as_json:
        out.print_json(json.dumps(results, default=str))
    else:
        seeded = any("seed" in r for r in results)
        stale = any("staleness" in r for r in results)
        t = Table("algo", "precision", *(["K"] if stale else []), *(["seed"] if seeded else []), "status", "peak",
                  "steps", "run")
        for r in results:
            t.add_row(r["algo"], r["precision"], *([str(r.get("staleness", "-"))] if stale else []),
                      *([str(r.get("seed", "-"))] if seeded else []), r["status"],
                      f"{r['peak']:.3f}" if r["peak"] is not None else "-", str(r["steps"]), r["run"] or "-")
        out.print(t)
    if any(r["status"] in _EXIT_1 for r in results):
        raise typer.Exit(1)
