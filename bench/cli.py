"""The `bench` command line. Calls the stages; nothing imports it.

Every bad input ends with one readable message on stderr and exit code 2 (1 for failures
while working), leaving nothing half-written.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="bench: the RL sanity test (perfectible split → RL runs → leaderboard).")
build_app = typer.Typer(help="Build the perfectible split for a base model.", invoke_without_command=True)
builds_app = typer.Typer(help="List and inspect builds.", invoke_without_command=True)
model_app = typer.Typer(help="The embedded model.", no_args_is_help=True)
db_app = typer.Typer(help="The SQL store.", no_args_is_help=True)
app.add_typer(build_app, name="build")
app.add_typer(builds_app, name="builds")
app.add_typer(model_app, name="model")
app.add_typer(db_app, name="db")

console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 200)   # no truncated tables in logs

DB_OPT = typer.Option(None, "--db", help="SQLAlchemy URL of the store (default: $BENCH_DB_URL or SQLite under $BENCH_HOME).")


def fail(msg: str, code: int = 2) -> None:
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False)   # "pip install 'x[extra]'" stays
    raise typer.Exit(code)


def _store(url: str | None):
    from bench.store import StoreError, open_store

    try:
        return open_store(url)
    except StoreError as e:
        fail(str(e))


def _user_errors():
    """Exception types whose message is the whole story for the user."""
    from bench.models import ModelError
    from bench.precision import PrecisionError
    from bench.problems import SourceError
    from bench.store import StoreError
    from datasets_build.builder import BuildError

    return (BuildError, ModelError, SourceError, PrecisionError, StoreError, ValueError, FileNotFoundError)


def _progress(description: str):
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                    TimeRemainingColumn(), console=console, transient=False)


# ------------------------------------------------------------------ build

@build_app.callback()
def build(ctx: typer.Context,
          model: str = typer.Option("tiny-math", help="'tiny-math', a model directory, or a hub id."),
          source: Optional[str] = typer.Option(None, help="Problems: a .jsonl/.parquet/.csv file, a saved "
                                               "`datasets` directory, 'synthetic', 'math' or a hub id. "
                                               "Default: synthetic for tiny-math, MATH otherwise."),
          limit: Optional[int] = typer.Option(None, help="Use the first N problems (synthetic: draw N; default 300)."),
          id_col: str = typer.Option("id", help="Column holding the problem id (else a hash of the text)."),
          problem_col: str = typer.Option("problem", help="Column holding the problem text."),
          answer_col: str = typer.Option("answer", help="Column holding the gold answer."),
          solution_col: str = typer.Option("solution", help="Column whose last \\boxed{} is the gold when the answer column is missing."),
          engine: str = typer.Option("auto", help="Rollout engine: auto (vllm when importable), torch, vllm."),
          dtype: str = typer.Option("bf16", help="Rollout dtype: fp32, fp16, bf16."),
          k: int = typer.Option(40, help="Rollouts per problem."),
          band: Optional[List[float]] = typer.Option(None, help="Keep problems with lo <= accuracy <= hi "
                                                     "(inclusive at both ends). Default 0.2 0.8.", show_default=False),
          temperature: float = typer.Option(1.0), top_p: float = typer.Option(1.0),
          max_tokens: Optional[int] = typer.Option(None, help="Default 64 for tiny-math, 8192 otherwise."),
          seed: int = typer.Option(0),
          shard: Optional[str] = typer.Option(None, help="Build one shard i/n (0 <= i < n); join with `bench build merge`."),
          chunk: int = typer.Option(32, help="Problems per persisted chunk (the unit of resume)."),
          out_dir: Optional[Path] = typer.Option(None, "--out", help="Output directory (default $BENCH_HOME/builds/<id>)."),
          keep_text: bool = typer.Option(False, help="Store each rollout's full text."),
          resume: bool = typer.Option(False, help="Continue the unfinished build with the same settings."),
          force: bool = typer.Option(False, help="Build again although a complete build has the same settings."),
          adaptive: bool = typer.Option(False, help="Sample in rounds; stop a problem as soon as a Wilson interval "
                                        "for its accuracy lies wholly inside or outside the band (at most k)."),
          round_size: int = typer.Option(2, help="Adaptive: rollouts per round."),
          confidence: float = typer.Option(0.85, help="Adaptive: two-sided confidence of the Wilson interval."),
          min_samples: int = typer.Option(8, help="Adaptive: never decide a problem on fewer rollouts."),
          threads: Optional[int] = typer.Option(None, help="Torch threads for the torch engine."),
          ray: bool = typer.Option(False, "--ray", help="Run the shards as Ray tasks (one engine per GPU, or per CPU "
                                   "without GPUs) and merge them; every node must reach the store (--db)."),
          shards: Optional[int] = typer.Option(None, help="With --ray: number of shards (default: GPUs, else CPUs)."),
          ray_address: Optional[str] = typer.Option(None, help="With --ray: the cluster (default $RAY_ADDRESS, else "
                                                    "a local Ray instance)."),
          as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
          db: Optional[str] = DB_OPT):
    """Build the perfectible split: k rollouts per problem, graded with math-verify; keep the
    problems whose accuracy lies in [lo, hi], both ends inclusive (default [0.2, 0.8])."""
    if ctx.invoked_subcommand is not None:
        return
    ctx.ensure_object(dict)
    from bench.problems import ColumnMap
    from datasets_build.builder import BuildConfig

    lo, hi = (0.2, 0.8) if not band else (band + [None])[:2]
    if hi is None:
        fail("--band needs two numbers: lo hi (give --band twice: --band 0.2 --band 0.8)")
    cfg = BuildConfig(model=model, source=source, limit=limit,
                      columns=ColumnMap(id_col, problem_col, answer_col, solution_col), engine=engine,
                      dtype=dtype, k=k, lo=lo, hi=hi, temperature=temperature, top_p=top_p,
                      max_tokens=max_tokens, seed=seed, shard=shard, chunk=chunk, out=out_dir,
                      keep_text=keep_text, resume=resume, force=force, threads=threads, adaptive=adaptive,
                      round_size=round_size, confidence=confidence, min_samples=min_samples)
    store = _store(db)
    try:
        if ray:
            from bench.store import default_url
            from datasets_build.ray_build import ray_build

            with _progress("shards") as prog:
                task = prog.add_task("shards", total=None, rate="")
                manifest = ray_build(db or default_url(), cfg, shards, ray_address,
                                     on_shard=lambda r, done, n: prog.update(task, completed=done, total=n,
                                                                             rate=f"shard {r['shard']}: {r['build_id']}"))
        else:
            manifest = _build_with_progress(store, cfg)
    except _user_errors() as e:
        fail(str(e))
    if as_json:
        out.print_json(json.dumps(manifest, default=str))
        return
    if manifest.get("reused"):
        console.print(f"a complete build with these settings exists: {manifest['build_id']} (--force builds again)",
                      highlight=False)
    c = manifest["counts"]
    n = manifest["problems"]
    out.print(f"build [bold]{manifest['build_id']}[/]: {c['kept']} of {n} problems kept "
              f"({100 * manifest['kept_fraction']:.1f}% in [{cfg.lo}, {cfg.hi}]); too easy {c['too_easy']}, "
              f"too hard {c['too_hard']}, bad gold {c['bad_gold']}")
    rps = manifest["rollouts_per_s"]
    out.print(f"{manifest['rollouts']} rollouts, {rps:.0f} rollouts/s, wall {manifest['wall_s']:.1f}s → {manifest['out_dir']}"
              if rps else f"{manifest['rollouts']} rollouts (all resumed), wall {manifest['wall_s']:.1f}s → {manifest['out_dir']}")


def _build_with_progress(store, cfg) -> dict:
    import time

    from datasets_build.builder import run_build

    with _progress("rollouts") as prog:
        task = prog.add_task("rollouts", total=None, rate="")
        t0 = [None]

        def on_progress(done, total, new):
            t0[0] = t0[0] or time.time()
            dt = time.time() - t0[0]
            prog.update(task, completed=done, total=total, rate=f"{new / dt:.0f} rollouts/s" if dt > 0 and new else "")

        return run_build(store, cfg, progress=on_progress)


@build_app.command("merge")
def build_merge(build_ids: Optional[List[str]] = typer.Argument(None, help="Shard builds to join (default: the newest "
                                                                "complete set of shards with one settings hash)."),
                out_dir: Optional[Path] = typer.Option(None, "--out", help="Output directory (default $BENCH_HOME/builds/<id>)."),
                as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT):
    """Join shards built with `bench build --shard i/n` into one split (all shards complete, same settings)."""
    from datasets_build.merge import merge_shards

    try:
        manifest = merge_shards(_store(db), build_ids, out_dir)
    except _user_errors() as e:
        fail(str(e))
    if as_json:
        out.print_json(json.dumps(manifest, default=str))
    else:
        out.print(f"merged {len(manifest['shards'])} shards into build [bold]{manifest['build_id']}[/]: "
                  f"{manifest['counts']['kept']} of {manifest['problems']} kept → {manifest['out_dir']}")


# Typer takes one value per --band flag; accept the natural `--band 0.2 0.8` as well.
def _rewrite_band(argv: list[str]) -> list[str]:
    out_args, i = [], 0
    while i < len(argv):
        if argv[i] == "--band" and i + 2 < len(argv) and not argv[i + 2].startswith("-"):
            out_args += ["--band", argv[i + 1], "--band", argv[i + 2]]
            i += 3
        else:
            out_args.append(argv[i])
            i += 1
    return out_args


# ------------------------------------------------------------------ builds

@builds_app.callback()
def builds(ctx: typer.Context, as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT):
    """List builds, newest first."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"db": db}
        return
    from leaderboard.queries import builds_frame

    data = [{"id": b.build, "model": b.model, "status": b.status, "source": b.source, "engine": b.engine,
             "dtype": b.dtype, "k": int(b.k), "band": [b.lo, b.hi], "shard": b.shard, "problems": int(b.n_problems),
             "kept": None if b.n_kept != b.n_kept else int(b.n_kept), "created_at": str(b.created_at)}
            for b in builds_frame(_store(db)).itertuples()]
    if as_json:
        out.print_json(json.dumps(data))
        return
    if not data:
        out.print("no builds yet: run `bench build --model tiny-math`")
        return
    t = Table("id", "model", "status", "source", "engine", "dtype", "k", "band", "kept/problems", "created")
    for d in data:
        t.add_row(d["id"], d["model"], d["status"], d["source"], d["engine"], d["dtype"], str(d["k"]),
                  f"{d['band'][0]}–{d['band'][1]}", f"{d['kept']}/{d['problems']}", d["created_at"][:19])
    out.print(t)


