"""A static leaderboard: the report's numbers as HTML pages any static host serves (`bench publish`).

    SITE/index.html          the ranking (cells over seeds, as `bench report`), the precision grid
                             per algorithm, the corrections' rescue table (leaderboard/corrections.py),
                             the verdicts' evidence and verification level, who signed,
                             then — apart, never ranked — the paper's reference rows
    SITE/runs/RUN.html       one run: verdict, deciding rule and step, deciding window, verification,
                             signer, the split-accuracy / reward / KL curves and its mismatch
    SITE/runs/RUN.png        its curves
    SITE/data.json           `bench report --json`'s cells, summary and reference, and the runs

No script, no server, no network: the numbers are in the HTML. Every number a table shows also
sits in its cell's `data-value` (repr, full precision) under `data-field`, so a reader — or a test
— can check the page against `bench report --json` on the same store.
"""

from __future__ import annotations

import html
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from bench.store import open_store

from .colours import VERDICT_COLOURS, VERDICT_MARKS
from .queries import run_evals, run_steps, runs_frame
from .summary import records, report_data

CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:left}th{background:#f4f4f4}
.num{text-align:right;font-variant-numeric:tabular-nums}.ref td{color:#555}h2{margin-top:1.6em}.note{color:#555;
font-size:13px;max-width:70em}"""


def _esc(x) -> str:
    return html.escape("" if x is None else str(x))


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _td(field: str, value, text: str | None = None, css: str = "") -> str:
    """A cell showing `text` (default: the value) with the value itself in data-value."""
    shown = "–" if _missing(value) and text is None else (text if text is not None else str(value))
    data = "" if _missing(value) else f' data-value="{_esc(repr(value) if isinstance(value, float) else value)}"'
    return f'<td data-field="{field}"{data} class="{css}">{_esc(shown)}</td>'


def _verdict_td(verdict: str) -> str:
    fill, ink = VERDICT_COLOURS.get(verdict, VERDICT_COLOURS["NO VERDICT"])
    return (f'<td data-field="sanity" data-value="{_esc(verdict)}" style="background:{fill};color:{ink};'
            f'font-weight:600">{_esc(verdict)}</td>')


def _cell_td(field: str, c, extra: str = "") -> str:
    """One cell's square in a table: its verdict's colours and mark, k/N seeds passed, then `extra`."""
    fill, ink = VERDICT_COLOURS.get(c.sanity, VERDICT_COLOURS["NO VERDICT"])
    return (f'<td data-field="{field}" data-value="{_esc(c.sanity)}" style="background:{fill};color:{ink}">'
            f'{VERDICT_MARKS.get(c.sanity, "")} {_esc(c.passes)}{extra}</td>')


def _first(rows: pd.DataFrame):
    """The first row of `rows`, None where there is none."""
    return None if rows.empty else rows.iloc[0]


def _squares(field: str, cells: list, empty: str, extra=lambda c: "") -> str:
    """A table row's squares: `_cell_td` of each cell (with `extra(cell)`), `empty` where it is None."""
    return "".join(empty if c is None else _cell_td(field, c, extra(c)) for c in cells)


def _number(x, digits=3) -> str | None:
    return None if _missing(x) else f"{x:.{digits}f}"


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_esc(title)}</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>\n")


