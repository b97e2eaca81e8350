"""`bench runs …`: list, show, export, import and verify stored runs (bench/bundle.py,
runners/verify.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from bench.cli import DB_OPT, _progress, _store, fail, fmt3 as _f, out, runs_app
from bench.cli.options import knob_options
from runners.heldback import HeldBackConfig


@runs_app.callback()
def runs(ctx: typer.Context, as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT):
    """List runs, newest first."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"db": db}
        return
    from leaderboard.queries import runs_frame

    df = runs_frame(_store(db, read_only=True))
    if as_json:
        df = df.drop(columns=["config"], errors="ignore")          # `bench runs show RUN --json` has it
        out.print_json(df.to_json(orient="records", date_format="iso") if not df.empty else "[]")
        return
    if df.empty:
        out.print("no runs yet: run `bench run --algo pg-seq-is --dtype fp16`")
        return
    t = Table("run", "algo", "precision", "status", "steps", "peak", "final", "build")
    for r in df.itertuples():
        t.add_row(r.run, r.algo, r.precision, r.status, str(r.steps), _f(r.peak_accuracy), _f(r.final_accuracy),
                  r.build)
    out.print(t)


@runs_app.command("export")
def runs_export(ctx: typer.Context,
                run_ids: List[str] = typer.Argument(..., help="Runs to export (`bench runs` lists them)."),
                out_path: Path = typer.Option(..., "--out", help="The bundle to write, e.g. bundle.tar.gz."),
                window_checkpoints: bool = typer.Option(False, help="Carry each run's checkpoint kept at the start "
                                                        "of its deciding window (--keep-checkpoints), so the receiver "
                                                        "can re-run that window (bench runs verify --window)."),
                sign: Optional[Path] = typer.Option(None, help="Sign the bundle with this ed25519 private key (PEM; "
                                                    "`bench results keygen NAME`)."),
                signer: Optional[str] = typer.Option(None, help="The name the signature claims (default: the key "
                                                     "file's name); a results repository checks it against its "
                                                     "keyring's NAME.pub."),
                db: Optional[str] = DB_OPT):
    """Write runs to a self-contained bundle: run rows, steps, evaluations, calibration, provenance,
    config and seed, state digests, and each build's kept split (ids, golds, base accuracy, n) with
    its split hash; optionally the deciding windows' checkpoints and a signature."""
    from bench.bundle import export_runs
    from bench.signing import SigningError, load_private_key, sign as sign_bundle

    if sign:
        load_private_key(sign)              # a bad key is bad input before anything is written
    manifest = export_runs(_store(db or (ctx.obj or {}).get("db"), read_only=True), run_ids, out_path,
                           window_checkpoints)
    try:
        signed = sign_bundle(out_path, sign, signer or sign.stem) if sign else None
    except SigningError as e:
        out_path.unlink()                  # the bundle just written: an unsigned copy was not asked for
        fail(str(e))
    out.print(f"{len(manifest['runs'])} run(s) on {len(manifest['builds'])} build(s) → {out_path} (split hash "
              + ", ".join(h[:12] for h in manifest["split_hashes"].values()) + ")"
              + (f", signed by {signed['signer']}" if signed else ""), highlight=False)
    for rid, step in (manifest.get("window_checkpoints") or {}).items():
        if step is None:
            out.print(f"run {rid}: no checkpoint carried (its deciding window starts at step 0, or none was kept at "
                      "its start: `bench run --keep-checkpoints K`): it can be re-run from step 0 only",
                      highlight=False)