@builds_app.command("show")
def builds_show(ctx: typer.Context, build_id: str, as_json: bool = typer.Option(False, "--json"),
                db: Optional[str] = DB_OPT):
    """Show one build's manifest."""
    from bench.store import Build, session

    store = _store(db or (ctx.obj or {}).get("db"))
    with session(store) as s:
        b = s.get(Build, build_id)
        if b is None:
            fail(f"no build {build_id!r}; `bench builds` lists them")
        info = {"id": b.id, "status": b.status, "shard": b.shard, "out_dir": b.out_dir, **(b.manifest or {})}
    if as_json:
        out.print_json(json.dumps(info, default=str))
    else:
        for key in ("id", "status", "model", "engine", "dtype", "source", "k", "band", "counts", "kept_fraction",
                    "rollouts", "rollouts_per_s", "wall_s", "out_dir", "template"):
            if key in info:
                out.print(f"[bold]{key}[/]: {info[key]}", highlight=False)


# ------------------------------------------------------------------ grade

@app.command()
def grade(file: Path = typer.Argument(..., help="JSONL with `response` and `gold` on each row."),
          as_json: bool = typer.Option(False, "--json", help="Print a summary object instead of per-row lines."),
          timeout: float = typer.Option(5.0, help="Hard per-answer timeout in seconds."),
          workers: Optional[int] = typer.Option(None, help="Grader processes (default: up to 2).")):
    """Grade responses against golds with math-verify (process pool, hard timeouts)."""
    from bench.grading import Grader

    if not file.exists():
        fail(f"{file}: no such file")
    rows = []
    with file.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{file}:{n}: malformed JSON ({e.msg})")
            if not isinstance(r, dict) or not isinstance(r.get("response"), str) or r.get("gold") is None:
                fail(f"{file}:{n}: each row needs a string `response` and a `gold`")
            rows.append(r)
    if not rows:
        fail(f"{file}: no rows")
    with Grader(workers=workers, timeout=timeout) as g:
        verdicts = g.grade([r["response"] for r in rows], [str(r["gold"]) for r in rows])
    if as_json:
        counts = {}
        for v in verdicts:
            counts[v.status] = counts.get(v.status, 0) + 1
        out.print_json(json.dumps({"rows": len(rows), "accuracy": counts.get("correct", 0) / len(rows),
                                   "counts": counts, "verdicts": [v.to_dict() for v in verdicts]}))
        return
    for i, v in enumerate(verdicts):
        out.print(f"{i}\t{v.status}\t{v.extracted!r}\t{v.reason}", highlight=False, markup=False)


