"""The Leaderboard page's chart: for each cell, the peak split accuracy over its seeds — the mean
with its two-sided 95% Student-t interval on the logit scale (inside [0, 1]), exactly the cell
statistics of leaderboard/cells.py (`peak_mean`, `peak_ci_lo`, `peak_ci_hi`; one seed has no
interval), the tooltip naming what the seeds support (`evidence`: k/N and the Clopper–Pearson
bound on a seed's pass probability) —
against the sanity test's 0.95 line, the point coloured by the cell's verdict
(leaderboard/colours.py). One row per cell, in the table's (ranked) order, labelled by the key
columns that tell the cells shown apart (algorithm and precision always)."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from bench.fingerprint import short
from leaderboard.colours import VERDICT_COLOURS, VERDICT_INK, VERDICT_MARKS

TARGET = 0.95            # the pass line: a seed passes when its pooled bound of split accuracy reaches it
# key columns named in a row's label when they differ between the cells shown, in this order
LABEL_PARTS = (("algo", "{}"), ("precision", "{}"), ("staleness", "K={}"), ("trainer", "{}"), ("engine", "{}"),
               ("config_fp", "cfg {}"), ("build", "build {}"), ("model", "{}"))
ALWAYS = ("algo", "precision")


def _text(col: str, value) -> str:
    return short(value) if col == "config_fp" else str(value)


def labels(cells: pd.DataFrame) -> list[str]:
    """One label per cell: its algorithm and precision, and each other key column whose value is
    not the same for every cell shown ("grpo · bf16 · K=2")."""
    parts = [(c, fmt) for c, fmt in LABEL_PARTS if c in cells.columns
             and (c in ALWAYS or cells[c].map(lambda v: _text(c, v)).nunique(dropna=False) > 1)]
    return [" · ".join(fmt.format(_text(c, row[c])) for c, fmt in parts) for _, row in cells.iterrows()]


def chart_frame(cells: pd.DataFrame) -> pd.DataFrame:
    """The chart's data: label, verdict, passes, seeds, peak mean and interval of each cell (in
    `cells`' order; `cells` as cells.py's `cells_frame` / `ranked_cells` give them)."""
    def num(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    return pd.DataFrame({
        "cell": labels(cells),
        "sanity": list(cells.sanity),
        "mark": [f"{VERDICT_MARKS.get(v, '')} {v}".strip() for v in cells.sanity],
        "passes": list(cells.passes),
        "evidence": list(cells.evidence) if "evidence" in cells.columns else list(cells.passes),
        "n_seeds": [int(n) for n in cells.n_seeds],
        "peak_mean": [num(v) for v in cells.peak_mean],
        "peak_ci_lo": [num(v) for v in cells.peak_ci_lo],
        "peak_ci_hi": [num(v) for v in cells.peak_ci_hi],
    })


def peak_chart(cells: pd.DataFrame, target: float = TARGET) -> alt.LayerChart:
    """Points (mean peak per cell) with their seed intervals as bars and the `target` line."""
    data = chart_frame(cells)
    values = [v for c in ("peak_mean", "peak_ci_lo", "peak_ci_hi") for v in data[c] if v is not None]
    lo = min([target, *values])
    hi = max([1.0, *values])
    scale = alt.Scale(domain=[math.floor(lo * 20) / 20, math.ceil(hi * 100) / 100], zero=False)
    order = list(data.cell)
    y = alt.Y("cell:N", sort=order, title=None, axis=alt.Axis(labelLimit=420))
    verdicts = list(VERDICT_COLOURS)
    palette = alt.Scale(domain=verdicts, range=[VERDICT_INK[v] for v in verdicts])
    colour = alt.Color("sanity:N", title="sanity", scale=palette)
    tooltip = [alt.Tooltip("cell:N"), alt.Tooltip("mark:N", title="sanity"),
               alt.Tooltip("evidence:N", title="seeds passing (95% lower bound on p)"),
               alt.Tooltip("n_seeds:Q", title="seeds"), alt.Tooltip("peak_mean:Q", title="peak (mean)", format=".3f"),
               alt.Tooltip("peak_ci_lo:Q", title="95% CI low", format=".3f"),
               alt.Tooltip("peak_ci_hi:Q", title="95% CI high", format=".3f")]
    base = alt.Chart(data)
    interval = base.mark_rule(strokeWidth=2).encode(
        x=alt.X("peak_ci_lo:Q", scale=scale, title="peak split accuracy (mean over seeds, 95% logit-scale t-interval)"),
        x2="peak_ci_hi:Q", y=y, color=alt.Color("sanity:N", legend=None, scale=palette), tooltip=tooltip)
    points = base.mark_point(filled=True, size=90).encode(
        x=alt.X("peak_mean:Q", scale=scale), y=y, color=colour, shape=alt.Shape("sanity:N", legend=None),
        tooltip=tooltip)
    line = pd.DataFrame({"target": [target], "label": [f"pass line {target:g}"], "cell": [order[0]]})
    rule = alt.Chart(line).mark_rule(color="#1a9850", strokeDash=[6, 3], strokeWidth=2).encode(
        x=alt.X("target:Q", scale=scale))
    text = alt.Chart(line).mark_text(align="left", dx=4, dy=-8, color="#1a9850", baseline="bottom").encode(
        x=alt.X("target:Q", scale=scale), y=y, text="label:N")             # beside the line, at the top row
    # Streamlit fits the whole chart (title and axis included) into the height: ~100 px of those
    return alt.layer(interval, points, rule, text).properties(height=100 + 36 * len(data),
                                                              title="Peak split accuracy per cell")