@runs_app.command("import")
def runs_import(ctx: typer.Context, bundle: Path = typer.Argument(..., help="A bundle from `bench runs export`."),
                as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT):
    """Load a bundle into this store (SQLite or PostgreSQL) in one transaction. Importing twice changes
    nothing; a build of the same id with another split hash, a malformed or altered bundle, a copy of a
    stored run that changes its identity (algorithm, formats, trainer, engine, seed, staleness, config,
    model, build, created_at), or a further-along copy that does not keep every stored step, evaluation
    and calibration bit for bit, is refused and the store left unchanged. The bundle's sha256 sums
    detect corruption, not tampering (they sit unsigned beside what they cover): `bench runs verify
    RUN` re-runs a run's first steps and compares every stored number."""
    from bench.bundle import BundleError, import_bundle

    store = _store(db or (ctx.obj or {}).get("db"))
    try:
        summary = import_bundle(store, bundle)
    except BundleError as e:
        fail(f"bundle {bundle} refused: {e}")
    if as_json:
        out.print_json(json.dumps(summary))
        return
    out.print(f"imported {bundle}: runs {len(summary['runs_added'])} added, {len(summary['runs_updated'])} updated, "
              f"{len(summary['runs_present'])} already present; builds {len(summary['builds_added'])} added, "
              f"{len(summary['builds_present'])} already present", highlight=False)


@runs_app.command("verify")
def runs_verify(ctx: typer.Context, run_id: str = typer.Argument(..., help="A native run (`bench runs` lists them)."),
                steps: int = typer.Option(3, "--steps", help="Re-run and compare the first N steps (the step-0 "
                                          "calibration and evaluations too)."),
                window: Optional[str] = typer.Option(None, help="A:B: re-run steps A+1..B from the checkpoint the "
                                                     "run kept at step A (--keep-checkpoints) and compare them and "
                                                     "the state digest at B; A = 0 is --steps B."),
                checkpoint: Optional[Path] = typer.Option(None, help="With --window: the checkpoint of step A, where "
                                                          "the run's own checkpoint directory does not hold it (it "
                                                          "must hash to the run's state digest at A)."),
                device: Optional[str] = typer.Option(None, help="Where to re-run: default the device the run "
                                                     "recorded; elsewhere the comparison is within a tolerance."),
                as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT):
    """Is this result real? Re-run the first N steps of a stored or imported native run from its build,
    config and seed (the trainer's own code path, into a scratch store) and compare every stored per-step
    metric, evaluation and the calibration: bit-identical on the device and CPU kind the run recorded
    (CPU: its 16-bit kernel path), within a stated tolerance elsewhere. Exit 1 and the first differing
    step and metric when anything differs; every verification is stored and shown by the leaderboard.
    This, not the bundle's checksums, is the answer to an edited bundle. Timing metrics are not
    compared. `--window A:B` re-runs a later window from a checkpoint the run kept at A."""
    from runners.verify import parse_window, plan_verification, run_verification

    store = _store(db or (ctx.obj or {}).get("db"))
    start, end = parse_window(window) if window else (0, steps)
    plan = plan_verification(store, run_id, end, device, start, checkpoint)
    with _progress("re-running") as prog:
        task = prog.add_task("steps", total=plan.last_step, completed=plan.start, rate="")
        result = run_verification(store, plan, progress=lambda step, total, m: prog.update(task, completed=step))
    if as_json:
        out.print_json(json.dumps(result, default=str))
    else:
        out.print(_verify_text(result), highlight=False, markup=False, soft_wrap=True)
    if result["verdict"] == "differs":
        raise typer.Exit(1)