# ------------------------------------------------------------------ run / sweep / runs / report

runs_app = typer.Typer(help="List and inspect runs.", invoke_without_command=True)
app.add_typer(runs_app, name="runs")


def _run_progress(prog, task):
    def cb(step, total, m):
        acc = m.get("eval/split")
        prog.update(task, completed=step, total=total,
                    rate=f"reward {m['reward']:.2f}" + (f" split {acc:.2f}" if acc is not None else "")
                    + f" kl {m['kl_k1']:.1e}")
    return cb


def _print_run_end(run_id: str, store, as_json: bool = False) -> None:
    """The ended run as JSON, or its summary line (exit 1 when it failed: a verl run that
    failed returns here rather than raising)."""
    if as_json:
        out.print_json(json.dumps(_run_info(store, run_id), default=str))
        return
    from rich.markup import escape

    from bench.store import Run, session

    with session(store) as s:
        r = s.get(Run, run_id)
        peak = "-" if r.peak_accuracy is None else f"{r.peak_accuracy:.3f}"
        via = " (verl)" if r.trainer == "verl" else ""
        out.print(f"run [bold]{r.id}[/]{via} {r.algo} {r.rollout_dtype}/{r.train_dtype}: {r.status} after {r.step} "
                  f"steps ({r.wall_s:.0f}s); peak split accuracy {peak}; {escape(r.stop_reason or '')}", highlight=False)
    if r.status == "failed":
        raise typer.Exit(1)


