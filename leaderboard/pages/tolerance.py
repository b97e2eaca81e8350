"""Tolerance: on one build, each algorithm's cells down the precision ladder (rollouts at each rung,
fp32 training: bench/ladder.py) and the coarsest rung where it still PASSes on every seed — what
`bench tolerance` searches for (leaderboard/tolerance.py)."""

import altair as alt
import streamlit as st

from bench.formats import LADDER
from leaderboard import colours, data
from leaderboard.cell_filter import engine_and_settings
from leaderboard.cells import cells_frame, with_staleness
from leaderboard.tolerance import ladder_frame, tolerances, with_search_key

st.title("Tolerance")
url, runs = data.runs_or_stop()
build = st.selectbox("Build", list(dict.fromkeys(runs.build)), key="tol_build")
view = with_staleness(runs[(runs.build == build) & (runs.trainer == "native")])
# the settings to choose among are the search's (without max_steps): an extended seed stays in its rung's cell
view = engine_and_settings(with_search_key(view[view.staleness == 0]), st.columns(2))
ladder = ladder_frame(cells_frame(view))
if ladder.empty:
    st.info(f"No cell on the precision ladder on build {build} yet. One search (rollouts at each rung, fp32 "
            f"training; a stored run per cell, resumable):\n\n```\nbench tolerance --algo grpo --seeds 3 --build "
            f"{build}\n```")
    st.stop()
ladder["label"] = [f"{colours.VERDICT_MARKS.get(s, '')} {k}" for s, k in zip(ladder.sanity, ladder.passes)]
x = alt.X("rung:N", sort=list(LADDER), title="rollout rung (→ fp32 training), finer to coarser")
y = alt.Y("algo:N", title="algorithm")
scale = alt.Scale(domain=[0.0, 0.5, 1.0], range=["#d73027", "#fee08b", "#1a9850"])
colour = alt.Color("pass_rate:Q", scale=scale, legend=alt.Legend(values=[0.0, 0.5, 1.0], title="seeds passed"))
chart = alt.Chart(ladder).mark_rect(stroke="white").encode(
    x=x, y=y, color=colour, tooltip=["algo", "rung", "sanity", "passes", "peak_mean", "kl_k3_median"])
st.altair_chart(chart + alt.Chart(ladder).mark_text().encode(x=x, y=y, text="label:N"), width="stretch")
st.caption("Each square: one algorithm's cell at a rung over its seeds (✓ PASS on every seed, ✗ FAIL by a rule, "
           "? UNDECIDED) and k/N seeds passed; the colour is that pass rate. Unrun rungs are blank: the search "
           "bisects.")
st.subheader("Tolerances")
st.dataframe(tolerances(ladder).rename(columns={"k3": "k3 there (mean over steps)", "above": "next rung run",
                                                "above_passes": "its seeds"}), hide_index=True)
st.caption("tolerance: the coarsest rung whose cell PASSes on every seed; k3: the per-token KL[μ‖π] estimate "
           "averaged over the run's steps, median over seeds.")