@runs_app.command("heldback")
@knob_options(HeldBackConfig, panel="Held-back problems (HeldBackConfig)", before="as_json")
def runs_heldback(ctx: typer.Context, run_id: str = typer.Argument(..., help="A native run whose checkpoint "
                                                                   "directory is on this machine."),
                  source: Optional[str] = typer.Option(None, help="Problems (any `bench build --source`); default: "
                                                       "the build's own source."),
                  as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT, knobs: dict = None):
    """Did the run learn the task or its split? The base model and the run's last checkpoint answer
    the same held-back problems (the build's source drawn at another seed, every problem the build
    screened left out) with the same sampling seeds, through the run's rollout engine and format:
    accuracy, pass@n and the paired difference over problems with its 95% interval
    (runners/heldback.py). Nothing is written to the store."""
    from bench.knobs import check
    from runners.heldback import evaluate_held_back

    cfg = check(HeldBackConfig(source=source, **{k: v for k, v in knobs.items() if v is not None}))
    store = _store(db or (ctx.obj or {}).get("db"), read_only=True)
    with _progress("answering") as prog:
        task = prog.add_task("policies", total=2, rate="")
        r = evaluate_held_back(store, run_id, cfg, progress=lambda done, total: prog.update(task, completed=done))
    if as_json:
        out.print_json(json.dumps(r))
        return
    out.print(_heldback_text(r), highlight=False)
    t = Table("policy", "accuracy", f"pass@{cfg.n}")
    t.add_row("base (step 0)", _f(r["base"]["accuracy"]), _f(r["base"]["pass_at_n"]))
    t.add_row(f"trained (step {r['step']})", _f(r["trained"]["accuracy"]), _f(r["trained"]["pass_at_n"]))
    out.print(t)
    d = r["difference"]
    ci = "no interval" if d["lo"] is None else f"95% CI {d['lo']:+.3f} to {d['hi']:+.3f}"
    out.print(f"trained − base: {d['mean']:+.3f} ({ci}, paired over problems); {r['wall_s']:.0f} s", highlight=False)


def _heldback_text(r: dict) -> str:
    """What a held-back evaluation answered, in words."""
    drawn = f"draw seed {r['draw_seed']}" if r["draw_seed"] is not None else "its rows in order"
    text = (f"run {r['run']} ({r['algo']}, {r['precision']}) on {r['problems']} held-back problems of {r['source']} "
            f"({drawn}; {r['left_out']} that the build screened left out), avg@{r['settings']['n']}:")
    if not r["screened_all"]:
        text += (f"\nnote: this store holds only {r['screened']} of the build's screened problems (an imported build "
                 "keeps its split only): problems it dropped as too easy or too hard may be among these")
    return text


def _verify_text(r: dict) -> str:
    """One verification in words: what was re-run where, the criterion, the verdict or the first
    difference."""
    from runners.verify import kind_text

    start = r.get("window_start") or 0
    window = (f"steps 0–{r['steps']}" if not start else
              f"steps {start + 1}–{r['steps']} from its checkpoint at step {start}") + (
        "" if r["steps"] == r["requested_steps"] else f" (the run has {r['steps']} steps)")
    where = f"on {kind_text(r['here'])}"
    if r["same_kind"]:
        criterion = "bit-identical required (the device and CPU kind the run recorded)"
    else:
        criterion = (f"the run recorded {kind_text(r['recorded'])}, so each number must agree within "
                     f"{r['tolerance']}")
    head = f"run {r['run']}: re-ran {window} {where}; {r['compared']} values compared; {criterion}: "
    if r["verdict"] == "differs":
        d = r["first_difference"]
        text = (head + f"DIFFERS at step {d['step']}, {d['metric']}: stored {d['stored']!r}, re-run "
                f"{d['replayed']!r} ({r['differences']} of {r['compared']} values differ)")
        if not r["same_kind"]:
            text += ("; on another device or CPU kind the 16-bit kernels round otherwise and sampled tokens can "
                     "change, so this alone does not show tampering: verify where the run ran for the "
                     "bit-identical check")
        mine, theirs = r.get("bench_here"), r.get("bench_recorded")
        if mine and theirs and mine != theirs:
            text += (f"; the run was made by bench {theirs[:12]}, this is {mine[:12]}: a change to the trainer "
                     "in between can also explain it")
        return text
    if r["verdict"] == "within-tolerance":
        return head + (f"verified {r['steps']} steps within tolerance ({r['exact_differences']} values differ in "
                       "their last digits)")
    note = r.get("digests")
    return head + f"verified {r['steps']} steps, bit-identical" + (
        f" (state digests {note}: the run was stored before digest scheme 2, whose digests a re-run can match; "
        "every metric and evaluation was compared)" if note and note.startswith("not comparable") else "")


