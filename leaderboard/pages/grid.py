"""Rollout × training precision for one algorithm on one build: peak split accuracy on a fixed
0–1 colour scale with the 0.95 pass line marked, steps to pass, or mean KL; every format of
bench/formats.py as a row (rollout) or a column (training). A cell is its runs over seeds
(leaderboard/cells.py): mean peak, PASS only when every seed passed; the grid holds one trainer,
staleness K, rollout engine and settings fingerprint (a choice when the build has several)."""

import altair as alt
import pandas as pd
import streamlit as st

from bench.algorithms import ALGORITHMS     # the grid shows cells not run yet
from bench.fingerprint import short
from bench.formats import ROLLOUT_FORMATS, TRAIN_FORMATS
from leaderboard import cells as cell_stats
from leaderboard import colours, data, fill_command
from leaderboard.cell_filter import engine_and_settings

PASS_LINE = 0.95

st.title("Precision grid")
url, runs = data.runs_or_stop()
build = st.selectbox("Build", list(dict.fromkeys(runs.build)))
algo = st.selectbox("Algorithm", list(ALGORITHMS), key="grid_algo")
view = runs[(runs.build == build) & (runs.algo == algo)]
trainers = sorted(set(view.trainer)) or ["native"]
trainer = st.selectbox("Trainer", trainers) if len(trainers) > 1 else trainers[0]
view = cell_stats.with_staleness(view[view.trainer == trainer])
ks = sorted(set(view.staleness)) or [0]
k = st.selectbox("Staleness K", ks, help="Rollouts from the weights of K updates ago (the Staleness page "
                 "shows precision × K)") if len(ks) > 1 else ks[0]
view = engine_and_settings(view[view.staleness == k], st.columns(2))
stats = cell_stats.cells_frame(view)
split = stats.precision.str.split("→")
stats["rollout_dtype"], stats["train_dtype"] = split.str[0], split.str[-1]

# the formats of `all`, then any named one (mxfp4, +router32) this view has runs of
rollouts = list(dict.fromkeys([*ROLLOUT_FORMATS, *stats.rollout_dtype]))
trains = list(dict.fromkeys([*TRAIN_FORMATS, *stats.train_dtype]))
grid = pd.DataFrame([(r, t) for r in rollouts for t in trains], columns=["rollout_dtype", "train_dtype"])
grid = grid.merge(stats, on=["rollout_dtype", "train_dtype"], how="left")
grid["cell"] = [("—" if pd.isna(v) else f"{v:.2f}") + (f" {colours.VERDICT_MARKS[s]}" if n else "")
                + (" early" if colours.status_kind(status) == "early" else "") + (f" {k}" if n else "")
                for v, s, k, n, status in zip(grid.peak_mean, grid.sanity, grid.passes, grid.n_seeds.fillna(0),
                                              grid.status)]

METRICS = {"pass_rate": "pass rate (k/N seeds)", "peak_mean": "peak accuracy", "steps_to_pass_median": "steps to pass",
           "kl_k3_median": "mean KL k3", "router_flip_median": "router flips"}
moe = bool(grid.router_flip_median.notna().any())          # an MoE model's cells: their router flips too
metric = st.radio("Metric", [m for m in METRICS if moe or m != "router_flip_median"], horizontal=True,
                  format_func=METRICS.get)
if metric == "pass_rate":                  # the share of seeds that passed, red (none) → green (all)
    scale = alt.Scale(domain=[0.0, 0.5, 1.0], range=["#d73027", "#fee08b", "#1a9850"])
    legend, ink = alt.Legend(values=[0.0, 0.5, 1.0], title="seeds passed (k/N)"), alt.value("black")
elif metric == "peak_mean":
    # fixed, not min–max (which coloured 0.786 and 0.799 as opposites); the hue turns from blue
    # to green at the pass line
    scale = alt.Scale(domain=[0.0, PASS_LINE - 1e-4, PASS_LINE, 1.0],
                      range=["#f7fbff", "#2171b5", "#a1d99b", "#00441b"], clamp=True)
    legend = alt.Legend(values=[0.0, 0.25, 0.5, 0.75, PASS_LINE, 1.0], title=f"peak (pass line {PASS_LINE})")
    ink = alt.condition(f"datum.peak_mean > 0.55 && datum.peak_mean < {PASS_LINE} || datum.peak_mean > 0.98",
                        alt.value("white"), alt.value("black"))
