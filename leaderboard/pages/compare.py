"""Overlay cells: each metric as the mean over a cell's seeds with a band of ± one standard
deviation (not one line per run); then the settings that tell the chosen cells apart (their
fingerprints' difference, bench/configdiff.py) and each run's config, only the keys that differ."""

import altair as alt
import pandas as pd
import streamlit as st

from bench.fingerprint import short
from leaderboard import data, display
from leaderboard.cells import cells_frame, ranked_cells, settings_spread

st.title("Compare cells")
url, runs = data.runs_or_stop()
cells = ranked_cells(cells_frame(runs))
names = [f"{c.algo} · {c.precision}{f' · K={c.staleness}' if c.staleness else ''} · {c.build} · {c.trainer} · "
         f"{c.engine} · cfg {short(c.config_fp)}" for c in cells.itertuples()]
keys = [f"{n} · {c.model} · {c.config_fp}" for n, c in zip(names, cells.itertuples())]       # unique: the cell key
by_key = dict(zip(keys, cells.itertuples()))
label = {k: f"{n} · {c.passes} pass" for k, n, c in zip(keys, names, cells.itertuples())}
chosen = st.multiselect("Cells", keys, default=keys[:2], format_func=label.get)
if not chosen:
    st.info("Pick at least one cell.")
    st.stop()
run_cell = {r: k for k in chosen for r in by_key[k].runs}
steps = data.steps(url, tuple(run_cell))
metrics = sorted(c for c in steps.columns if c not in ("run_id", "step"))
default = [m for m in ("reward", "prob_abs_diff_mean") if m in metrics]
picked = st.multiselect("Metrics", metrics, default=default)
smooth = st.slider("Smoothing (moving average, steps)", 1, 50, 1)
st.caption("Line: mean over the cell's seeds at each step; band: ± one standard deviation over the seeds "
           "(none for a single seed).")
for m in picked:
    df = steps[["run_id", "step", m]].dropna().copy()
    if df.empty:
        continue
    df[m] = df.groupby("run_id")[m].transform(lambda s: s.rolling(smooth, min_periods=1).mean())
    df["cell"] = df.run_id.map(lambda r: f"{label[run_cell[r]]} ({len(by_key[run_cell[r]].runs)} seeds)")
    agg = df.groupby(["cell", "step"])[m].agg(["mean", "std", "count"]).reset_index()
    agg["std"] = agg["std"].fillna(0.0)
    agg["lo"], agg["hi"] = agg["mean"] - agg["std"], agg["mean"] + agg["std"]
    base = alt.Chart(agg, title=m).encode(x="step:Q", color="cell:N")
    band = base.mark_area(opacity=0.25).encode(y=alt.Y("lo:Q", title=None), y2="hi:Q")
    line = base.mark_line().encode(y=alt.Y("mean:Q", title=None),
                                   tooltip=["cell", "step", alt.Tooltip("mean:Q", format=".4g"),
                                            alt.Tooltip("std:Q", format=".3g"), "count"])
    st.altair_chart(band + line, width="stretch")

st.subheader("Settings that tell the cells apart")
config_of = runs.set_index("run").config.to_dict()
spread = settings_spread({label[k]: config_of.get(by_key[k].runs[-1]) for k in chosen})
if len(chosen) < 2:
    st.caption("Pick two or more cells to see what differs between their settings.")
elif not spread:
    st.caption("The chosen cells share every setting (they differ in the cell key only: algorithm, precision, "
               "staleness, build, trainer or engine).")
else:
    st.caption("Every setting but the seed (and the bookkeeping bench/fingerprint.py leaves out) on which the "
               "chosen cells differ; each cell's newest run stands for it.")
    display.dataframe(pd.DataFrame([{"setting": key, **values} for key, values in spread]), hide_index=True,
                      width="stretch")

st.subheader("Each run's config")
configs = {}
for r, k in run_cell.items():
    info = data.run_info(url, r)
    flat = pd.json_normalize({"algo": info["algo"], "rollout_dtype": info["rollout_dtype"],
                              "train_dtype": info["train_dtype"], "engine": info["engine"],
                              "build": info["build_id"], **(info["config"] or {})}, sep=".")
    configs[f"{label[k]} · {r}"] = flat.iloc[0].map(display.cell_text)
table = pd.DataFrame(configs)
if st.toggle("Only keys that differ", value=True):
    table = table[table.nunique(axis=1) > 1]
display.dataframe(table, width="stretch")