def _run_info(store, run_id: str) -> dict:
    from sqlalchemy import select

    from bench.fingerprint import fingerprint
    from bench.statuses import last_sign, live_status
    from bench.store import Eval, Run, RunStep, RunVerification, session

    with session(store) as s:
        r = s.get(Run, run_id)
        if r is None:
            fail(f"no run {run_id!r}; `bench runs` lists them")
        last = s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step.desc())).first()
        evals = s.execute(select(Eval.step, Eval.benchmark, Eval.n, Eval.score).where(Eval.run_id == run_id)
                          .order_by(Eval.step)).all()
        checks = s.scalars(select(RunVerification).where(RunVerification.run_id == run_id)
                           .order_by(RunVerification.created_at.desc(), RunVerification.id.desc())).all()
        sign = last_sign(r.heartbeat_at, r.updated_at)
        status = live_status(r.status, sign)
        return {"id": r.id, "build": r.build_id, "algo": r.algo, "rollout_dtype": r.rollout_dtype,
                "train_dtype": r.train_dtype, "staleness": r.staleness, "trainer": r.trainer, "engine": r.engine,
                "status": status,
                "stop_reason": r.stop_reason if status == r.status
                else f"no heartbeat since {sign:%Y-%m-%d %H:%M} UTC: its process is gone; "
                     f"`bench run --resume {r.id}` continues it",
                "steps": r.step, "wall_s": r.wall_s, "peak_accuracy": r.peak_accuracy,
                "final_accuracy": r.final_accuracy, "steps_to_target": r.steps_to_target,
                "wall_to_target": r.wall_to_target, "kl_warning_step": r.kl_warning_step,
                "config_fp": fingerprint(r.config), "config": r.config,
                "calibration": r.calibration, "provenance": r.provenance,
                "last_step": last.metrics if last else None,
                "evals": [{"step": e.step, "benchmark": e.benchmark, "n": e.n, "score": e.score} for e in evals],
                "verifications": [{"created_at": v.created_at, "device": v.device, "cpu_16bit": v.cpu_16bit,
                                   "steps": v.steps, "compared": v.compared, "differences": v.differences,
                                   "verdict": v.verdict, "tolerance": v.tolerance,
                                   "first_difference": v.first_difference, "window_start": v.window_start,
                                   "digests": v.digests} for v in checks]}


@runs_app.command("show")
def runs_show(ctx: typer.Context, run_id: str, as_json: bool = typer.Option(False, "--json"),
              db: Optional[str] = DB_OPT):
    """Show one run: settings, status, evaluations and its last step's metrics."""
    from runners.presets import config_diff

    info = _run_info(_store(db or (ctx.obj or {}).get("db"), read_only=True), run_id)
    preset, diff = config_diff(info["config"])
    info["config_diff"] = None if diff is None else {"preset": preset, "changed": [
        {"key": k, "preset": a, "run": b} for k, a, b in diff]}
    if as_json:
        out.print_json(json.dumps(info, default=str))
        return
    for k, v in info.items():
        if k not in ("config", "last_step", "evals", "calibration", "provenance", "verifications"):
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
    from leaderboard.verified import run_text

    v = (info["verifications"] or [None])[0]
    where = "" if v is None else f" ({v['device']}" + (f", 16-bit path {v['cpu_16bit']}" if v["cpu_16bit"] else "") \
        + f", {v['created_at']:%Y-%m-%d %H:%M})"
    out.print(f"[bold]verified[/]: {run_text(v)}{where}", highlight=False, markup=True)
    _print_config_diff(preset, diff)


def _print_config_diff(preset, diff) -> None:
    """What else changed: the run's stored config against its preset's defaults."""
    from rich.markup import escape

    if diff is None:
        out.print(f"[bold]config[/]: no known preset recorded ({escape(str(preset))}); `--json` shows the config",
                  highlight=False)
    elif not diff:
        out.print(f"[bold]config[/]: preset {preset}'s defaults, nothing changed", highlight=False)
    else:
        out.print(f"[bold]config vs preset {preset}[/] ({len(diff)} changed):", highlight=False)
        for key, default, value in diff:
            out.print(f"  {escape(key)}: {escape(repr(default))} → {escape(repr(value))}", highlight=False)
