"""`bench compare A B`: two cells compared with AdaStop over seeds run in batches (runners/compare.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from bench.cli import DB_OPT, _store, app, out
from bench.cli.options import DEVICE_METAVAR, ENGINE_OPT, Engine, Preset, knob_options, parse_device
from bench.cli.run import _BUILD, _CHECKPOINT_DIR, _RUN_PANEL, _run_config
from bench.cli.run_common import _log, _preset_values
from runners.presets import RunConfig


@app.command()
@knob_options(RunConfig, defaults=_preset_values(), panel=_RUN_PANEL, exclude=("seed",))
def compare(cell_a: str = typer.Argument(..., metavar="A", help="A cell as ALGO:DTYPE, e.g. pg-seq-is:fp16."),
            cell_b: str = typer.Argument(..., metavar="B", help="The other cell, e.g. pg-seq-is:bf16."),
            metric: str = typer.Option("peak", help="Each seed's score: peak (peak split accuracy) or steps-to-pass "
                                       "(steps to converged; a seed that did not pass scores its max_steps)."),
            max_seeds: int = typer.Option(10, help="Seeds per cell at most (batch × batches)."),
            batch: int = typer.Option(5, help="Seeds per cell run between two looks of the test."),
            level: float = typer.Option(0.05, help="AdaStop's level α: the chance of declaring a difference that "
                                        "is not there, at most."),
            build_id: Optional[str] = _BUILD,
            engine: Engine = ENGINE_OPT,
            preset: Preset = typer.Option(Preset.tiny, help="The run settings every option below starts from."),
            benchmark: Optional[str] = typer.Option(None, help="Problem source of the preset's benchmark."),
            jobs: int = typer.Option(1, min=1, help="Seeds run in parallel processes."),
            device: str = typer.Option("auto", parser=parse_device, metavar=DEVICE_METAVAR,
                                       help="Where the runs train: auto (cuda when available), cpu, cuda, cuda:i."),
            checkpoint_dir: Optional[Path] = _CHECKPOINT_DIR,
            as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
            db: Optional[str] = DB_OPT, knobs: dict = None):
    """Is A better than B? Run seeds 0, 1, ... of both cells in batches (finished runs are reused)
    and stop as soon as AdaStop's group-sequential permutation test decides at the stated level,
    or at --max-seeds: prints the decision, the seeds used and the level."""
    from bench.device import resolve_device
    from bench.errors import ConfigError
    from runners.compare import METRICS, parse_cell, run_comparison

    if metric not in METRICS:
        raise ConfigError(f"--metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if batch < 1 or max_seeds < batch:
        raise ConfigError(f"--max-seeds ({max_seeds}) must be at least --batch ({batch}), and --batch >= 1")
    if not 0 < level < 1:
        raise ConfigError(f"--level must be in (0, 1), got {level!r}")
    cells = [parse_cell(cell_a), parse_cell(cell_b)]
    _run_config(preset, benchmark, knobs)
    device = resolve_device(device)
    store = _store(db)
    overrides = {k: v for k, v in {"benchmark": benchmark, **knobs}.items() if v is not None}
    result = run_comparison(store, cells, metric, max_seeds, batch, level, build_id, engine.value, preset.value,
                            overrides, jobs, log=_log, device=device, ckpt_root=checkpoint_dir)
    if as_json:
        out.print_json(json.dumps(result))
        return
    a, b = result["cells"]
    out.print(f"{result['in_words']} (AdaStop: {result['decision']}) at level {level:g}, after "
              f"{result['seeds_used']} seeds of each cell ({result['batches']} of {max_seeds // batch} batches of "
              f"{batch}); mean {metric}: {a} {result['means'][a]:.4g}, {b} {result['means'][b]:.4g}", highlight=False)