def _ranking(cells: pd.DataFrame, signers: dict[str, str | None]) -> str:
    rows = []
    for i, c in enumerate(cells.itertuples(), 1):
        peak = None if _missing(c.peak_mean) else (
            f"{c.peak_mean:.3f}" + ("" if _missing(c.peak_ci_lo) else f" [{c.peak_ci_lo:.3f}, {c.peak_ci_hi:.3f}]"))
        steps = None if _missing(c.steps_to_pass_median) else (
            f"{c.steps_to_pass_median:g}" + ("" if c.steps_to_pass_min == c.steps_to_pass_max
                                             else f" ({c.steps_to_pass_min:g}–{c.steps_to_pass_max:g})"))
        who = sorted({signers.get(r) or "unsigned" for r in c.runs})
        links = " ".join(f'<a href="runs/{_esc(r)}.html">{_esc(r)}</a>' for r in c.runs)
        rows.append(f'<tr data-cell="{i}">' + "".join([
            f"<td>{i}</td>", _td("model", c.model), _td("algo", c.algo), _td("precision", c.precision),
            _td("build", c.build), _td("engine", c.engine), _verdict_td(c.sanity), _td("passes", c.passes),
            _td("pass_lower", c.pass_lower, f"≥ {c.pass_lower:.2f}", "num"), _td("peak_mean", c.peak_mean, peak, "num"),
            _td("steps_to_pass_median", c.steps_to_pass_median, steps, "num"),
            _td("kl_k3_median", c.kl_k3_median, None if _missing(c.kl_k3_median) else f"{c.kl_k3_median:.2e}", "num"),
            _td("verification", c.verification), f'<td data-field="signers">{_esc(", ".join(who))}</td>',
            f"<td>{links}</td>"]) + "</tr>")
    head = ("<tr><th>#</th><th>model</th><th>algorithm</th><th>precision (μ→π)</th><th>build</th><th>engine</th>"
            "<th>sanity</th><th>passes</th><th>p(pass) ≥</th><th>peak (mean, 95% logit-t interval)</th>"
            "<th>steps→pass median (min–max)</th><th>KL k3 median</th><th>verified</th><th>signed by</th>"
            "<th>runs</th></tr>")
    return f'<table id="ranking">{head}{"".join(rows)}</table>'


def _grids(cells: pd.DataFrame) -> str:
    out = []
    for (model, algo, build), g in cells.groupby(["model", "algo", "build"], sort=False):
        split = g.precision.str.split("→")
        g = g.assign(rollout=split.str[0], train=split.str[-1])
        rollouts, trains = list(dict.fromkeys(g.rollout)), list(dict.fromkeys(g.train))
        rows = []
        for r in rollouts:
            tds = _squares("grid", [_first(g[(g.rollout == r) & (g.train == t)]) for t in trains], "<td></td>")
            rows.append(f"<tr><th>{_esc(r)}</th>{tds}</tr>")
        head = "<tr><th>rollout μ \\ train π</th>" + "".join(f"<th>{_esc(t)}</th>" for t in trains) + "</tr>"
        out.append(f"<h3>{_esc(model)} · {_esc(algo)} · build {_esc(build)}</h3><table class=grid>{head}"
                   f"{''.join(rows)}</table>")
    return "".join(out)


def _corrections(cells: pd.DataFrame) -> str:
    """The rescue table (leaderboard/corrections.py) of every build, trainer, engine and settings that
    has a failing pair: one row per algorithm, one column per failing pair."""
    from .corrections import describe, rescue_frame

    out = []
    flat = cells[cells.staleness == 0] if "staleness" in cells else cells
    for (build, trainer, engine, fp), g in flat.groupby(["build", "trainer", "engine", "config_fp"], sort=False):
        table = rescue_frame(g)
        if table.empty:
            continue
        pairs = list(dict.fromkeys(table.precision))
        rows = []
        for algo, a in table.groupby("algo", sort=False):
            tds = _squares("rescue", [c if c.n_seeds else None for c in (a[a.precision == p].iloc[0] for p in pairs)],
                           '<td data-field="rescue"></td>', lambda c: f" {_esc(_number(c.peak_mean))}")
            rows.append(f"<tr><th>{_esc(algo)}</th><td>{_esc(describe(algo))}</td>{tds}</tr>")
        head = "<tr><th>algorithm</th><th>anchor, unit, kind</th>" + "".join(f"<th>{_esc(p)}</th>" for p in pairs)
        out.append(f"<h3>build {_esc(build)} · {_esc(trainer)} · {_esc(engine)} · cfg {_esc(str(fp)[:6])}</h3>"
                   f"<table class=rescue>{head}</tr>{''.join(rows)}</table>")
    return "".join(out) or "<p class=note>No paper algorithm's cell FAILs yet: nothing to rescue.</p>"


