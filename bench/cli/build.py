"""`bench build`, `bench build merge`, `bench builds`, `bench grade`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import List, Optional, Tuple

import typer
from rich.table import Table

from bench.cli import DB_OPT, _progress, _store, app, build_app, builds_app, console, fail, out
from bench.cli.options import DEVICE_METAVAR, Engine, knob_options, parse_device
from bench.grading import GradeConfig
from datasets_build.config import BuildConfig


def _help(name: str) -> str:
    """The help of BuildConfig's field `name` (a knob that keeps a hand-written option)."""
    from dataclasses import fields

    return next(f for f in fields(BuildConfig) if f.name == name).metadata["help"]


# ------------------------------------------------------------------ build

@build_app.callback()
@knob_options(BuildConfig, panel="Build settings (BuildConfig)", before="out_dir")
def build(ctx: typer.Context,
          model: str = typer.Option("tiny-math", help=_help("model")),
          source: Optional[str] = typer.Option(None, help=_help("source")),
          id_col: str = typer.Option("id", help="Column holding the problem id (else a hash of the text)."),
          problem_col: str = typer.Option("problem", help="Column holding the problem text."),
          answer_col: str = typer.Option("answer", help="Column holding the gold answer."),
          solution_col: str = typer.Option("solution", help="Column whose last \\boxed{} is the gold when the answer "
                                                            "column is missing."),
          engine: Engine = typer.Option(Engine.auto, help="Rollout engine (auto: vllm when importable, else torch)."),
          dtype: str = typer.Option("bf16", help=_help("dtype")),
          band: Optional[Tuple[float, float]] = typer.Option(
              None, metavar="LO HI", show_default=False,
              help="Keep problems with LO <= accuracy <= HI (inclusive at both ends), e.g. --band 0.2 0.8 "
              "(the default)."),
          shard: Optional[str] = typer.Option(None, help=_help("shard")),
          out_dir: Optional[Path] = typer.Option(None, "--out", help=_help("out")),
          device: str = typer.Option("auto", parser=parse_device, metavar=DEVICE_METAVAR,
                                     help="The torch engine's device: auto (cuda when available), cpu, cuda, "
                                     "cuda:i (not part of the build's settings)."),
          ray: bool = typer.Option(False, "--ray", help="Run the shards as Ray tasks (one engine per GPU, or per CPU "
                                   "without GPUs) and merge them; every node must reach the store (--db)."),
          shards: Optional[int] = typer.Option(None, min=1, help="With --ray: number of shards (default: GPUs, else "
                                               "CPUs)."),
          ray_address: Optional[str] = typer.Option(None, help="With --ray: the cluster (default $RAY_ADDRESS, else "
                                                    "a local Ray instance)."),
          as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
          db: Optional[str] = DB_OPT, knobs: dict = None):
    """Build the perfectible split: k rollouts per problem, graded with math-verify; keep the
    problems whose accuracy lies in [lo, hi], both ends inclusive (default [0.2, 0.8])."""
    if ctx.invoked_subcommand is not None:
        return
    from bench.device import resolve_device
    from bench.problems import ColumnMap

    lo, hi = band or (0.2, 0.8)
    cfg = BuildConfig(model=model, source=source, columns=ColumnMap(id_col, problem_col, answer_col, solution_col),
                      engine=engine.value, dtype=dtype, lo=lo, hi=hi, shard=shard, out=out_dir,
                      **{k: v for k, v in knobs.items() if v is not None})
    cfg.validate()                      # every setting checked before the store is opened or a bar drawn
    cfg.device = resolve_device(device)
    from bench.engines import resolve_engine
    from bench.models import resolve_model

    resolve_model(cfg.model)
    resolve_engine(cfg.engine)
    store = _store(db)
    if ray:
        from bench.store import default_url
        from datasets_build.ray_build import ray_build

        with _progress("shards") as prog:
            task = prog.add_task("shards", total=None, rate="")
            manifest = ray_build(db or default_url(), cfg, shards, ray_address,
                                 on_shard=lambda r, done, n: prog.update(
                                     task, completed=done, total=n, rate=f"shard {r['shard']}: {r['build_id']}"))
    else:
        manifest = _build_with_progress(store, cfg)
    if (manifest.get("duplicates") or {}).get("repeated"):
        console.print(f"[yellow]warning:[/] the source repeats problems: {_duplicates_line(manifest['duplicates'])} "
                      "(listed in the manifest's `duplicates`)", highlight=False)
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
    _hint_warmed(cfg.model, c["kept"], n)
    rps = manifest["rollouts_per_s"]
    out.print(f"{manifest['rollouts']} rollouts, {rps:.0f} rollouts/s, "
              f"wall {manifest['wall_s']:.1f}s → {manifest['out_dir']}"
              if rps else
              f"{manifest['rollouts']} rollouts (all resumed), wall {manifest['wall_s']:.1f}s → {manifest['out_dir']}")


