"""Algorithm × precision-pair heatmaps for one build: peak accuracy, steps to convergence, mean KL."""

import altair as alt
import pandas as pd
import streamlit as st

from bench.algorithms import ALGORITHMS     # the grid shows cells not run yet
from bench.precision import ALL_PAIRS
from leaderboard import data

st.title("Precision grid")
url, runs = data.runs_or_stop()
build = st.selectbox("Build", list(dict.fromkeys(runs.build)))
view = runs[runs.build == build]
latest = view.sort_values("created_at").groupby(["algo", "precision"]).tail(1)

pairs = [p.rollout if p.rollout == p.train else f"{p.rollout}→{p.train}" for p in ALL_PAIRS]
cells = pd.DataFrame([(a, p) for a in ALGORITHMS for p in pairs], columns=["algo", "precision"])
grid = cells.merge(latest, on=["algo", "precision"], how="left")
grid["cell"] = grid.peak_accuracy.map(lambda v: "—" if pd.isna(v) else f"{v:.2f}")

metric = st.radio("Metric", ["peak_accuracy", "steps_to_target", "mean_kl"], horizontal=True,
                  format_func={"peak_accuracy": "peak accuracy", "steps_to_target": "steps to pass",
                               "mean_kl": "mean KL"}.get)
scale = alt.Scale(scheme="viridis", reverse=metric != "peak_accuracy")
chart = alt.Chart(grid).mark_rect().encode(
    x=alt.X("precision:N", sort=pairs, title="rollout → train"), y=alt.Y("algo:N", sort=list(ALGORITHMS)),
    color=alt.Color(f"{metric}:Q", scale=scale), tooltip=["algo", "precision", "status", metric, "run"])
text = alt.Chart(grid).mark_text(color="white").encode(x=alt.X("precision:N", sort=pairs),
                                                      y=alt.Y("algo:N", sort=list(ALGORITHMS)), text="cell:N")
st.altair_chart(chart + text, width="stretch")
missing = grid[grid.run.isna()]
if not missing.empty:
    st.subheader("Empty cells")
    for r in missing.itertuples():
        p = r.precision.replace("→", ",train=")
        dtype = p if "," not in p else "rollout=" + p
        st.code(f"bench run --algo {r.algo} --dtype {dtype} --build {build}", language="bash")