def _tolerance(frame: pd.DataFrame) -> str:
    """The tolerance table (leaderboard/tolerance.py) of every build, engine and settings with ladder
    cells among the runs `frame` (`runs_frame`; the cells pooled as a search pools them, extended seeds
    in their rung's cell): one row per algorithm, one column per rung run, and its tolerance."""
    from bench.formats import LADDER

    from .tolerance import ladder_tables

    out = []
    for (build, engine, fp), ladder, tol in ladder_tables(frame):
        rungs = [r for r in LADDER if r in set(ladder.rung)]
        tol = tol.set_index("algo")
        rows = []
        for algo, a in ladder.groupby("algo", sort=False):
            tds = _squares("rung", [_first(a[a.rung == rung]) for rung in rungs], '<td data-field="rung"></td>')
            t = tol.loc[algo]
            name = "none" if _missing(t.tolerance) else t.tolerance
            k3 = "-" if _missing(t.k3) else f"{t.k3:.2g}"
            rows.append(f"<tr><th>{_esc(algo)}</th>{tds}<td data-field=tolerance>{_esc(name)}</td>"
                        f"<td>{k3}</td></tr>")
        head = ("<tr><th>algorithm</th>" + "".join(f"<th>{_esc(r)}</th>" for r in rungs)
                + "<th>tolerance</th><th>k3 there</th></tr>")
        out.append(f"<h3>build {_esc(build)} · {_esc(engine)} · cfg {_esc(str(fp)[:6])}</h3>"
                   f"<table class=rescue>{head}{''.join(rows)}</table>")
    return "".join(out) or "<p class=note>No cell on the precision ladder yet (<code>bench tolerance</code>).</p>"


def _reference(hit: list[dict]) -> str:
    if not hit:
        return "<p class=note>No published row matches these cells.</p>"
    cols = ["algo", "precision", "source", "peak_train_acc", "aime24", "outcome", "note"]
    rows = "".join("<tr>" + "".join(_td(k, r.get(k)) for k in cols) + "</tr>" for r in hit)
    return f'<table id="reference" class=ref><tr>{"".join(f"<th>{k}</th>" for k in cols)}</tr>{rows}</table>'


