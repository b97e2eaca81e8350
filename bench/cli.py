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
out = Console()

DB_OPT = typer.Option(None, "--db", help="SQLAlchemy URL of the store (default: $BENCH_DB_URL or SQLite under $BENCH_HOME).")


def fail(msg: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {msg}", highlight=False)
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
          threads: Optional[int] = typer.Option(None, help="Torch threads for the torch engine."),
          as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
          db: Optional[str] = DB_OPT):
    """Build the perfectible split: k rollouts per problem, graded with math-verify; keep the
    problems whose accuracy lies in [lo, hi], both ends inclusive (default [0.2, 0.8])."""
    if ctx.invoked_subcommand is not None:
        return
    ctx.ensure_object(dict)
    from bench.problems import ColumnMap
    from datasets_build.builder import BuildConfig, run_build

    lo, hi = (0.2, 0.8) if not band else (band + [None])[:2]
    if hi is None:
        fail("--band needs two numbers: lo hi (give --band twice: --band 0.2 --band 0.8)")
    cfg = BuildConfig(model=model, source=source, limit=limit,
                      columns=ColumnMap(id_col, problem_col, answer_col, solution_col), engine=engine,
                      dtype=dtype, k=k, lo=lo, hi=hi, temperature=temperature, top_p=top_p,
                      max_tokens=max_tokens, seed=seed, shard=shard, chunk=chunk, out=out_dir,
                      keep_text=keep_text, resume=resume, threads=threads)
    store = _store(db)
    try:
        with _progress("rollouts") as prog:
            task = prog.add_task("rollouts", total=None, rate="")
            t0 = [None]

            def on_progress(done, total, new):
                import time

                t0[0] = t0[0] or time.time()
                dt = time.time() - t0[0]
                prog.update(task, completed=done, total=total,
                            rate=f"{new / dt:.0f} rollouts/s" if dt > 0 and new else "")

            manifest = run_build(store, cfg, progress=on_progress)
    except _user_errors() as e:
        fail(str(e))
    if as_json:
        out.print_json(json.dumps(manifest, default=str))
        return
    c = manifest["counts"]
    n = manifest["problems"]
    out.print(f"build [bold]{manifest['build_id']}[/]: {c['kept']} of {n} problems kept "
              f"({100 * manifest['kept_fraction']:.1f}% in [{cfg.lo}, {cfg.hi}]); too easy {c['too_easy']}, "
              f"too hard {c['too_hard']}, bad gold {c['bad_gold']}")
    rps = manifest["rollouts_per_s"]
    out.print(f"{manifest['rollouts']} rollouts, {rps:.0f} rollouts/s, wall {manifest['wall_s']:.1f}s → {manifest['out_dir']}"
              if rps else f"{manifest['rollouts']} rollouts (all resumed), wall {manifest['wall_s']:.1f}s → {manifest['out_dir']}")


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

def _build_rows(store):
    from sqlalchemy import select

    from bench.store import Build, Model, session

    with session(store) as s:
        return s.execute(select(Build, Model.name).join(Model, Model.id == Build.model_id)
                         .order_by(Build.created_at.desc())).all()


@builds_app.callback()
def builds(ctx: typer.Context, as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT):
    """List builds, newest first."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"db": db}
        return
    rows = _build_rows(_store(db))
    data = [{"id": b.id, "model": m, "status": b.status, "source": b.source, "engine": b.engine, "dtype": b.dtype,
             "k": b.k, "band": [b.lo, b.hi], "shard": b.shard, "problems": b.n_problems, "kept": b.n_kept,
             "created_at": str(b.created_at)} for b, m in rows]
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


# ------------------------------------------------------------------ model / db

@model_app.command("train")
def model_train(name: str = typer.Argument("tiny-math", help="Only 'tiny-math' is trainable here."),
                steps: int = typer.Option(1000, help="Training steps (the band knob)."),
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
