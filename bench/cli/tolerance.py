"""`bench tolerance`: the coarsest rung of the precision ladder at which an algorithm still PASSes
(runners/tolerance.py), each cell a stored run of `bench sweep`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bench.cli import DB_OPT, _store, app, out
from bench.cli.options import ENGINE_OPT, Engine, Preset, knob_options
from bench.cli.run import (_BENCHMARK, _BUILD, _CHECKPOINT_DIR, _DEVICE, _PRESET, _RUN_PANEL, _check_algo,
                           _check_thresholds, _run_config)
from bench.cli.run_common import _chosen_preset, _log, _preset_values
from runners.presets import RunConfig


@app.command()
@knob_options(RunConfig, defaults=_preset_values(), panel=_RUN_PANEL)
def tolerance(algo: str = typer.Option(..., help="The algorithm (`bench run --algo list`)."),
              rungs: str = typer.Option("ladder", help="The rungs, finest first: `ladder` (fp32, e5m10 … e5m8, "
                                        "e8m7 … e8m1) or a comma-separated list of them."),
              seeds: str = typer.Option("3", help="Seeds: N for 0..N-1, or a list; the first bisects, every one runs "
                                        "at the two rungs that bracket the answer."),
              extend_to: Optional[int] = typer.Option(None, min=1, help="Extend a cell that ends UNDECIDED "
                                                      "(max_steps) to this many steps (`bench runs extend`)."),
              build_id: Optional[str] = _BUILD,
              engine: Engine = ENGINE_OPT,
              preset: Optional[Preset] = _PRESET,
              benchmark: Optional[str] = _BENCHMARK,
              device: Optional[str] = _DEVICE,
              checkpoint_dir: Optional[Path] = _CHECKPOINT_DIR,
              as_json: bool = typer.Option(False, "--json", help="The search as JSON on stdout."),
              db: Optional[str] = DB_OPT, knobs: dict = None):
    """How much mismatch the algorithm survives: bisect the precision ladder (rollouts at each rung,
    fp32 training) with one seed, then run every seed at the two rungs that bracket the answer."""
    import json
    from dataclasses import asdict

    from bench import formats
    from bench.device import resolve_device
    from bench.errors import ConfigError
    from runners.sweep import parse_seeds
    from runners.tolerance import run_tolerance

    _check_algo(algo)
    cfg = _run_config(preset or Preset.tiny, benchmark, knobs)
    _check_thresholds([algo], knobs)
    ladder = list(formats.LADDER) if rungs.strip() == "ladder" else [formats.canonical(r) for r in rungs.split(",")
                                                                       if r.strip()]
    bad = [r for r in ladder if r != "fp32" and formats.get(r).rung is None]
    if bad or len(set(ladder)) != len(ladder) or not ladder:
        raise ConfigError(f"--rungs takes ladder rungs (fp32, e5m10 … e5m8, e8m7 … e8m1), each once; got {rungs!r}")
    seed_list = parse_seeds(seeds)
    if knobs.get("seed") is not None:
        raise ConfigError("give --seeds, not --seed: the search runs every seed it needs")
    if extend_to is not None and extend_to <= cfg.max_steps:
        raise ConfigError(f"--extend-to {extend_to} is not above the budget max_steps={cfg.max_steps}")
    device = resolve_device(device)
    store = _store(db)
    preset = _chosen_preset(preset, store, build_id, None, device, "native")
    overrides = {k: v for k, v in {"benchmark": benchmark, **knobs}.items() if v is not None}
    found = run_tolerance(store, algo, ladder, seed_list, build_id, engine.value, preset.value, overrides, extend_to,
                          log=_log, device=device, ckpt_root=checkpoint_dir)
    if as_json:
        out.print_json(json.dumps({"algo": algo, "tolerance": found.tolerance, "rungs": found.rungs,
                                   "seeds": found.seeds, "bracket": [found.tolerance, None if found.hi is None
                                                                     else found.rungs[found.hi]],
                                   "probes": [asdict(p) for p in found.probes]}))
        return
    _print_search(algo, found, store)


def _print_search(algo: str, found, store) -> None:
    from rich.table import Table
    from sqlalchemy import select

    from bench.store import Run, session

    ids = [p.run for p in found.probes if p.run]
    with session(store) as s:
        cal = {r.id: r.calibration or {} for r in s.scalars(select(Run).where(Run.id.in_(ids)))}
    t = Table("rung", "seeds", "step-0 k3", "step-0 mean |Δ log p|", "runs",
              title=f"{algo}: the precision ladder (rollout → fp32 training)")
    for rung in found.rungs:
        got = found.at(rung)
        if not got:
            continue
        k3 = [cal.get(p.run, {}).get("k3") for p in got]
        mean = [cal.get(p.run, {}).get("abs_logp_diff_mean") for p in got]
        avg = lambda xs: "-" if not [x for x in xs if x is not None] else (                    # noqa: E731
            f"{sum(x for x in xs if x is not None) / len([x for x in xs if x is not None]):.3g}")
        t.add_row(rung, ", ".join(f"{p.seed}: {p.verdict}" for p in got) + f" ({found.count(rung)})", avg(k3),
                  avg(mean), " ".join(p.run or "-" for p in got))
    out.print(t)
    if found.tolerance is None:
        out.print(f"{algo} does not PASS on every seed at any rung, fp32 included: no tolerance.")
    else:
        above = "" if found.hi is None else f"; at {found.rungs[found.hi]}: {found.count(found.rungs[found.hi])}"
        out.print(f"{algo} tolerates {found.tolerance} ({found.count(found.tolerance)}){above}.")
