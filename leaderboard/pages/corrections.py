"""Corrections: on one build, every algorithm (the paper's seven, then the field's corrections)
at each precision pair where a paper algorithm's cell FAILs, and which of them rescue it (PASS on
every seed). One trainer, staleness K = 0, rollout engine and settings fingerprint at a time
(leaderboard/corrections.py says what a failing pair and a rescue are)."""

import altair as alt
import streamlit as st

from bench.algorithms import ALGORITHMS
from bench.precision import Precision
from leaderboard import colours, data, fill_command
from leaderboard.cell_filter import engine_and_settings
from leaderboard.cells import cells_frame, with_staleness
from leaderboard.corrections import describe, rescue_frame

st.title("Corrections")
url, runs = data.runs_or_stop()
c1, c2 = st.columns(2)
build = c1.selectbox("Build", list(dict.fromkeys(runs.build)), key="corr_build")
view = with_staleness(runs[runs.build == build])
view = view[view.staleness == 0]
trainers = sorted(set(view.trainer)) or ["native"]
trainer = c2.selectbox("Trainer", trainers) if len(trainers) > 1 else trainers[0]
view = engine_and_settings(view[view.trainer == trainer], st.columns(2))
table = rescue_frame(cells_frame(view))
if table.empty:
    st.info(f"No paper algorithm's cell FAILs on build {build} yet: the rescue table needs a failing pair. The "
            "embedded default's negative control is one:\n\n```\nbench sweep --algo pg-seq-is --dtype "
            f"rollout=mxfp4,train=fp16 --max-steps 80 --build {build}\n```")
    st.stop()

table["label"] = [("—" if n == 0 else f"{p:.2f} {colours.VERDICT_MARKS.get(s, '')} {k}")
                  for p, s, k, n in zip(table.peak_mean, table.sanity, table.passes, table.n_seeds)]
table["what"] = table.algo.map(describe)
y = alt.Y("algo:N", sort=list(ALGORITHMS), title="algorithm (the paper's seven, then the corrections)")
x = alt.X("precision:N", title="failing pair (rollout → training)")
scale = alt.Scale(domain=[0.0, 0.5, 1.0], range=["#d73027", "#fee08b", "#1a9850"])
square = alt.Color("pass_rate:Q", scale=scale, legend=alt.Legend(values=[0.0, 0.5, 1.0], title="seeds passed"))
square = alt.condition("datum.n_seeds == 0", alt.value("#f0f0f0"), square)
chart = alt.Chart(table).mark_rect(stroke="white").encode(
    x=x, y=y, color=square,
    tooltip=["algo", "what", "precision", "sanity", "passes", "peak_mean", "steps_to_pass_median"])
text = alt.Chart(table).mark_text().encode(x=x, y=y, text="label:N")
st.altair_chart(chart + text, width="stretch")
st.caption("A failing pair: a paper algorithm's cell there FAILs (a rule decided it). Each square is one algorithm's "
           "cell at that pair over its seeds: mean peak split accuracy, the verdict (✓ PASS on every seed, ✗ FAIL, "
           "? UNDECIDED) and k/N seeds passed; the colour is that pass rate; grey: not run yet.")
rescuers = table[table.rescues]
if rescuers.empty:
    st.write("No algorithm rescues a failing pair here yet.")
else:
    st.subheader("Rescues")
    st.dataframe(rescuers[["algo", "what", "precision", "passes", "peak_mean", "steps_to_pass_median"]],
                 hide_index=True)
missing = [a for a in ALGORITHMS if (table[table.algo == a].n_seeds == 0).any()]     # at some failing pair
if missing:
    parsed = [Precision.parse(p) for p in dict.fromkeys(table.precision)]
    pairs = fill_command.dtype_list([(p.rollout, p.train) for p in parsed])
    where = "" if view.empty else (("" if trainer == "native" else f" --trainer {trainer}")
                                   + f" --engine {view.engine.iloc[0]}")
    st.caption("Not run yet at every failing pair: " + ", ".join(missing) + ". One sweep runs them, skipping the "
               "cells already finished (add the settings of the cells shown; the Precision grid's command carries "
               "them):")
    st.code(f"bench sweep --algo {','.join(missing)} --dtype '{pairs}' --build {build}{where}", language="bash",
            wrap_lines=True)