def _hint_warmed(model: str, kept: int, problems: int) -> None:
    """A named real model that keeps under a tenth of its problems points to its warmed twin."""
    from bench.model_sources import WARMED
    from bench.warmup import WarmupConfig

    warmed = next((w for w, base in WARMED.items() if base == model), None)
    if warmed and kept < 0.1 * problems:
        console.print(f"[yellow]hint:[/] {model} sampled at T = 1 rarely finishes with a boxed answer; "
                      f"`bench build --model {warmed}` builds it after bench's {WarmupConfig().steps}-step "
                      "answer-format warm-up (docs/build.md)", highlight=False)


def _duplicates_line(dup: dict) -> str:
    if not dup.get("repeated"):
        return f"none ({dup.get('rows')} rows, each text once)"
    conflicting = sum(1 for g in dup.get("groups", []) if "conflicting_answers" in g)
    return (f"{dup['repeated']} problem(s) appear more than once ({dup['extra_rows']} extra rows of "
            f"{dup['rows']}); each counted once" + (f"; {conflicting} with disagreeing golds (the first kept)"
                                                    if conflicting else ""))


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
                out_dir: Optional[Path] = typer.Option(None, "--out",
                                                       help="Output directory (default $BENCH_HOME/builds/<id>)."),
                as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT):
    """Join shards built with `bench build --shard i/n` into one split (all shards complete, same settings)."""
    from datasets_build.merge import merge_shards

    manifest = merge_shards(_store(db), build_ids, out_dir)
    if as_json:
        out.print_json(json.dumps(manifest, default=str))
    else:
        out.print(f"merged {len(manifest['shards'])} shards into build [bold]{manifest['build_id']}[/]: "
                  f"{manifest['counts']['kept']} of {manifest['problems']} kept → {manifest['out_dir']}")

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
            for b in builds_frame(_store(db, read_only=True)).itertuples()]
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

    store = _store(db or (ctx.obj or {}).get("db"), read_only=True)
    with session(store) as s:
        b = s.get(Build, build_id)
        if b is None:
            fail(f"no build {build_id!r}; `bench builds` lists them")
        info = {"id": b.id, "status": b.status, "shard": b.shard, "out_dir": b.out_dir, **(b.manifest or {}),
                "split_hash": b.split_hash}
    if as_json:
        out.print_json(json.dumps(info, default=str))
    else:
        for key in ("id", "status", "model", "engine", "dtype", "source", "k", "band", "counts", "kept_fraction",
                    "rollouts", "rollouts_per_s", "wall_s", "out_dir", "template", "split_hash"):
            if key in info:
                out.print(f"[bold]{key}[/]: {info[key]}", highlight=False)
        dup = info.get("duplicates")
        if dup:
            out.print(f"[bold]duplicates[/]: {_duplicates_line(dup)}", highlight=False)


# ------------------------------------------------------------------ grade

@app.command()
@knob_options(GradeConfig, panel="Grader settings (GradeConfig)", before=None)
def grade(file: Path = typer.Argument(..., help="JSONL with `response` and `gold` on each row."),
          as_json: bool = typer.Option(False, "--json", help="Print a summary object instead of per-row lines."),
          knobs: dict = None):
    """Grade responses against golds with math-verify (process pool, hard timeouts)."""
    from bench.grading import Grader
    from bench.knobs import check

    cfg = check(GradeConfig(**{k: v for k, v in knobs.items() if v is not None}))
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
    with Grader(workers=cfg.workers, timeout=cfg.timeout) as g:
        verdicts = g.grade([r["response"] for r in rows], [str(r["gold"]) for r in rows])
    if as_json:
        counts = Counter(v.status for v in verdicts)
        out.print_json(json.dumps({"rows": len(rows), "accuracy": counts.get("correct", 0) / len(rows),
                                   "counts": counts, "verdicts": [v.to_dict() for v in verdicts]}))
        return
    for i, v in enumerate(verdicts):
        out.print(f"{i}\t{v.status}\t{v.extracted!r}\t{v.reason}", highlight=False, markup=False)
