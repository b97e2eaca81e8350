"""`bench run` (native and verl, --resume), `bench runs extend` and `bench sweep`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from bench.cli import DB_OPT, _store, app, console, fail, out, runs_app
from bench.cli.options import DEVICE_METAVAR, ENGINE_OPT, Engine, Preset, Trainer, knob_options, parse_device
from bench.cli.run_common import (_chosen_preset, _log, _preset_values, _print_grid, _print_run_end, _run_progress,
                                  _seed_list, _seeded_run, _step_progress)
from runners.presets import RunConfig


# ------------------------------------------------------------------ run / sweep


def _not_runnable(trainer: str, engine: str) -> dict[str, str]:
    """{algorithm: why} of those the trainer and rollout engine cannot run: verl's refusals
    (runners/verl_runner.py NOT_ON_VERL), or on another engine than the built-in one those that read
    μ's whole distribution (Score Centering)."""
    if trainer == "verl":
        from runners.verl_runner import NOT_ON_VERL

        return NOT_ON_VERL
    from bench.algorithms import SPECS
    from bench.engines import resolve_engine

    if resolve_engine(engine) == "torch":
        return {}
    return {a: "it reads μ's whole distribution, which only the built-in engine records (--engine torch)"
            for a, spec in SPECS.items() if spec.needs_distribution}


def _run_config(preset: Preset, benchmark: Optional[str], knobs: dict):
    """The preset with the given knobs (None: not given, the preset's value stays), every knob
    checked against its bounds: a ConfigError (exit 2) before anything is written."""
    from runners.presets import get_preset

    return get_preset(preset.value, benchmark=benchmark, **knobs)


def _list_algorithms(specs) -> None:
    """`bench run --algo list`: each algorithm with what its correction is (bench/algorithms.py) and
    its thresholds at their defaults (the options that set them)."""
    from bench.algorithms import AlgoConfig

    defaults = AlgoConfig()
    t = Table("algorithm", "anchor", "unit", "kind", "thresholds", "what it is", box=None, pad_edge=False)
    for spec in specs:
        knobs = ", ".join(f"{k}={getattr(defaults, k):g}" for k in spec.thresholds) or "-"
        t.add_row(spec.name, spec.anchor, spec.unit, spec.kind, knobs, spec.description)
    out.print(t)


def _check_thresholds(algos: list[str], knobs: dict) -> None:
    """Refuse a correction's threshold given for an algorithm that does not read it: its value would
    split that algorithm's cell (the settings fingerprint) without changing its arithmetic."""
    from bench.algorithms import ALGO_KNOBS, SPECS
    from bench.errors import ConfigError
    from bench.knobs import flag_of

    for name, value in knobs.items():
        if value is None or name not in ALGO_KNOBS:
            continue
        readers = [a for a, spec in SPECS.items() if name in spec.thresholds]
        idle = [a for a in algos if a not in readers]
        if idle:
            raise ConfigError(f"--{flag_of(name)} is a threshold of {', '.join(readers)}; "
                              f"{', '.join(idle)} do{'es' if len(idle) == 1 else ''} not read it (it would only make "
                              f"a cell of its own): sweep {', '.join(readers)} with it apart")


def _check_algo(algo: Optional[str]) -> None:
    if algo:
        from runners.algos import check_algo

        check_algo(algo)


_RUN_PANEL = "Run settings (RunConfig; default: the preset's)"

# the options `bench run` and `bench sweep` share, declared once
_BUILD = typer.Option(None, "--build", help="Build id (default: the latest complete build).")
_TRAINER = typer.Option(Trainer.native, help="native (one process a run), or verl (launch verl 0.9.1's main_ppo, "
                        "follow its metrics, stop it by bench's rules; a sweep's cells one after another).")
_VERL_PYTHON = typer.Option("python", help="With --trainer verl: the interpreter of the environment that has verl.")
_VERL_OVERRIDE = typer.Option(
    None, "--verl-override", metavar="KEY=VALUE", help="With --trainer verl: one of verl's own Hydra overrides "
    "(repeat it), passed to main_ppo after bench's: e.g. actor_rollout_ref.rollout.tensor_model_parallel_size=2. "
    "One of bench's defaults (data.max_prompt_length, the micro-batch sizes) is replaced; a key the cell sets "
    "(--algo, --dtype, --lr, ...) is refused. Parallel sizes, micro-batches and memory shares are resources; any "
    "other key is part of the cell (docs/verl.md).", show_default=False)
_GPUS = typer.Option(1, min=1, help="With --trainer verl: GPUs per node.")
_NODES = typer.Option(1, min=1, help="With --trainer verl: nodes.")
_PRESET = typer.Option(None, help="The run settings every option below starts from: tiny (the embedded "
                       "tiny-math models; refused for any other), small (a small real model on a CPU: smollm2-135m, "
                       "gemma3-270m), paper (the paper's recipe, for a GPU). Default: by the build's model and the "
                       "device, tiny for tiny-math, small for another model on a CPU, paper on a GPU (or verl).",
                       show_default=False)