@app.command()
def run(algo: Optional[str] = typer.Option(None, help="Algorithm (`--algo list` shows them)."),
        dtype: str = typer.Option("fp32", help="Precision: fp32 | fp16 | bf16 (both engines) or rollout=X,train=Y."),
        build_id: Optional[str] = typer.Option(None, "--build", help="Build id (default: the latest complete build)."),
        model: Optional[str] = typer.Option(None, help="Only builds of this model (and check the build's model)."),
        engine: str = typer.Option("torch", help="Rollout engine: torch, vllm, auto."),
        trainer: str = typer.Option("native", help="native (one process) or verl (launch verl 0.9.1's main_ppo, "
                                    "follow its metrics, stop it by bench's rules)."),
        gpus: int = typer.Option(1, help="With --trainer verl: GPUs per node."),
        nodes: int = typer.Option(1, help="With --trainer verl: nodes."),
        dry_run: bool = typer.Option(False, help="With --trainer verl: export the split and reward module, "
                                     "print the command, launch nothing."),
        verl_python: str = typer.Option("python", help="Interpreter of the environment that has verl."),
        preset: str = typer.Option("tiny", help="tiny | paper"),
        benchmark: Optional[str] = typer.Option(None, help="Problem source of the preset's benchmark (paper: AIME24 "
                                                "from the hub; offline, a .jsonl such as the paper's aime24.jsonl)."),
        max_steps: Optional[int] = typer.Option(None), lr: Optional[float] = typer.Option(None),
        prompts_per_step: Optional[int] = typer.Option(None, help="B: prompts per step."),
        samples_per_prompt: Optional[int] = typer.Option(None, help="G: responses per prompt."),
        updates_per_batch: Optional[int] = typer.Option(None, help="Mini-batch updates per rollout batch."),
        eval_every: Optional[int] = typer.Option(None), checkpoint_every: Optional[int] = typer.Option(None),
        eval_split_m: Optional[int] = typer.Option(None, help="Split accuracy is avg@m."),
        seed: Optional[int] = typer.Option(None), threads: Optional[int] = typer.Option(None),
        checkpoint_dir: Optional[Path] = typer.Option(None, help="Default $BENCH_HOME/runs/<run id>."),
        resume: Optional[str] = typer.Option(None, help="Continue run ID from its last checkpoint."),
        as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
        db: Optional[str] = DB_OPT):
    """Train one algorithm at one precision pair on a build until it converges, plateaus,
    collapses, diverges or reaches max steps."""
    from bench.precision import Precision
    from runners.algos import DESCRIPTIONS
    from runners.trainer import RunError, resume_run, start_run

    if algo == "list":
        for name, desc in DESCRIPTIONS.items():
            out.print(f"{name:16s} {desc}", highlight=False)
        return
    overrides = dict(benchmark=benchmark, max_steps=max_steps, lr=lr, prompts_per_step=prompts_per_step,
                     samples_per_prompt=samples_per_prompt, updates_per_batch=updates_per_batch,
                     eval_every=eval_every, checkpoint_every=checkpoint_every, eval_split_m=eval_split_m,
                     seed=seed, threads=threads)
    if trainer not in ("native", "verl"):
        fail(f"unknown trainer {trainer!r}; choose native or verl")
    if resume and _resume_verl(resume, db, as_json):
        return
    if trainer == "verl":
        _verl_run(algo, dtype, build_id, model, preset, overrides, db, verl_python, dry_run, gpus, nodes, as_json)
        return
    if not algo and not resume:
        fail("give --algo (see `bench run --algo list`) or --resume RUN_ID")
    store = _store(db)
    try:
        with _progress("steps") as prog:
            task = prog.add_task("steps", total=None, rate="")
            if resume:
                run_id = resume_run(store, resume, progress=_run_progress(prog, task))
            else:
                from runners.presets import get_preset

                cfg = get_preset(preset, **overrides)
                run_id = start_run(store, algo, Precision.parse(dtype), cfg, build_id=build_id, model=model,
                                   engine=engine, ckpt_root=checkpoint_dir, preset=preset,
                                   progress=_run_progress(prog, task))
    except (RunError, *_user_errors()) as e:
        fail(str(e))
    _print_run_end(run_id, store, as_json)


