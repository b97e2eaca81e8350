"""One row per run: does the algorithm × precision pass the sanity test, how fast, how large the mismatch."""

import streamlit as st

from leaderboard import data
from leaderboard.queries import ranked, report_columns

st.title("Leaderboard")
url, runs = data.runs_or_stop()

f1, f2, f3, f4, f5 = st.columns(5)
models = f1.multiselect("Model", sorted(runs.model.unique()))
builds = f2.multiselect("Build", sorted(runs.build.unique()))
algos = f3.multiselect("Algorithm", sorted(runs.algo.unique()))
pairs = f4.multiselect("Precision", sorted(runs.precision.unique()))
statuses = f5.multiselect("Status", sorted(runs.status.unique()))
search = st.text_input("Search", placeholder="run id, algorithm, stop reason …")

view = runs
for col, chosen in (("model", models), ("build", builds), ("algo", algos), ("precision", pairs), ("status", statuses)):
    if chosen:
        view = view[view[col].isin(chosen)]
if search:
    hay = view[["run", "algo", "precision", "status", "stop_reason", "model"]].astype(str).agg(" ".join, axis=1)
    view = view[hay.str.contains(search, case=False, regex=False)]
view = ranked(view)

all_cols = report_columns() + ["trainer", "engine", "stop_reason", "wall_s", "kl_warning_step"]
cols = st.multiselect("Columns", all_cols, default=report_columns())
passed = int((view.sanity == "PASS").sum()) if not view.empty else 0
st.caption(f"{len(view)} runs · {passed} pass the sanity test (converged: the 90% lower bound of split accuracy, pooled over the last evaluations, ≥ 95%)")
st.dataframe(
    view[cols], hide_index=True, width="stretch",
    column_config={
        "peak_accuracy": st.column_config.ProgressColumn("peak acc", min_value=0, max_value=1, format="%.3f"),
        "final_accuracy": st.column_config.NumberColumn("final acc", format="%.3f"),
        "mean_kl": st.column_config.NumberColumn("mean KL k3 (last 10%)", format="%.2e"),
        "mean_kl_k1": st.column_config.NumberColumn("mean KL k1 (last 10%)", format="%.2e"),
        "max_abs_dp": st.column_config.NumberColumn("max |π−μ| (last 10%)", format="%.2e"),
    })
st.download_button("Download CSV", view[cols].to_csv(index=False).encode(), "leaderboard.csv", "text/csv")
pick = st.selectbox("Open a run", ["—"] + list(view.run))
if pick != "—":
    st.switch_page("pages/run.py", query_params={"run": pick})