_BENCHMARK = typer.Option(None, help="Problem source in place of the preset's benchmark (paper: the packaged "
                          "AIME24, offline): a .jsonl such as the paper's aime24.jsonl, a packaged name or a hub id.")
_SEEDS = typer.Option(None, help="Run each cell once per seed: N for seeds 0..N-1, or a list such as 0,3,5; "
                      "finished (cell, seed) pairs are skipped. A cell's first failing seed decides it: its other "
                      "seeds are not started, or are interrupted, and recorded skipped.")
_ALL_SEEDS = typer.Option(False, "--all-seeds", help="With --seeds: run every seed, even once a failing seed has "
                          "decided its cell.")
_DEVICE = typer.Option(None, parser=parse_device, metavar=DEVICE_METAVAR, help="Where the native trainer and the "
                       "built-in engine run: auto (cuda when available; the default), cpu, cuda, cuda:i; a resumed "
                       "run defaults to the device it started on.")
_CHECKPOINT_DIR = typer.Option(None, help="Default $BENCH_HOME/runs/<run id>.")


@app.command()
@knob_options(RunConfig, defaults=_preset_values(), panel=_RUN_PANEL, before="checkpoint_dir")
def run(algo: Optional[str] = typer.Option(None, help="Algorithm (`--algo list` shows them)."),
        dtype: str = typer.Option("fp32", help="Precision: fp32 | bf16 | bf16+head32 | fp16 | fp8 (both engines) or "
                                               "rollout=X,train=Y (rollout may also be int8, nvfp4 or mxfp4, "
                                               "rollout-only formats)."),
        build_id: Optional[str] = _BUILD,
        model: Optional[str] = typer.Option(None, help="Only builds of this model (and check the build's model)."),
        engine: Engine = ENGINE_OPT,
        trainer: Trainer = _TRAINER,
        gpus: int = _GPUS,
        nodes: int = _NODES,
        dry_run: bool = typer.Option(False, help="With --trainer verl: export the split and reward module, "
                                     "print the command, launch nothing."),
        verl_python: str = _VERL_PYTHON,
        verl_override: Optional[list[str]] = _VERL_OVERRIDE,
        preset: Preset = _PRESET,
        benchmark: Optional[str] = _BENCHMARK,
        seeds: Optional[str] = _SEEDS,
        all_seeds: bool = _ALL_SEEDS,
        device: Optional[str] = _DEVICE,
        checkpoint_dir: Optional[Path] = _CHECKPOINT_DIR,
        resume: Optional[str] = typer.Option(None, help="Continue run ID from its last checkpoint."),
        as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
        db: Optional[str] = DB_OPT, knobs: dict = None):
    """Train one algorithm at one precision pair on a build until it converges, plateaus,
    collapses, diverges or reaches max steps."""
    from bench.device import resolve_device
    from bench.precision import Precision
    from bench.algorithms import SPECS
    from runners.plan import plan_run
    from runners.runs import resume_run, run_plan

    if algo == "list":
        _list_algorithms(SPECS.values())
        return
    # every input checked here, before the store is opened or a bar drawn
    _check_algo(algo)
    if resume and seeds is not None:
        fail("--seeds starts runs; resume one run with --resume RUN_ID alone")
    from bench.cli.run_verl import resume_verl, verl_run, with_verl_overrides

    knobs = with_verl_overrides(knobs, verl_override, trainer, resume)
    _run_config(preset or Preset.tiny, benchmark, knobs)       # the knobs' bounds, before the store is read
    if algo:
        _check_thresholds([algo], knobs)
    precision = Precision.parse(dtype)
    overrides = {"benchmark": benchmark, **knobs}
    trainer, engine = trainer.value, engine.value
    if trainer == "native" and not (resume and device is None):
        device = resolve_device(device)
    if seeds is not None and trainer == "native":
        _seeded_run(algo, dtype, build_id, model, engine, preset, overrides, seeds, checkpoint_dir, as_json, db,
                    device, decide_early=not all_seeds)
        return
    if resume and resume_verl(resume, db, as_json):
        return
    if trainer == "verl":
        from runners.verl_launch import VerlTarget

        verl_run(algo, dtype, build_id, model, preset, overrides, db, VerlTarget(verl_python, gpus, nodes), dry_run,
                 as_json, seeds, not all_seeds)
        return
    if not algo and not resume:
        fail("give --algo (see `bench run --algo list`) or --resume RUN_ID")
    store = _store(db)
    plan = None
    if not resume:                     # (a resumed run keeps its stored settings)
        preset = _chosen_preset(preset, store, build_id, model, device, trainer)
        plan = plan_run(store, algo, precision, _run_config(preset, benchmark, knobs), build_id, model, engine,
                        device, preset.value, checkpoint_dir)     # every input checked before the bar is drawn
    with _step_progress(_run_progress) as cb:
        run_id = resume_run(store, resume, progress=cb, device=device) if resume else run_plan(store, plan, cb)
    _print_run_end(run_id, store, as_json)