def _resume_verl(run_id, db, as_json) -> bool:
    """Resume `run_id` if verl ran it (False for a native run)."""
    from bench.store import Run, session
    from runners.trainer import RunError
    from runners.verl_follow import resume_verl_run

    store = _store(db)
    with session(store) as s:
        run = s.get(Run, run_id)
        if run is None or run.trainer != "verl":
            return False
    try:
        with _progress("steps") as prog:
            task = prog.add_task("steps", total=None, rate="")
            resume_verl_run(store, run_id, progress=_verl_progress(prog, task))
    except RunError as e:
        fail(str(e))
    _print_run_end(run_id, store, as_json)
    return True


def _verl_run(algo, dtype, build_id, model, preset, overrides, db, verl_python, dry_run, gpus, nodes, as_json) -> None:
    import shutil
    import uuid

    from bench.precision import Precision
    from bench.store import bench_home
    from runners.presets import get_preset
    from runners.trainer import RunError
    from runners.verl_follow import prepare, start_verl_run
    from runners.verl_runner import (VerlError, check_verl_version, installed_verl_version, missing_launch_modules,
                                     shell_line, validate_cells)

    if not algo:
        fail("give --algo (see `bench run --algo list`)")
    store = _store(db)
    try:
        p = Precision.parse(dtype)
        cfg = get_preset(preset, **overrides)
        version = installed_verl_version(verl_python)
        if version is not None or not dry_run:          # a dry run without verl prints the command unchecked
            check_verl_version(version)
        if not dry_run:
            missing = missing_launch_modules(verl_python)
            if missing:
                raise VerlError(f"{verl_python} has verl but not {' or '.join(missing)}, which main_ppo needs to "
                                "train: pip install 'verl[vllm]==0.9.1' there (a GPU machine); --dry-run works without")
        # one directory per run (its name is the run id); dry runs share one per cell
        root = bench_home() / "verl" / (f"dry-run/{algo}-{p.rollout}-{p.train}" if dry_run else uuid.uuid4().hex[:12])
        job = prepare(store, algo, p, cfg, build_id, model, verl_python, root=root, gpus=gpus, nodes=nodes)
        if version is not None:
            (error,) = validate_cells(verl_python, [job["argv"][3:]])
            if error:
                if not dry_run:
                    shutil.rmtree(root, ignore_errors=True)         # nothing half-written
                raise VerlError(f"verl's validate_config rejects this cell: {error}")
            console.print(f"verl {version}: validate_config passed", highlight=False)
        elif dry_run:
            console.print(f"verl is not installed for {verl_python}: the command was not validated "
                          "(pass --verl-python)", highlight=False)
    except (RunError, VerlError, *_user_errors()) as e:
        fail(str(e))
    if dry_run:
        out.print(shell_line(job["argv"], job["env"]), highlight=False, markup=False, soft_wrap=True)
        return
    console.print(f"verl log: {job['root']}/verl.log", highlight=False)
    with _progress("steps") as prog:
        task = prog.add_task("steps", total=None, rate="")
        run_id = start_verl_run(store, algo, p, cfg, preset, job, progress=_verl_progress(prog, task))
    _print_run_end(run_id, store, as_json)


def _verl_progress(prog, task):
    def cb(step, total, data):
        score = data.get("critic/score/mean")
        prog.update(task, completed=step, total=total, rate=f"reward {score:.2f}" if isinstance(score, float) else "")
    return cb


