"""`bench report`: the ranking of cells (or runs), the summary and the paper's reference rows in
the terminal, as JSON or CSV (leaderboard/cells.py, leaderboard/summary.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from bench.cli import DB_OPT, _store, app, fail, fmt3 as _f, out


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
    from leaderboard.queries import runs_frame
    from leaderboard.summary import report_data

    store = _store(db, read_only=True)
    if early:
        from bench.cli.report_early import print_early

        print_early(store, build_id, as_json)
        return
    frame = runs_frame(store, build_id)
    key = "runs" if runs else "cells"
    if frame.empty and not as_json:
        out.print("no runs yet: run `bench build --model tiny-math`, "
                  "then `bench sweep --algo grpo,pg-seq-is --dtype bf16,fp16`")
        return
    cells, ranked_runs, summary, reference = report_data(store, frame)
    rows = _report_runs(ranked_runs, csv, as_json) if runs else _report_cells(cells, csv, as_json)
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


def _text(x) -> str:
    return x if isinstance(x, str) and x else "-"


def _report_cells(df, csv: Optional[Path], as_json: bool) -> list[dict] | None:
    from bench.fingerprint import short
    from leaderboard.summary import records

    flat = df.assign(seeds=df.seeds.map(lambda xs: " ".join("-" if x is None else str(x) for x in xs)),
                     runs=df.runs.map(" ".join)) if not df.empty else df
    _write_csv(flat, csv)
    if as_json:
        return records(df)
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
                  f"≥ {r.pass_lower:.2f}", peak, steps, _e(r.kl_k3_median), _text(r.verification),
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


def _report_runs(df, csv: Optional[Path], as_json: bool) -> list[dict] | None:
    """`df`: the ranked runs (leaderboard/summary.py report_data)."""
    from bench.fingerprint import short
    from leaderboard.queries import decision_text
    from leaderboard.summary import records

    _write_csv(df, csv)
    if as_json:
        return records(df)
    stale = _stale(df)
    t = Table("#", "algo", "precision", *(["K"] if stale else []), "engine", "config", "sanity", "decided", "status",
              "peak", "final", "steps→pass", "eval", "KL k3", "max|Δp|", "verified", "steps", "run")
    for i, r in enumerate(df.itertuples(), 1):
        decided = decision_text(r.sanity, r.decided_by, r.decided_step)
        decided = decided[len(r.sanity):].lstrip(": ") or "-"
        if isinstance(r.evidence_problem, str):
            decided += " [red](status not supported)[/]"
        to_pass = ("-" if r.steps_to_target != r.steps_to_target or r.steps_to_target is None
                   else str(int(r.steps_to_target)))
        t.add_row(str(i), r.algo, r.precision, *([str(r.staleness)] if stale else []), _text(r.engine),
                  short(r.config_fp), _sanity(r.sanity), decided, r.status, _f(r.peak_accuracy),
                  _f(r.final_accuracy), to_pass, _f(r.best_eval), _e(r.mean_kl), _e(r.max_abs_dp),
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
    """A number as 2.3e-04, "-" for a missing one (None or NaN)."""
    return "-" if x is None or x != x else f"{x:.2e}"


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
