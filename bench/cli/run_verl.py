"""`bench run --trainer verl` (one run, its seeds, a dry run, --resume) and what `bench run` and
`bench sweep` check of verl's options: the knobs verl takes, --verl-override
(runners/verl_overrides.py), --keep-checkpoints refused."""

from __future__ import annotations

from bench.cli import _store, console, fail, out
from bench.cli.options import Preset
from bench.cli.run_common import _chosen_preset, _print_run_end, _seed_list, _seeded_run, _step_progress
from bench.knobs import cli_knobs, knob_fields
from runners.presets import RunConfig


def with_verl_overrides(knobs: dict, overrides: list[str] | None, trainer: str, resume: str | None = None) -> dict:
    """The knobs with --verl-override's settings and resources (runners/verl_overrides.py); the
    overrides are refused without --trainer verl, and --keep-checkpoints with it."""
    from runners.verl_overrides import split_overrides

    if overrides and resume:
        fail("--verl-override starts a run with your verl settings; a resumed run keeps its stored command")
    if trainer != "verl":
        if overrides:
            fail("--verl-override passes settings to verl: give --trainer verl")
        return knobs
    if knobs.get("keep_checkpoints") is not None:
        fail("--keep-checkpoints keeps checkpoints for `bench runs verify`, which re-runs native runs only; verl "
             "keeps its own every --checkpoint-every steps (all of them unless --verl-override "
             "trainer.max_actor_ckpt_to_keep=N)")
    if not overrides:
        return knobs
    settings, resources = split_overrides(overrides)
    return {**knobs, "verl_settings": settings, "verl_resources": resources}


def resume_verl(run_id, db, as_json) -> bool:
    """Resume `run_id` if verl ran it (False for a native run)."""
    from bench.store import Run, session
    from runners.verl_follow import resume_verl_run

    store = _store(db)
    with session(store) as s:
        run = s.get(Run, run_id)
        if run is None or run.trainer != "verl":
            return False
    with _step_progress(_verl_progress) as cb:
        resume_verl_run(store, run_id, progress=cb)
    _print_run_end(run_id, store, as_json)
    return True


def verl_knobs() -> set[str]:
    """The `bench run` settings a verl run takes: the knobs declared `verl=True` (bench/runconfig.py:
    what the launcher passes on or the follower applies; staleness and router replay are refused
    there unless off) and --benchmark (the first benchmark's source)."""
    knobs = [f for _, f in cli_knobs(RunConfig)] + knob_fields(RunConfig, cli_only=False)
    return {"benchmark"} | {f.name for f in knobs if f.metadata.get("verl")}


def verl_run(algo, dtype, build_id, model, preset, overrides, db, target, dry_run, as_json, seeds=None,
              decide_early=True) -> None:
    """`bench run --trainer verl`: one run, one per seed with --seeds (as a one-cell sweep), or
    with --dry-run each one's command printed."""
    from bench.knobs import flag_of
    from bench.precision import Precision
    from runners.plan import plan_run
    from runners.presets import get_preset
    from runners.runs import run_plan
    from runners.verl_launch import check_verl_cell, prepare_verl_run
    from runners.verl_runner import shell_line

    if not algo:
        fail("give --algo (see `bench run --algo list`)")
    unused = [k for k, v in overrides.items() if v is not None and k not in verl_knobs()]
    if unused:
        console.print("[yellow]warning:[/] verl does not take " + ", ".join(f"--{flag_of(k)}" for k in unused)
                      + " (native trainer settings); the run ignores them", highlight=False, soft_wrap=True)
    check_verl_cell(algo, get_preset((preset or Preset.paper).value, **overrides))   # before the store is read
    seed_list = None if seeds is None else _seed_list(seeds, overrides)
    if seed_list is not None and not dry_run:
        _seeded_run(algo, dtype, build_id, model, "vllm", preset, overrides, seeds, None, as_json, db, "cuda",
                    decide_early, verl=target)
        return
    store = _store(db)
    preset = _chosen_preset(preset, store, build_id, model, "cuda", "verl").value
    p = Precision.parse(dtype)
    if not dry_run:
        plan = plan_run(store, algo, p, get_preset(preset, **overrides), build_id, model, preset=preset, verl=target)
        with _step_progress(_verl_progress) as cb:
            run_id = run_plan(store, plan, cb, log=lambda msg: console.print(msg, highlight=False, soft_wrap=True))
        _print_run_end(run_id, store, as_json)
        return
    for seed in seed_list or [None]:           # each seed's command, validated by verl where it is installed
        cfg = get_preset(preset, **{**overrides, **({} if seed is None else {"seed": seed})})
        plan = plan_run(store, algo, p, cfg, build_id, model, preset=preset, verl=target)
        job, version = prepare_verl_run(store, algo, p, cfg, plan.build_id, None, target, True, preset)
        _print_validated(version, target.python, seed)
        out.print(shell_line(job.argv, job.env), highlight=False, markup=False, soft_wrap=True)


def _print_validated(version: str | None, python: str, seed: int | None) -> None:
    """Whether verl's validate_config passed the command (a dry run without verl: not validated)."""
    if version is not None:
        console.print(f"verl {version}: validate_config passed" + ("" if seed is None else f" (seed {seed})"),
                      highlight=False)
    else:
        console.print(f"verl is not installed for {python}: the command was not validated (pass --verl-python)",
                      highlight=False)


def _verl_progress(prog, task):
    def cb(step, total, data):
        score = data.get("critic/score/mean")
        prog.update(task, completed=step, total=total, rate=f"reward {score:.2f}" if isinstance(score, float) else "")
    return cb