@app.command()
def sweep(algo: str = typer.Option("all", help="Comma-separated algorithms, or all."),
          dtype: str = typer.Option("bf16,fp16,fp32", help="Comma-separated dtypes (both engines), `all` for the nine pairs, "
                                    "or pairs separated by ';'."),
          build_id: Optional[str] = typer.Option(None, "--build"),
          engine: str = typer.Option("torch"), preset: str = typer.Option("tiny"),
          benchmark: Optional[str] = typer.Option(None, help="Problem source of the preset's benchmark."),
          max_steps: Optional[int] = typer.Option(None), eval_every: Optional[int] = typer.Option(None),
          prompts_per_step: Optional[int] = typer.Option(None), samples_per_prompt: Optional[int] = typer.Option(None),
          jobs: int = typer.Option(1, help="Cells run in parallel processes."),
          threads: Optional[int] = typer.Option(None),
          trainer: str = typer.Option("native", help="native, or verl (cells one after another on the cluster)."),
          verl_python: str = typer.Option("python", help="With --trainer verl: verl's interpreter."),
          gpus: int = typer.Option(1, help="With --trainer verl: GPUs per node."),
          nodes: int = typer.Option(1, help="With --trainer verl: nodes."),
          db: Optional[str] = DB_OPT):
    """Run the algorithm × precision grid on one build, skipping cells already finished."""
    from runners.algos import REGISTRY
    from runners.sweep import run_grid
    from bench.precision import parse_list

    algos = list(REGISTRY) if algo == "all" else [a.strip() for a in algo.split(",") if a.strip()]
    try:
        for a in algos:
            if a not in REGISTRY:
                raise ValueError(f"unknown algorithm {a!r}; choose one of {', '.join(REGISTRY)}")
        pairs = parse_list(dtype)
    except _user_errors() as e:
        fail(str(e))
    store = _store(db)
    overrides = {"benchmark": benchmark, "max_steps": max_steps, "eval_every": eval_every, "prompts_per_step": prompts_per_step,
                 "samples_per_prompt": samples_per_prompt, "threads": threads}
    try:
        if trainer not in ("native", "verl"):
            raise ValueError(f"unknown trainer {trainer!r}; choose native or verl")
        verl_args = None if trainer == "native" else ["--verl-python", verl_python, "--gpus", str(gpus),
                                                       "--nodes", str(nodes)]
        results = run_grid(store, db, algos, pairs, build_id, engine, preset,
                           {k: v for k, v in overrides.items() if v is not None}, jobs,
                           log=lambda msg: console.print(msg, highlight=False, markup=False), verl_args=verl_args)
    except _user_errors() as e:
        fail(str(e))
    t = Table("algo", "precision", "status", "peak", "steps", "run")
    for r in results:
        t.add_row(r["algo"], r["precision"], r["status"], f"{r['peak']:.3f}" if r["peak"] is not None else "-",
                  str(r["steps"]), r["run"] or "-")
    out.print(t)
    if any(r["status"] == "failed" for r in results):
        raise typer.Exit(1)


@runs_app.callback()
def runs(ctx: typer.Context, as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT):
    """List runs, newest first."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"db": db}
        return
    from leaderboard.queries import runs_frame

    df = runs_frame(_store(db))
    if as_json:
        out.print_json(df.to_json(orient="records", date_format="iso") if not df.empty else "[]")
        return
    if df.empty:
        out.print("no runs yet: run `bench run --algo pg-seq-is --dtype fp16`")
        return
    t = Table("run", "algo", "precision", "status", "steps", "peak", "final", "build")
    for r in df.itertuples():
        t.add_row(r.run, r.algo, r.precision, r.status, str(r.steps), _f(r.peak_accuracy), _f(r.final_accuracy), r.build)
    out.print(t)


def _f(x) -> str:
    return "-" if x is None or x != x else f"{x:.3f}"


def _run_info(store, run_id: str) -> dict:
    from sqlalchemy import select

    from bench.store import Eval, Run, RunStep, session

    with session(store) as s:
        r = s.get(Run, run_id)
        if r is None:
            fail(f"no run {run_id!r}; `bench runs` lists them")
        last = s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step.desc())).first()
        evals = s.execute(select(Eval.step, Eval.benchmark, Eval.n, Eval.score).where(Eval.run_id == run_id)
                          .order_by(Eval.step)).all()
        return {"id": r.id, "build": r.build_id, "algo": r.algo, "rollout_dtype": r.rollout_dtype,
                "train_dtype": r.train_dtype, "trainer": r.trainer, "engine": r.engine, "status": r.status,
                "stop_reason": r.stop_reason, "steps": r.step, "wall_s": r.wall_s, "peak_accuracy": r.peak_accuracy,
                "final_accuracy": r.final_accuracy, "steps_to_target": r.steps_to_target,
                "wall_to_target": r.wall_to_target, "kl_warning_step": r.kl_warning_step, "config": r.config,
                "calibration": r.calibration, "provenance": r.provenance,
                "last_step": last.metrics if last else None,
                "evals": [{"step": e.step, "benchmark": e.benchmark, "n": e.n, "score": e.score} for e in evals]}


@runs_app.command("show")
def runs_show(ctx: typer.Context, run_id: str, as_json: bool = typer.Option(False, "--json"),
              db: Optional[str] = DB_OPT):
    """Show one run: settings, status, evaluations and its last step's metrics."""
    info = _run_info(_store(db or (ctx.obj or {}).get("db")), run_id)
    if as_json:
        out.print_json(json.dumps(info, default=str))
        return
    for k, v in info.items():
        if k not in ("config", "last_step", "evals", "calibration", "provenance"):
            out.print(f"[bold]{k}[/]: {v}", highlight=False)
    cal = info["calibration"]
    if cal:
        verdict = "ok" if cal["ok"] else "FAILED"
        out.print(f"[bold]calibration[/] ({cal['pair']}, step 0): {verdict}; mean |Δlog p| "
                  f"{cal['abs_logp_diff_mean']:.3g}, max {cal['abs_logp_diff_max']:.3g}, k3 {cal['k3']:.3g}",
                  highlight=False)
    prov = info["provenance"] or {}
    if prov:
        versions = ", ".join(f"{k} {v}" for k, v in (prov.get("versions") or {}).items() if v)
        out.print(f"[bold]provenance[/]: {prov.get('device_name')} · {versions} · bench "
                  f"{(prov.get('bench') or {}).get('commit') or '?'}", highlight=False)
        if prov.get("split_accuracy_estimator"):
            out.print(f"[bold]split accuracy[/]: {prov['split_accuracy_estimator']}", highlight=False)
    for e in info["evals"]:
        out.print(f"  eval step {e['step']}: {e['benchmark']} avg@{e['n']} = {e['score']:.3f}", highlight=False)