def _curves(steps: pd.DataFrame, evals: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
    split = evals[evals.benchmark == "split"] if not evals.empty else evals
    if not split.empty:
        axes[0].plot(split.step, split.score, marker="o", ms=3)
        axes[0].axhline(0.95, color="grey", lw=0.8, ls="--")
    axes[0].set(title="split accuracy", xlabel="step")
    if not steps.empty:
        axes[1].plot(steps.step, steps.reward)
        if "kl_k3" in steps and steps.kl_k3.notna().any():
            axes[2].plot(steps.step, steps.kl_k3.clip(lower=1e-12))
            axes[2].set_yscale("log")
    axes[1].set(title="training reward", xlabel="step")
    axes[2].set(title="mismatch KL k3 (μ‖π)", xlabel="step")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _run_page(r: dict, signer: str | None, steps: pd.DataFrame, evals: pd.DataFrame, out: Path) -> str:
    rows = [("sanity", r["sanity"]), ("status", r["status"]), ("decided by", r.get("decided_by")),
            ("decided at step", r.get("decided_step")), ("deciding window", r.get("deciding_window")),
            ("verification", r.get("verification")), ("signed by", signer or "unsigned"),
            ("peak split accuracy", r.get("peak_accuracy")), ("final split accuracy", r.get("final_accuracy")),
            ("steps to pass", r.get("steps_to_target")), ("steps", r.get("steps")),
            ("KL k3 (mean, last tenth)", r.get("mean_kl")), ("max |Δp| (last tenth)", r.get("max_abs_dp")),
            ("log-ratio slope per 1k tokens", r.get("log_ratio_slope")), ("config", r.get("config_fp")),
            ("build", r.get("build")), ("model", r.get("model"))]
    fields = {"sanity": "sanity", "status": "status", "peak split accuracy": "peak_accuracy",
              "final split accuracy": "final_accuracy", "steps to pass": "steps_to_target", "steps": "steps",
              "KL k3 (mean, last tenth)": "mean_kl", "verification": "verification"}
    body = "".join(f"<tr><th>{_esc(k)}</th>" + (_verdict_td(v) if k == "sanity" else _td(
        fields.get(k, k), v, f"{v:.4g}" if isinstance(v, float) and not _missing(v) else None)) + "</tr>"
        for k, v in rows)
    problem = (f'<p class=note style="color:#b2182b">The stored status is not what the evaluations say: '
               f'{_esc(r["evidence_problem"])}</p>' if isinstance(r.get("evidence_problem"), str) else "")
    _curves(steps, evals, out / f"{r['run']}.png", f"{r['algo']} {r['precision']} — run {r['run']}")
    return _page(f"run {r['run']}", f'<p><a href="../index.html">← leaderboard</a></p><h1>{_esc(r["algo"])} '
                 f'{_esc(r["precision"])} — run {_esc(r["run"])}</h1>{problem}<table id="run">{body}</table>'
                 f'<img src="{_esc(r["run"])}.png" alt="curves" width=1040>')


def write_site(url: str, out_dir: Path, title: str = "bench leaderboard",
               signers: dict[str, str | None] | None = None) -> int:
    """Write the static site of the store at `url` to `out_dir`; returns the number of pages."""
    signers = signers or {}
    store = open_store(url)
    frame = runs_frame(store)
    cells, runs, summary, reference = report_data(store, frame)
    out_dir, run_dir = Path(out_dir), Path(out_dir) / "runs"
    run_dir.mkdir(parents=True, exist_ok=True)
    run_records = records(runs)
    data = {"cells": records(cells), "runs": run_records, "summary": summary, "reference": reference,
            "signers": signers}
    (out_dir / "data.json").write_text(json.dumps(data, indent=1, default=str))
    ids = [r["run"] for r in run_records]
    steps, evals = (run_steps(store, ids), run_evals(store, ids)) if ids else (pd.DataFrame(), pd.DataFrame())
    for r in run_records:
        mine = steps[steps.run_id == r["run"]] if not steps.empty else steps
        theirs = evals[evals.run_id == r["run"]] if not evals.empty else evals
        (run_dir / f"{r['run']}.html").write_text(_run_page(r, signers.get(r["run"]), mine, theirs, run_dir))
    counts = {v: int((cells.sanity == v).sum()) if not cells.empty else 0 for v in ("PASS", "FAIL", "UNDECIDED")}
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = (f"<h1>{_esc(title)}</h1><p class=note>{len(cells)} cells over {len(run_records)} runs: "
            f"{counts['PASS']} PASS, {counts['FAIL']} FAIL by a rule, {counts['UNDECIDED']} UNDECIDED. Written "
            f"{when} by <code>bench publish</code>; the numbers are <code>bench report --json</code>'s "
            f"(<a href=data.json>data.json</a>).</p>"
            "<p class=note>sanity: FAIL once a seed FAILs by a rule, PASS when every seed passes, else UNDECIDED; "
            "p(pass) ≥: the one-sided 95% Clopper–Pearson bound on a seed's pass probability from k of N; peak: "
            "mean over seeds with a 95% t-interval on the logit scale; verified: what was re-run of the seeds "
            "(claimed, partly re-run, deciding window re-run, fully re-run) — a verdict is verified only from its "
            "deciding window up; signed by: whose ed25519 signature the results repository's keyring accepted.</p>"
            f"<h2>Ranking</h2>{_ranking(cells, signers)}<h2>Precision grid</h2>{_grids(cells)}"
            "<h2>Corrections</h2><p class=note>Each pair where a paper algorithm's cell FAILs, and every algorithm "
            "there: the verdict over its seeds (✓ PASS on every seed: a rescue), k/N and the mean peak split "
            f"accuracy.</p>{_corrections(cells)}"
            "<h2>Tolerance</h2><p class=note>Rollouts at each rung of the precision ladder, fp32 training: each "
            "algorithm's cell per rung over its seeds, and its tolerance (the coarsest rung that PASSes on every "
            f"seed, with the mean k3 of its runs there).</p>{_tolerance(frame)}"
            "<h2>Reference — the paper's published results (never ranked)</h2><p class=note>Qi et al. 2025, "
            "DeepSeek-R1-Distill-Qwen-1.5B on its 1,460-problem split: another model, another split, thousands "
            f"of steps.</p>{_reference(reference['rows'])}")
    (out_dir / "index.html").write_text(_page(title, body))
    store.dispose()
    return 1 + len(run_records)
