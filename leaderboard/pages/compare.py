"""Overlay any metric of several runs; a config table that can show only the differing keys."""

import altair as alt
import pandas as pd
import streamlit as st

from leaderboard import data

st.title("Compare runs")
url, runs = data.runs_or_stop()
label = {r.run: f"{r.run} · {r.algo} · {r.precision}" for r in runs.itertuples()}
chosen = st.multiselect("Runs", list(runs.run), default=list(runs.run[:2]), format_func=label.get)
if not chosen:
    st.info("Pick at least one run.")
    st.stop()
steps = data.steps(url, tuple(chosen))
metrics = sorted(c for c in steps.columns if c not in ("run_id", "step"))
default = [m for m in ("reward", "prob_abs_diff_mean") if m in metrics]
picked = st.multiselect("Metrics", metrics, default=default)
smooth = st.slider("Smoothing (moving average, steps)", 1, 50, 1)
for m in picked:
    df = steps[["run_id", "step", m]].dropna().copy()
    df[m] = df.groupby("run_id")[m].transform(lambda s: s.rolling(smooth, min_periods=1).mean())
    df["run"] = df.run_id.map(label)
    st.altair_chart(alt.Chart(df, title=m).mark_line().encode(x="step:Q", y=alt.Y(f"{m}:Q", title=None),
                                                             color="run:N", tooltip=["run", "step", m]),
                    width="stretch")

configs = {}
for r in chosen:
    info = data.run_info(url, r)
    flat = pd.json_normalize({"algo": info["algo"], "rollout_dtype": info["rollout_dtype"],
                              "train_dtype": info["train_dtype"], "engine": info["engine"],
                              "build": info["build_id"], **(info["config"] or {})}, sep=".")
    configs[label[r]] = flat.iloc[0].map(str)
table = pd.DataFrame(configs)
if st.toggle("Only keys that differ", value=True):
    table = table[table.nunique(axis=1) > 1]
st.dataframe(table, width="stretch")
