"""`bench runs`, `bench runs show`, `bench report`, `bench leaderboard`, `bench mismatch`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from bench.cli import DB_OPT, _progress, _store, _user_errors, app, console, fail, out, runs_app
from bench.cli.options import DEVICE_METAVAR, Engine, knob_options, parse_device
from runners.mismatch_config import MismatchConfig


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
    from bench.bundle import BundleError, export_runs
    from bench.signing import SigningError, load_private_key, sign as sign_bundle

    try:
        if sign:
            load_private_key(sign)          # a bad key is bad input before anything is written
    except SigningError as e:
        fail(str(e))
    try:
        manifest = export_runs(_store(db or (ctx.obj or {}).get("db"), read_only=True), run_ids, out_path,
                               window_checkpoints)
    except BundleError as e:
        fail(str(e))
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
    try:
        start, end = parse_window(window) if window else (0, steps)
        plan = plan_verification(store, run_id, end, device, start, checkpoint)
        with _progress("re-running") as prog:
            task = prog.add_task("steps", total=plan.last_step, completed=plan.start, rate="")
            result = run_verification(store, plan, progress=lambda step, total, m: prog.update(task, completed=step))
    except _user_errors() as e:
        fail(str(e))
    if as_json:
        out.print_json(json.dumps(result, default=str))
    else:
        out.print(_verify_text(result), highlight=False, markup=False, soft_wrap=True)
    if result["verdict"] == "differs":
        raise typer.Exit(1)


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
    return head + f"verified {r['steps']} steps, bit-identical"


def _f(x) -> str:
    return "-" if x is None or x != x else f"{x:.3f}"


def _run_info(store, run_id: str) -> dict:
    from sqlalchemy import select

    from bench.fingerprint import fingerprint
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
        return {"id": r.id, "build": r.build_id, "algo": r.algo, "rollout_dtype": r.rollout_dtype,
                "train_dtype": r.train_dtype, "staleness": r.staleness, "trainer": r.trainer, "engine": r.engine,
                "status": r.status,
                "stop_reason": r.stop_reason, "steps": r.step, "wall_s": r.wall_s, "peak_accuracy": r.peak_accuracy,
                "final_accuracy": r.final_accuracy, "steps_to_target": r.steps_to_target,
                "wall_to_target": r.wall_to_target, "kl_warning_step": r.kl_warning_step,
                "config_fp": fingerprint(r.config), "config": r.config,
                "calibration": r.calibration, "provenance": r.provenance,
                "last_step": last.metrics if last else None,
                "evals": [{"step": e.step, "benchmark": e.benchmark, "n": e.n, "score": e.score} for e in evals],
                "verifications": [{"created_at": v.created_at, "device": v.device, "cpu_16bit": v.cpu_16bit,
                                   "steps": v.steps, "compared": v.compared, "differences": v.differences,
                                   "verdict": v.verdict, "tolerance": v.tolerance,
                                   "first_difference": v.first_difference} for v in checks]}


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


@app.command()
def report(csv: Optional[Path] = typer.Option(None, "--csv", help="Also write the table as CSV."),
           as_json: bool = typer.Option(False, "--json", help="One object: the rows (`cells`, or `runs` with "
                                        "--runs), the closing `summary` and the paper's `reference` rows."),
           build_id: Optional[str] = typer.Option(None, "--build"),
           runs: bool = typer.Option(False, "--runs", help="One row per run instead of one per cell."),
           early: bool = typer.Option(False, "--early", help="Instead: each stop rule's shadow decisions over the "
                                      "finished runs (agreement with their verdicts, steps it would have saved); "
                                      "runs from before decisions were recorded are recomputed from their "
                                      "evaluations."),
           db: Optional[str] = DB_OPT):
    """The leaderboard ranking in the terminal, one row per cell (algorithm × precision on a build, with
    one trainer, rollout engine, staleness K and settings fingerprint `config`) over its seeds, each seed's
    verdict recomputed from its evaluations: PASS only when every seed converged (the lower confidence
    bound of split accuracy, pooled over its last evaluations, reached 0.95), FAIL once a rule failed a
    seed, else UNDECIDED; passes k/N with the Clopper–Pearson bound they support, peak accuracy mean
    with a 95% logit-scale t-interval, median steps to pass (min–max), median KL k3. Cells and runs are
    grouped by staleness K (a K column when a run is stale; `staleness` in --json). --runs: one row per
    run with the rule and step that decided it. Then a summary (which cells pass, why each run ended,
    where an undecided run's trend would reach the target, the bf16 ÷ fp16 mismatch ratios) and, apart
    and never ranked, the paper's
    published results for the same algorithm × precision cells."""
    from leaderboard.cells import by_staleness, cells_frame, ranked_cells
    from leaderboard.queries import mismatch_frame, runs_frame
    from leaderboard.reference import matching_rows, paper_offline_mismatch
    from leaderboard.summary import report_summary

    store = _store(db, read_only=True)
    if early:
        from bench.cli.early import print_early

        print_early(store, build_id, as_json)
        return
    frame = runs_frame(store, build_id)
    key = "runs" if runs else "cells"
    if frame.empty and not as_json:
        out.print("no runs yet: run `bench build --model tiny-math`, "
                  "then `bench sweep --algo grpo,pg-seq-is --dtype bf16,fp16`")
        return
    cells = by_staleness(ranked_cells(cells_frame(frame)))
    try:
        mismatch = mismatch_frame(store)
    except Exception:          # a store from before mismatch reports: no offline ratios
        mismatch = None
    summary = report_summary(cells, frame, mismatch)
    from bench.problems import paper_reference

    ref = paper_reference()
    hit, others = matching_rows(zip(cells.algo, cells.precision))
    reference = {"source": ref.get("source"), "rows": hit, "others": others,
                 "offline_mismatch": paper_offline_mismatch(ref)}
    rows = _report_runs(frame, csv, as_json) if runs else _report_cells(cells, csv, as_json)
    if as_json:
        out.print_json(json.dumps({key: rows, "summary": summary, "reference": reference}, default=str))
        return
    _print_summary(summary)
    _print_reference(reference)


_SANITY = {"PASS": "[green]PASS[/]", "FAIL": "[red]FAIL[/]", "UNDECIDED": "[blue]UNDECIDED[/]",
           "RUNNING": "[yellow]RUNNING[/]", "NO VERDICT": "[dim]NO VERDICT[/]"}


def _sanity(verdict) -> str:
    return _SANITY.get(verdict, "[dim]NO VERDICT[/]")


def _write_csv(df, csv: Optional[Path]) -> None:
    if csv:
        try:
            df.to_csv(csv, index=False)
        except OSError as e:
            fail(f"cannot write {csv}: {e.strerror or e}")


def _records(df) -> list[dict]:
    return json.loads(df.to_json(orient="records", double_precision=15)) if not df.empty else []


def _text(x) -> str:
    return x if isinstance(x, str) and x else "-"


def _report_cells(df, csv: Optional[Path], as_json: bool) -> list[dict] | None:
    from bench.fingerprint import short

    flat = df.assign(seeds=df.seeds.map(lambda xs: " ".join("-" if x is None else str(x) for x in xs)),
                     runs=df.runs.map(" ".join)) if not df.empty else df
    _write_csv(flat, csv)
    if as_json:
        return _records(df)
    stale = _stale(df)
    t = Table("#", "algo", "precision", *(["K"] if stale else []), "engine", "config", "sanity", "passes",
              "p(pass) ≥", "peak (mean, 95% logit-t interval)", "steps→pass median (min–max)",
              "KL k3 median", "verified", "seeds", "run")
    for i, r in enumerate(df.itertuples(), 1):
        peak = _f(r.peak_mean) + ("" if r.peak_ci_lo != r.peak_ci_lo else f" [{r.peak_ci_lo:.3f}, {r.peak_ci_hi:.3f}]")
        steps = "-" if r.steps_to_pass_median != r.steps_to_pass_median else (
            f"{r.steps_to_pass_median:g}" + ("" if r.steps_to_pass_min == r.steps_to_pass_max
                                             else f" ({r.steps_to_pass_min:g}–{r.steps_to_pass_max:g})"))
        t.add_row(str(i), r.algo, r.precision, *([str(r.staleness)] if stale else []), _text(r.engine),
                  short(r.config_fp), _sanity(r.sanity),
                  r.passes + (f" ({r.decided})" if isinstance(r.decided, str) else ""),
                  f"≥ {r.pass_lower:.2f}", peak, steps,
                  "-" if r.kl_k3_median != r.kl_k3_median else f"{r.kl_k3_median:.2e}",
                  _text(r.verification),
                  " ".join("-" if x is None else str(x) for x in r.seeds),
                  r.runs[0] if len(r.runs) == 1 else f"{len(r.runs)} runs (--runs)")
    out.print(t)
    out.print("sanity: FAIL once a seed FAILs by a rule, PASS when every seed passes, else UNDECIDED (a seed at its "
              "budget undecided, or stopped by an error); p(pass) ≥: the one-sided 95% Clopper–Pearson lower bound "
              "on a seed's pass probability from k of N (1/1: ≥ 0.05, 3/3: ≥ 0.37, 10/10: ≥ 0.74); peak: mean over "
              "seeds with a two-sided 95% Student-t interval on the logit scale (inside [0, 1]; the plain "
              "t-interval is peak_t_lo/peak_t_hi in --json and --csv); config: the fingerprint of every setting "
              "but the seed (runs differing in any other setting, or in engine, are other cells); verified: what "
              "`bench runs verify` re-ran of the seeds (claimed, partly re-run, deciding window re-run, fully re-run; "
              "a PASS or FAIL is verified from the deciding window up)", highlight=False)
    return None


def _report_runs(frame, csv: Optional[Path], as_json: bool) -> list[dict] | None:
    from bench.fingerprint import short
    from leaderboard.cells import by_staleness
    from leaderboard.queries import decision_text, ranked, report_columns

    df = by_staleness(ranked(frame)[report_columns()]) if not frame.empty else frame
    _write_csv(df, csv)
    if as_json:
        return _records(df)
    stale = _stale(df)
    t = Table("#", "algo", "precision", *(["K"] if stale else []), "engine", "config", "sanity", "decided", "status",
              "peak", "final", "steps→pass", "eval", "KL k3", "max|Δp|", "verified", "steps", "run")
    for i, r in enumerate(df.itertuples(), 1):
        decided = decision_text(r.sanity, r.decided_by, r.decided_step)
        decided = decided[len(r.sanity):].lstrip(": ") or "-"
        if isinstance(r.evidence_problem, str):
            decided += " [red](status not supported)[/]"
        t.add_row(str(i), r.algo, r.precision, *([str(r.staleness)] if stale else []), _text(r.engine),
                  short(r.config_fp), _sanity(r.sanity), decided, r.status,
                  _f(r.peak_accuracy), _f(r.final_accuracy),
                  "-" if r.steps_to_target != r.steps_to_target or r.steps_to_target is None
                  else str(int(r.steps_to_target)),
                  _f(r.best_eval), "-" if r.mean_kl != r.mean_kl or r.mean_kl is None else f"{r.mean_kl:.2e}",
                  "-" if r.max_abs_dp != r.max_abs_dp or r.max_abs_dp is None else f"{r.max_abs_dp:.2e}",
                  _text(r.verification), str(r.steps), r.run)
    out.print(t)
    return None


def _stale(df) -> bool:
    """Whether any row is a stale run (K > 0): the tables then show a K column."""
    return not df.empty and "staleness" in df.columns and bool((df.staleness.fillna(0) > 0).any())


def _ending(run: dict) -> str:
    """How one run ended, in words: the step it passed, or its status, steps and stop reason;
    and the step of the KL early warning when it fired."""
    seed = "" if run["seed"] is None else f"seed {run['seed']}: "
    if run["steps_to_pass"] is not None:
        text = f"converged at step {run['steps_to_pass']}"
    elif run["status"] == "running":
        text = f"running, at step {run['steps']}"
    else:
        text = (f"{run['status']} after {run['steps']} steps"
                + (f" ({run['stop_reason']})" if run["stop_reason"] else ""))
    if run.get("projection"):
        text += f"; undecided: {run['projection']}"
    from leaderboard.queries import LABEL_ONLY

    problem = run.get("evidence_problem")
    if problem:
        text += f"; {problem}" if problem.startswith(LABEL_ONLY) else f"; NOT SUPPORTED BY ITS EVALUATIONS: {problem}"
    if run["kl_warning_step"] is not None:
        text += f"; KL early warning at step {run['kl_warning_step']}"
    return seed + text


def _which(per_cell: list[dict]):
    """A cell's engine and settings fingerprint as a label suffix (" [torch · cfg 1a2b3c]"), or ""
    for every cell when the report's cells all share one engine and one fingerprint."""
    from bench.fingerprint import short

    if len({(c.get("engine"), c.get("config_fp")) for c in per_cell}) < 2:
        return lambda c: ""
    return lambda c: f" [{c.get('engine') or '-'} · cfg {short(c.get('config_fp'))}]"


def _print_summary(summary: dict) -> None:
    from rich.markup import escape

    from leaderboard.summary import conditions_text, ratio_text

    out.print(f"\n[bold]Summary[/]: {summary['pass']} of {summary['cells']} cells pass on every seed "
              f"({summary['fail']} fail by a rule, {summary['undecided']} undecided, {summary['running']} running)",
              highlight=False)
    stale = any(c.get("staleness") for c in summary["per_cell"])
    which = _which(summary["per_cell"])
    for c in summary["per_cell"]:
        endings = "; ".join(_ending(r) for r in c["runs"]) or c["status"]
        k = f" K={c.get('staleness', 0)}" if stale else ""
        decided = f", {c['decided']}" if c.get("decided") else ""
        evidence = c.get("evidence") or c["passes"]
        out.print(f"  {_sanity(c['sanity'])} {escape(c['algo'])} {escape(c['precision'])}{k}"
                  f"{escape(which(c))} ({evidence}{decided}): {escape(endings)}", highlight=False)
    ratios = summary["mismatch_ratios"]
    if ratios:
        out.print("Mismatch, bf16 ÷ fp16 (median over seeds of each run's mean KL k3 over its last tenth):",
                  highlight=False)
        for r in ratios:
            k = f" K={r.get('staleness', 0)}" if stale else ""
            out.print(f"  {escape(r['algo'])}{k}{escape(which(r))}: {_e(r['kl_k3_bf16'])} ÷ {_e(r['kl_k3_fp16'])} = "
                      f"{ratio_text(r['ratio'])}"
                      + ("" if len({x['build'] for x in ratios}) == 1 else f" (build {r['build']})"), highlight=False)
    else:
        out.print("Mismatch, bf16 ÷ fp16: no algorithm has both a bf16 and an fp16 cell here", highlight=False)
    for r in summary["offline_mismatch_ratios"]:
        k1 = f", KL k1 {ratio_text(r.get('ratio_k1'))}" if "ratio_k1" in r else ""
        out.print(f"Offline mismatch (bench mismatch, {escape(str(r['model']))} on {escape(str(r['source']))}; "
                  f"{escape(conditions_text(r))}), "
                  f"bf16 ÷ fp16: KL k3 {_e(r['kl_k3_bf16'])} ÷ {_e(r['kl_k3_fp16'])} = {ratio_text(r['ratio'])}{k1}",
                  highlight=False)


def _e(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def _print_reference(reference: dict) -> None:
    from rich.markup import escape

    rows, others = reference["rows"], reference["others"]
    out.print("\n[bold]Reference[/] — the paper's published results (Qi et al. 2025: DeepSeek-R1-Distill-Qwen-1.5B "
              "on its 1,460-problem split, 8×A100, 2,000+ steps; not ranked with the runs above)", highlight=False)
    if rows:
        t = Table("algo", "precision", "source", "peak train acc", "AIME24", "outcome", "note")
        for r in rows:
            t.add_row(escape(r["algo"] or "(precision ablation)"), r["precision"], escape(r["source"]),
                      _f(r["peak_train_acc"]), escape(r["aime24"] or "-"), escape(r["outcome"] or "-"),
                      escape(r["note"] or ""))
        out.print(t)
    else:
        out.print("  no published result for the algorithm × precision cells of this report", highlight=False)
    m = reference.get("offline_mismatch")
    if m and m.get("ratio_bf16_over_fp16"):
        out.print(f"  paper's offline mismatch, bf16 ÷ fp16: KL {m['kl_bits_bf16']:g} ÷ {m['kl_bits_fp16']:g} bits = "
                  f"{m['ratio_bf16_over_fp16']:.3g}× ({escape(str(m['ratio_as_published']))} as published)",
                  highlight=False)
    if others:
        out.print(f"  {others} more published row(s) for cells not in this report (the Leaderboard page's "
                  "Reference expander lists them all)", highlight=False)


# what `bench leaderboard` passes to Streamlit besides the port, the address and headless: the
# same options as leaderboard/.streamlit/config.toml (which `streamlit run leaderboard/app.py` reads)
STREAMLIT_FLAGS = {"client.toolbarMode": "viewer",          # no Deploy button: a read-only viewer
                   "browser.gatherUsageStats": "false"}


def streamlit_argv(app_path: Path, url: str, port: int, address: str, headless: bool) -> list[str]:
    """The `python -m streamlit run` command line that serves the app at `app_path` on store `url`."""
    flags = [x for key, value in STREAMLIT_FLAGS.items() for x in (f"--{key}", value)]
    return [sys.executable, "-m", "streamlit", "run", str(app_path), "--server.port", str(port),
            "--server.address", address, "--server.headless", str(headless).lower(), *flags, "--", "--db", url]


@app.command()
def leaderboard(db: Optional[str] = DB_OPT, port: int = typer.Option(8501, help="Port to serve on."),
                address: str = typer.Option("127.0.0.1", help="Address to bind."),
                headless: bool = typer.Option(True, help="Do not open a browser."),
                results: Optional[Path] = typer.Option(None, help="Serve a results repository instead (`bench "
                                                       "results`): a store built from its bundles, rebuilt when "
                                                       "they change.")):
    """Serve the Streamlit leaderboard over the store (read-only), or over a results repository."""
    import leaderboard as lb

    from bench.store import default_url

    if results is not None:
        from runners.results_repo import store_url

        try:
            db = store_url(results)
        except _user_errors() as e:
            fail(str(e))
    url = db or default_url()
    _store(url, read_only=True)                   # a bad or empty URL fails here, readably
    app_path = Path(lb.__file__).parent / "app.py"
    cmd = streamlit_argv(app_path, url, port, address, headless)
    console.print(f"leaderboard on http://{address}:{port} (store {url})", highlight=False)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)                 # bench becomes Streamlit: a kill of bench stops the server


def _mismatch_defaults() -> dict[str, dict]:
    from dataclasses import MISSING, fields

    from runners.mismatch_config import MismatchConfig

    return {"mismatch": {f.name: f.default for f in fields(MismatchConfig) if f.default is not MISSING}}


@app.command()
@knob_options(MismatchConfig, defaults=_mismatch_defaults(), panel="Analysis settings (MismatchConfig)",
              before="out_dir")
def mismatch(model: str = typer.Option("tiny-math"), dtype: str = typer.Option("all", help="A pair (fp16, "
             "rollout=fp32,train=bf16), a list of dtypes and pairs separated by ',' or ';', all (35 pairs) or "
             "all16 (the paper's nine)."),
             source: str = typer.Option("synthetic-hard", help="Problems (any `bench build --source`)."),
             engine: Engine = typer.Option(Engine.torch, help="Rollout engine (auto: vllm when importable, else "
                                           "torch)."),
             temperature: float = typer.Option(1.0, help="Must be 1: μ has to be the raw softmax."),
             top_p: float = typer.Option(1.0, help="Must be 1: μ has to be the raw softmax."),
             out_dir: Optional[Path] = typer.Option(None, "--out"),
             device: str = typer.Option("auto", parser=parse_device, metavar=DEVICE_METAVAR,
                                        help="Both engines' device (torch rollout engine and the training "
                                        "engine's scoring): auto (cuda when available), cpu, cuda, cuda:i."),
             as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT, knobs: dict = None):
    """Offline training–inference mismatch (the paper's Figure 2): μ from the rollout engine,
    π from the training engine, on the same sampled tokens."""
    from bench.device import resolve_device
    from bench.knobs import check
    from bench.precision import Precision, parse_list
    from runners.offline_mismatch import analyse

    if temperature != 1.0 or top_p != 1.0:
        fail("bench mismatch samples at temperature 1 and top-p 1 only: otherwise μ is the log-probability of "
             "a reshaped distribution, not the model's softmax (TRL #6789, #4159)")
    cfg = check(MismatchConfig(model=model, source=source, engine=engine.value, out=out_dir,
                               **{k: v for k, v in knobs.items() if v is not None}))
    pairs = [Precision.parse(dtype)] if "=" in dtype and ";" not in dtype else parse_list(dtype)
    cfg.device = resolve_device(device)
    store = _store(db)
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
