"""Staleness, the sanity test's second axis: for one algorithm on one build, each precision ×
staleness K cell (rollouts from the weights of K training steps ago, `bench run --staleness K`) over
its seeds — pass rate, mean peak split accuracy, median steps to pass — and the two mismatch
components at the end of its runs; then, for one run, both components against step. One trainer,
rollout engine and settings fingerprint at a time (a choice when the build has several).

The components (runners/staleness.py, kept apart in every step): precision = π_old vs μ, the
training and rollout engines at the same (sampling) weights (`kl_k3`, `prob_abs_diff_mean`);
staleness = π_θ vs π_old, the weights being updated against the sampling weights
(`staleness_kl_k3`, `staleness_abs_dp`), 0 at K = 0."""

import altair as alt
import pandas as pd
import streamlit as st

from leaderboard import colours, data, display
from leaderboard.cell_filter import engine_and_settings
from leaderboard.cells import cells_frame, with_staleness

METRICS = {"pass_rate": "pass rate (k/N seeds)", "peak_mean": "peak split accuracy (mean over seeds)",
           "steps_to_pass_median": "steps to pass (median over passing seeds)"}
COMPONENTS = {"kl_k3": "precision KL k3 (π_old vs μ)", "staleness_kl_k3": "staleness KL k3 (π_θ vs π_old)",
              "prob_abs_diff_mean": "precision mean |Δp|", "staleness_abs_dp": "staleness mean |Δp|"}

st.title("Staleness")
url, runs = data.runs_or_stop()
runs = with_staleness(runs)
c1, c2, c3 = st.columns(3)
build = c1.selectbox("Build", list(dict.fromkeys(runs.build)))
view = runs[runs.build == build]
algos = sorted(set(view.algo))
stale_algos = sorted(set(view[view.staleness > 0].algo))
algo = c2.selectbox("Algorithm", algos, index=algos.index(stale_algos[0]) if stale_algos else 0)
view = view[view.algo == algo]
trainers = sorted(set(view.trainer))
trainer = c3.selectbox("Trainer", trainers) if len(trainers) > 1 else trainers[0]
view = engine_and_settings(view[view.trainer == trainer], st.columns(2))
cells = cells_frame(view)
ks = sorted(set(cells.staleness))
if ks == [0]:
    st.info(f"{algo} on build {build} has no stale runs yet. Add the axis with:\n\n"
            f"```\nbench sweep --algo {algo} --dtype fp16,fp32 --staleness 0,1,2,4,8,16 --build {build}\n```")


def _tail_means(steps: pd.DataFrame) -> pd.DataFrame:
    """Each run's mean of every mismatch component over the last tenth of its steps."""
    cols = [c for c in COMPONENTS if c in steps.columns]
    if steps.empty or not cols:
        return pd.DataFrame(columns=["run_id", *COMPONENTS])
    last = steps.groupby("run_id").step.transform("max")
    return steps[steps.step * 10 >= last * 9].groupby("run_id")[cols].mean().reset_index()


steps = data.steps(url, tuple(view.run))
tails = _tail_means(steps).set_index("run_id")
for col in COMPONENTS:
    cells[col] = [tails.reindex(list(r))[col].median() if col in tails.columns else float("nan")
                  for r in cells.runs]

metric = st.radio("Metric", list(METRICS), horizontal=True, format_func=METRICS.get)
if metric == "pass_rate":
    scale = alt.Scale(domain=[0.0, 0.5, 1.0], range=["#d73027", "#fee08b", "#1a9850"])
elif metric == "peak_mean":
    scale = alt.Scale(domain=[0.0, 0.95 - 1e-4, 0.95, 1.0], range=["#f7fbff", "#2171b5", "#a1d99b", "#00441b"],
                      clamp=True)
else:
    scale = alt.Scale(scheme="viridis", reverse=True)