@app.command()
def report(csv: Optional[Path] = typer.Option(None, "--csv", help="Also write the table as CSV."),
           as_json: bool = typer.Option(False, "--json"), build_id: Optional[str] = typer.Option(None, "--build"),
           db: Optional[str] = DB_OPT):
    """The leaderboard ranking in the terminal: PASS when the run converged (the lower confidence bound
    of split accuracy, pooled over its last evaluations, reached 0.95)."""
    from leaderboard.queries import ranked, report_columns, runs_frame

    df = ranked(runs_frame(_store(db), build_id))
    if df.empty:
        if as_json:
            out.print_json("[]")
        else:
            out.print("no runs yet: run `bench build --model tiny-math`, then `bench sweep --algo grpo,pg-seq-is --dtype bf16,fp16`")
        return
    df = df[report_columns()]
    if csv:
        try:
            df.to_csv(csv, index=False)
        except OSError as e:
            fail(f"cannot write {csv}: {e.strerror or e}")
    if as_json:
        out.print_json(df.to_json(orient="records"))
        return
    t = Table("#", "algo", "precision", "sanity", "status", "peak", "final", "steps→pass", "eval", "KL k3", "max|Δp|", "steps", "run")
    for i, r in enumerate(df.itertuples(), 1):
        t.add_row(str(i), r.algo, r.precision, {"PASS": "[green]PASS[/]", "RUNNING": "[yellow]RUNNING[/]"}.get(r.sanity, "[red]FAIL[/]"), r.status,
                  _f(r.peak_accuracy), _f(r.final_accuracy),
                  "-" if r.steps_to_target != r.steps_to_target or r.steps_to_target is None else str(int(r.steps_to_target)),
                  _f(r.best_eval), "-" if r.mean_kl != r.mean_kl or r.mean_kl is None else f"{r.mean_kl:.2e}",
                  "-" if r.max_abs_dp != r.max_abs_dp or r.max_abs_dp is None else f"{r.max_abs_dp:.2e}",
                  str(r.steps), r.run)
    out.print(t)


@app.command()
def leaderboard(db: Optional[str] = DB_OPT, port: int = typer.Option(8501, help="Port to serve on."),
                address: str = typer.Option("127.0.0.1", help="Address to bind."),
                headless: bool = typer.Option(True, help="Do not open a browser.")):
    """Serve the Streamlit leaderboard over the store (read-only)."""
    import leaderboard as lb

    from bench.store import default_url

    url = db or default_url()
    _store(url)                                   # a bad URL fails here, readably
    app_path = Path(lb.__file__).parent / "app.py"
    cmd = [sys.executable, "-m", "streamlit", "run", str(app_path), "--server.port", str(port),
           "--server.address", address, "--server.headless", str(headless).lower(),
           "--browser.gatherUsageStats", "false", "--", "--db", url]
    console.print(f"leaderboard on http://{address}:{port} (store {url})", highlight=False)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)                 # bench becomes Streamlit: a kill of bench stops the server


