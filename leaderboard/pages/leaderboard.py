"""One row per cell (algorithm × precision on a build, with one trainer, rollout engine, staleness
K and settings fingerprint: leaderboard/cells.py) over its seeds: does it pass the sanity
test on every seed (k/N), how high and how surely (mean peak with a 95% t-interval), how fast
(median steps to pass, min–max), how large the mismatch (median KL k3), and whether its runs
were re-run and matched (`bench runs verify`). Single runs one click down. Below, apart and
never ranked: the paper's published results (Reference)."""

import pandas as pd
import streamlit as st

from bench.fingerprint import short
from leaderboard import colours, data, display
from leaderboard.cells import INTERVAL, PASS_BOUND, cell_columns, cells_frame, ranked_cells
from leaderboard.peak_chart import TARGET, peak_chart
from leaderboard.reference import matching_rows, paper_offline_mismatch, reference_rows

st.title("Leaderboard")
url, runs = data.runs_or_stop()

f1, f2, f3, f4, f5 = st.columns(5)
models = f1.multiselect("Model", sorted(runs.model.unique()))
builds = f2.multiselect("Build", sorted(runs.build.unique()))
algos = f3.multiselect("Algorithm", sorted(runs.algo.unique()))
pairs = f4.multiselect("Precision", sorted(runs.precision.unique()))
verdicts = f5.multiselect("Sanity", ["PASS", "FAIL", "UNDECIDED", "RUNNING"])
search = st.text_input("Search", placeholder="run id, algorithm, status …")

view = runs
for col, chosen in (("model", models), ("build", builds), ("algo", algos), ("precision", pairs)):
    if chosen:
        view = view[view[col].isin(chosen)]
cells = ranked_cells(cells_frame(view))
if verdicts:
    cells = cells[cells.sanity.isin(verdicts)]
if search and not cells.empty:
    hay = cells.apply(lambda c: " ".join([c.algo, c.precision, c.status, str(c.model), str(c.engine),
                                          str(c.config_fp), *c.runs]), axis=1)
    cells = cells[hay.str.contains(search, case=False, regex=False)]

if cells.empty:
    st.info("No cell matches these filters.")
else:
    st.altair_chart(peak_chart(cells, TARGET), width="stretch")

default = ["algo", "precision", *(["staleness"] if (cells.staleness > 0).any() else []), "engine", "config_fp",
           "sanity", "passes", "evidence", "decided",
           "status", "early", "peak_mean", "peak_ci_lo", "peak_ci_hi", "steps_to_pass_median", "steps_to_pass_min",
           "steps_to_pass_max", "kl_k3_median", "verification", "seeds", "build"]
cols = st.multiselect("Columns", cell_columns(), default=default)
counts = {v: int((cells.sanity == v).sum()) if not cells.empty else 0 for v in ("PASS", "FAIL", "UNDECIDED")}
st.caption(f"{len(cells)} cells · {counts['PASS']} pass the sanity test on every seed (a seed passes when its run "
           "converged: the 90% lower bound of split accuracy, pooled over the last evaluations, ≥ 95%) · "
           f"{counts['FAIL']} fail by a rule · {counts['UNDECIDED']} undecided (a seed's budget ran out first) · "
           f"evidence: {PASS_BOUND} · peak: {INTERVAL}. " + colours.legend_text())
shown = cells[cols].copy()
if "config_fp" in shown:
    shown["config_fp"] = shown.config_fp.map(short)