grid = cells.assign(K=cells.staleness.astype(str))
grid["cell"] = [("—" if pd.isna(v) else f"{v:.2f}") + (" ✓" if s == "PASS" else "") + f" {p}"
                for v, s, p in zip(grid.peak_mean, grid.sanity, grid.passes)]
x = alt.X("K:O", sort=[str(k) for k in ks], title="staleness K (rollouts K steps behind)")
y = alt.Y("precision:N", title="precision (rollout→train)")
heat = alt.Chart(grid).mark_rect(stroke="white").encode(
    x=x, y=y, color=alt.Color(f"{metric}:Q", scale=scale, title=METRICS[metric]),
    tooltip=["precision", "K", "sanity", "passes", "pass_rate", "peak_mean", "steps_to_pass_median", *COMPONENTS])
st.altair_chart(heat + alt.Chart(grid).mark_text().encode(x=x, y=y, text="cell:N"), width="stretch")
st.caption(f"{algo} on build {build} ({trainer}): a cell is one precision pair at one K over its seeds; the text is "
           "the mean peak split accuracy, ✓ when every seed passed, and k/N seeds passed.")
table = cells[["precision", "staleness", "sanity", "passes", "pass_rate", "peak_mean", "steps_to_pass_median",
               *COMPONENTS, "n_seeds"]].sort_values(["precision", "staleness"], kind="stable")
display.dataframe(table, style=colours.styled, hide_index=True, width="stretch", column_config={
    "staleness": st.column_config.NumberColumn("K"),
    "pass_rate": st.column_config.ProgressColumn("pass rate", min_value=0, max_value=1, format="%.2f"),
    "peak_mean": st.column_config.NumberColumn("peak (mean)", format="%.3f"),
    "steps_to_pass_median": st.column_config.NumberColumn("steps to pass (median)", format="%g"),
    **{c: st.column_config.NumberColumn(f"{label} (last 10%)", format="%.2e") for c, label in COMPONENTS.items()}})
st.caption("Mismatch components: the median over a cell's seeds of each run's mean over its last tenth of steps.")

st.subheader("Both components against step")
seed_text = {r: "-" if s is None or s != s else str(int(s)) for r, s in zip(view.run, view.seed)}
label = {r: f"{p} · K={k} · seed {seed_text[r]} · {r}" for r, p, k in zip(view.run, view.precision, view.staleness)}
order = view.sort_values(["staleness", "precision"], ascending=[False, True], kind="stable").run
pick = st.selectbox("Run", list(order), format_func=label.get)
one = steps[steps.run_id == pick] if not steps.empty else steps
smooth = st.slider("Smoothing (moving average, steps)", 1, 50, 1)


def components(cols: list[str], title: str, log: bool) -> None:
    cols = [c for c in cols if c in one.columns]
    if one.empty or not cols:
        st.caption(f"{title}: no steps recorded yet")
        return
    long = one[["step", *cols]].copy()
    long[cols] = long[cols].rolling(smooth, min_periods=1).mean()
    long = long.melt("step", var_name="metric", value_name="value").dropna()
    long["component"] = long.metric.map(COMPONENTS)
    y = alt.Y("value:Q", scale=alt.Scale(type="symlog") if log else alt.Undefined, title=None)
    st.altair_chart(alt.Chart(long, title=title).mark_line().encode(
        x="step:Q", y=y, color=alt.Color("component:N", title=None), tooltip=["step", "component", "value"]),
        width="stretch")


left, right = st.columns(2)
with left:
    components(["kl_k3", "staleness_kl_k3"], "KL k3 per token: precision vs staleness", log=True)
with right:
    components(["prob_abs_diff_mean", "staleness_abs_dp"], "mean |Δp| on sampled tokens: precision vs staleness",
               log=False)
lags = one.staleness_k.dropna() if "staleness_k" in one.columns else pd.Series(dtype=float)
if not lags.empty:
    st.caption(f"effective K of the batches: {int(lags.min())}–{int(lags.max())} "
               "(min(K, step): the first steps have fewer updates to lag behind)")