@app.command()
def mismatch(model: str = typer.Option("tiny-math"), dtype: str = typer.Option("all", help="A pair (fp16, "
             "rollout=fp32,train=bf16), a comma list of dtypes, or all (the nine pairs)."),
             source: str = typer.Option("synthetic-hard", help="Problems (any `bench build --source`)."),
             n: int = typer.Option(32, help="Responses per problem."),
             limit: Optional[int] = typer.Option(100, help="First N problems."),
             engine: str = typer.Option("torch", help="Rollout engine: torch or vllm."),
             max_tokens: Optional[int] = typer.Option(None),
             temperature: float = typer.Option(1.0, help="Must be 1: μ has to be the raw softmax."),
             top_p: float = typer.Option(1.0, help="Must be 1: μ has to be the raw softmax."),
             threads: Optional[int] = typer.Option(None), out_dir: Optional[Path] = typer.Option(None, "--out"),
             as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT):
    """Offline training–inference mismatch (the paper's Figure 2): μ from the rollout engine,
    π from the training engine, on the same sampled tokens."""
    from bench.precision import Precision, parse_list
    from runners.offline_mismatch import MismatchConfig, analyse

    if temperature != 1.0 or top_p != 1.0:
        fail("bench mismatch samples at temperature 1 and top-p 1 only: otherwise μ is the log-probability of "
             "a reshaped distribution, not the model's softmax (TRL #6789, #4159)")
    try:
        pairs = [Precision.parse(dtype)] if "=" in dtype and ";" not in dtype else parse_list(dtype)
    except _user_errors() as e:
        fail(str(e))
    store = _store(db)
    cfg = MismatchConfig(model=model, source=source, limit=limit, n=n, max_tokens=max_tokens, engine=engine,
                         out=out_dir, threads=threads)
    try:
        reports = analyse(store, cfg, pairs, progress=lambda p, m: console.print(
            f"{p.name}: mean |π−μ| {m['prob_abs_diff_mean']:.2e}, KL {m['kl_k1']:.2e} nats", highlight=False))
    except _user_errors() as e:
        fail(str(e))
    if as_json:
        out.print_json(json.dumps(reports))
        return
    t = Table("rollout μ", "train π", "KL k1 (nats)", "± se", "KL k1 (bits)", "k3", "mean |π−μ|", "max π−μ",
              "min π−μ", "slope /1k tok", "± se")
    for r in reports:
        t.add_row(r["rollout"], r["train"], f"{r['kl_k1']:.2e}", f"{r['kl_k1_stderr']:.1e}", f"{r['kl_k1_bits']:.2e}",
                  f"{r['kl_k3']:.2e}", f"{r['prob_abs_diff_mean']:.2e}", f"{r['prob_diff_max']:.3g}",
                  f"{r['prob_diff_min']:.3g}", f"{r['log_ratio_slope']:.3g}", f"{r['log_ratio_slope_se']:.1e}")
    out.print(t)
    out.print(f"plots under {Path(reports[0]['plots']['token_scatter']).parent.parent}", highlight=False)


# ------------------------------------------------------------------ model / db

@model_app.command("train")
def model_train(name: str = typer.Argument("tiny-math", help="Only 'tiny-math' is trainable here."),
                steps: int = typer.Option(2500, help="Training steps (the band knob)."),
                batch_size: int = typer.Option(64), lr: float = typer.Option(3e-3),
                seed: int = typer.Option(0), threads: int = typer.Option(1),
                hidden: int = typer.Option(128), layers: int = typer.Option(3),
                out_dir: Optional[Path] = typer.Option(None, "--out", help="Default: the package's embedded weights.")):
    """Train the embedded tiny-math model from scratch on synthetic worked solutions."""
    from bench.tinymath import TinyConfig, TrainConfig, train

    if name != "tiny-math":
        fail(f"unknown trainable model {name!r}; only 'tiny-math'")
    if steps < 1 or batch_size < 1:
        fail("steps and batch size must be >= 1")
    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed, threads=threads,
                      arch=TinyConfig(hidden_size=hidden, num_hidden_layers=layers,
                                      intermediate_size=3 * hidden))
    if out_dir:
        cfg.out = out_dir
    with _progress("training") as prog:
        task = prog.add_task("training", total=steps, rate="")
        summary = train(cfg, progress=lambda s, n, loss: prog.update(task, completed=s, rate=f"loss {loss:.3f}"))
    out.print_json(json.dumps(summary))


@db_app.command("upgrade")
def db_upgrade(db: Optional[str] = DB_OPT):
    """Apply pending migrations to the store."""
    from bench.store import default_url

    _store(db)
    out.print(f"store at {db or default_url()} is up to date")


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.argv[1:] = _rewrite_band(sys.argv[1:])
    app()


if __name__ == "__main__":
    main()