@runs_app.command("extend")
def runs_extend(ctx: typer.Context,
                run_id: str = typer.Argument(..., help="A run that reached its budget undecided (status max_steps)."),
                max_steps: int = typer.Option(..., "--max-steps", min=1, help="The new budget, above the run's."),
                device: Optional[str] = typer.Option(None, parser=parse_device, metavar=DEVICE_METAVAR,
                                                     help="Default: the device the run started on."),
                as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
                db: Optional[str] = DB_OPT):
    """Decide an UNDECIDED run: continue it from its last checkpoint under a larger budget, as a run
    started with that budget would train (bit for bit on the same device and CPU kind)."""
    from runners.runs import extend_run

    store = _store(db or (ctx.obj or {}).get("db"))
    with _step_progress(_run_progress) as cb:
        extend_run(store, run_id, max_steps, progress=cb, device=device)
    _print_run_end(run_id, store, as_json)


_STALENESS_AXIS = typer.Option(
    None, help="Run every cell once per staleness K, e.g. 0,1,2,4,8,16 (one value: an axis of one); finished "
    "(cell, K, seed) runs are skipped. K: roll out with the weights of K training steps ago. Native trainer only.",
    show_default=False, rich_help_panel=_RUN_PANEL)


@app.command()
@knob_options(RunConfig, defaults=_preset_values(), panel=_RUN_PANEL,
              replace={"staleness": (Optional[str], _STALENESS_AXIS)})
def sweep(algo: str = typer.Option("paper", help="Comma-separated algorithms, or a group: paper (the FP16 "
                                   "paper's seven), corrections (the field's, after them) or all."),
          dtype: str = typer.Option("bf16,fp16,fp32", help="Dtypes (both engines) or pairs (rollout=X,train=Y), "
                                    "separated by ',' or ';' (a pair's own comma binds: fp16;rollout=fp8,train=fp16); "
                                    "`all` for all 35 pairs, `all16` for the paper's nine, `ladder` for every rung → "
                                    "fp32."),
          build_id: Optional[str] = _BUILD,
          engine: Engine = ENGINE_OPT,
          preset: Preset = _PRESET,
          benchmark: Optional[str] = _BENCHMARK,
          jobs: int = typer.Option(1, min=1, help="Cells run at once (more than one: each in a process of its own)."),
          device: Optional[str] = _DEVICE,
          trainer: Trainer = _TRAINER,
          verl_python: str = _VERL_PYTHON,
          verl_override: Optional[list[str]] = _VERL_OVERRIDE,
          gpus: int = _GPUS,
          nodes: int = _NODES,
          seeds: Optional[str] = _SEEDS,
          all_seeds: bool = _ALL_SEEDS,
          checkpoint_dir: Optional[Path] = _CHECKPOINT_DIR,
          db: Optional[str] = DB_OPT, knobs: dict = None):
    """Run the algorithm × precision grid on one build, skipping cells already finished (by the same
    trainer and rollout engine, at the same settings but the seed)."""
    from bench.device import resolve_device
    from bench.precision import parse_list
    from bench.algorithms import ALGO_GROUPS
    from runners.algos import check_algo
    from runners.sweep import parse_staleness, run_grid

    trainer, engine = trainer.value, engine.value
    algos = list(ALGO_GROUPS[algo]) if algo in ALGO_GROUPS else [check_algo(a.strip()) for a in algo.split(",")
                                                                   if a.strip()]
    from bench.cli.run_verl import with_verl_overrides

    knobs = with_verl_overrides(knobs, verl_override, trainer)
    staleness = knobs.pop("staleness")
    k_list = None if staleness is None else parse_staleness(staleness)
    _run_config(preset or Preset.tiny, benchmark, {**knobs, "staleness": None if k_list is None else max(k_list)})
    _check_thresholds(algos, knobs)
    pairs = parse_list(dtype)
    seed_list = None if seeds is None else _seed_list(seeds, knobs)
    device = resolve_device(device) if trainer == "native" else "cpu"
    if algo in ALGO_GROUPS:                # a group: the algorithms this trainer and engine can run
        left = _not_runnable(trainer, engine)
        for a in [a for a in algos if a in left]:
            algos.remove(a)
            console.print(f"[yellow]note:[/] --algo {algo} with --trainer {trainer} --engine {engine} leaves out "
                          f"{a}: {left[a]}", highlight=False, soft_wrap=True)
    verl = None
    if trainer == "verl":
        from runners.verl_launch import VerlTarget, check_verl_cell

        for a in algos:                    # before the store is opened (run_grid plans the cells again)
            for k in k_list or [None]:
                check_verl_cell(a, _run_config(preset or Preset.paper, benchmark, {**knobs, "staleness": k}))
        verl = VerlTarget(verl_python, gpus, nodes)
    store = _store(db)
    preset = _chosen_preset(preset, store, build_id, None, device, trainer)
    overrides = {"benchmark": benchmark, **knobs}
    results = run_grid(store, algos, pairs, build_id, engine, preset.value,
                       {k: v for k, v in overrides.items() if v is not None}, jobs,
                       log=_log, verl=verl, seeds=seed_list, device=device, staleness=k_list,
                       ckpt_root=checkpoint_dir, decide_early=not all_seeds)
    _print_grid(results)