else:
    scale, legend, ink = alt.Scale(scheme="viridis", reverse=True), alt.Legend(), alt.value("black")
x = alt.X("train_dtype:N", sort=trains, title="training format (π)")
y = alt.Y("rollout_dtype:N", sort=rollouts, title="rollout format (μ)")
square = alt.Color(f"{metric}:Q", scale=scale, legend=legend)
if metric == "pass_rate":   # a cell running or undecided has no verdict yet: amber or blue, not "none passed"
    square = alt.condition("datum.sanity == 'RUNNING'", alt.value(colours.VERDICT_COLOURS["RUNNING"][0]),
                           alt.condition("datum.sanity == 'UNDECIDED'",
                                         alt.value(colours.VERDICT_COLOURS["UNDECIDED"][0]), square))
chart = alt.Chart(grid).mark_rect(stroke="white").encode(
    x=x, y=y, color=square,
    tooltip=["rollout_dtype", "train_dtype", "sanity", "evidence", "pass_rate", "status", "peak_mean", "peak_ci_lo",
             "peak_ci_hi", "steps_to_pass_median", "kl_k3_median", *(["router_flip_median"] if moe else [])])
text = alt.Chart(grid).mark_text().encode(x=x, y=y, text="cell:N", color=ink)
st.altair_chart(chart + text, width="stretch")
where = f"{trainer}, {view.engine.iloc[0]}, cfg {short(view.config_fp.iloc[0])}" if not view.empty else trainer
st.caption(f"{algo} on build {build} ({where}{f', staleness K={k}' if k else ''}), a cell over its seeds: "
           "the text is the mean peak split accuracy, the verdict (✓ PASS: every seed stopped converged; ✗ FAIL: a "
           "rule decided a seed; ? UNDECIDED: a seed's budget ran out first; … RUNNING, pending; 'early' when a "
           "rule decided it before the run's end) and k/N seeds passed; the colour is that pass rate (red none, "
           "green all; amber while the cell still runs, blue while undecided), or the peak on a "
           f"fixed 0–1 scale turning from blue to green at the {PASS_LINE} pass line"
           + ("; router flips: the median over seeds of the share of (token, layer) top-k sets the two engines "
              "chose differently, over each run's last tenth of steps" if moe else "") + ".")
seeds = sorted({int(x) for x in view.seed if x == x and x is not None}) if "seed" in view else []
have = {(r, t): None for r, t in zip(grid.rollout_dtype, grid.train_dtype)}      # pair → its seeds (None: no run)
for r, t, ss in zip(stats.rollout_dtype, stats.train_dtype, stats.seeds):
    have[(r, t)] = {x for x in ss if x is not None}
empty = [p for p, ss in have.items() if ss is None]
short_of_seeds = [p for p, ss in have.items() if ss is not None and not set(seeds) <= ss]
if empty or short_of_seeds:
    newest = view.sort_values("created_at").run.iloc[-1] if not view.empty else None
    info = data.run_info(url, newest) if newest else None
    prov = (info or {}).get("provenance")
    command, notes = fill_command.sweep_command(
        algo, build, [p for p in have if p in empty or p in short_of_seeds], seeds=seeds, trainer=trainer,
        engine=view.engine.iloc[0] if not view.empty else "torch", staleness=k,
        config=(info or {}).get("config"), defaults=prov.get("preset_defaults") if isinstance(prov, dict) else None,
        every=list(have))
    st.subheader("Empty cells")
    st.caption(f"{len(empty)} of {len(have)} cells have no run" + (
        f", {len(short_of_seeds)} lack some of the grid's seeds ({fill_command.seeds_text(seeds)})"
        if short_of_seeds else "")
        + ". One sweep fills them all with the settings of the cells shown (it skips every cell and seed "
        "already finished):")
    st.code(command, language="bash", wrap_lines=True)
    for note in notes:
        st.caption(f"Note: {note}.")