display.dataframe(
    shown, style=colours.styled, hide_index=True, width="stretch",
    column_config={
        "config_fp": st.column_config.TextColumn("config", help="Fingerprint of every setting but the seed "
                                                 "(bench/fingerprint.py): runs differing in any other setting "
                                                 "are other cells; the Compare page shows the differences"),
        "peak_mean": st.column_config.ProgressColumn("peak acc (mean)", min_value=0, max_value=1, format="%.3f"),
        "peak_ci_lo": st.column_config.NumberColumn("95% CI low", format="%.3f"),
        "peak_ci_hi": st.column_config.NumberColumn("95% CI high", format="%.3f"),
        "peak_t_lo": st.column_config.NumberColumn("plain t low", format="%.3f"),
        "peak_t_hi": st.column_config.NumberColumn("plain t high", format="%.3f"),
        "evidence": st.column_config.TextColumn("seeds passing", help="k of N seeds passed, and the one-sided 95% "
                                                "Clopper–Pearson lower bound on a seed's pass probability they "
                                                "support (1/1: ≥ 0.05; 10/10: ≥ 0.74)"),
        "pass_lower": st.column_config.NumberColumn("pass p ≥", format="%.2f"),
        "peak_sd": st.column_config.NumberColumn("peak sd", format="%.3f"),
        "pass_rate": st.column_config.ProgressColumn("pass rate", min_value=0, max_value=1, format="%.2f"),
        "steps_to_pass_median": st.column_config.NumberColumn("steps to pass (median)", format="%g"),
        "steps_to_pass_min": st.column_config.NumberColumn("min", format="%g"),
        "steps_to_pass_max": st.column_config.NumberColumn("max", format="%g"),
        "kl_k3_median": st.column_config.NumberColumn("KL k3 (median, last 10%)", format="%.2e"),
        "early": st.column_config.TextColumn("early verdicts", help="Seeds whose verdict a stop rule gave before "
                                             "max_steps: the rule and the step (bench/stop.py)"),
        "decided": st.column_config.TextColumn("decided", help="A cell decided by its first failing seed: the "
                                               "seeds run of those asked"),
        "verification": st.column_config.TextColumn("verified", help="What `bench runs verify` re-ran of the seeds "
                                                    "(bench/verification.py): claimed, partly re-run, deciding window "
                                                    "re-run, fully re-run; a verdict is verified from the deciding "
                                                    "window up"),
    })
flat = cells[cols].copy()
for c in ("seeds", "runs"):
    if c in flat:
        flat[c] = flat[c].map(lambda xs: " ".join("-" if x is None else str(x) for x in xs))
st.download_button("Download CSV", flat.to_csv(index=False).encode(), "leaderboard.csv", "text/csv")

with st.expander("Reference: the paper's published results (not ranked)"):
    refs = reference_rows()
    here, _ = matching_rows(zip(cells.algo, cells.precision), refs)
    table = pd.DataFrame([{"on this page": any(r is h for h in here), **r} for r in refs])
    table = table.sort_values("on this page", ascending=False, kind="stable")
    st.caption(f"Qi et al. 2025 on DeepSeek-R1-Distill-Qwen-1.5B (its 1,460-problem perfectible split, 8×A100, "
               f"2,000+ steps), read from the paper's text (packaged paper_reference.json): another model and "
               f"scale, so a row to compare a cell's outcome with, never a rank. {len(here)} of {len(refs)} rows are "
               "for an algorithm × precision cell shown above (a precision-ablation row, which names no "
               "algorithm, matches any cell at its precision).")
    display.dataframe(table, hide_index=True, width="stretch", column_config={
        "algo": st.column_config.TextColumn("algo", help="– : the paper's precision ablation (no algorithm named)"),
        "peak_train_acc": st.column_config.NumberColumn("peak train acc", format="%.2f"),
        "aime24": st.column_config.TextColumn("AIME24 (avg@32)")})
    m = paper_offline_mismatch()
    if m and m.get("ratio_bf16_over_fp16"):
        st.caption(f"The paper's offline mismatch: KL[μ‖π] {m['kl_bits_bf16']:g} bits in bf16 vs "
                   f"{m['kl_bits_fp16']:g} in fp16, {m['ratio_bf16_over_fp16']:.3g}× ({m['setup']}).")

label = {}
seed_of = runs.set_index("run").seed.to_dict()
for c in cells.itertuples():
    for r in c.runs:
        s = seed_of.get(r)
        k = f" · K={c.staleness}" if c.staleness else ""
        seed = "-" if s is None or s != s else int(s)
        label[r] = f"{c.algo} · {c.precision}{k} · {c.engine} · cfg {short(c.config_fp)} · seed {seed} · {r}"
pick = st.selectbox("Open a run", ["—"] + list(label), format_func=lambda r: label.get(r, r))
if pick != "—":
    st.switch_page("pages/run.py", query_params={"run": pick})
