"""Offline mismatch reports (`bench mismatch`), side by side per precision pair."""

import streamlit as st

from leaderboard import data, display

st.title("Training–inference mismatch")
url = data.store_url()
reports = data.mismatch(url)
if reports.empty:
    st.info("No mismatch reports yet. Run `bench mismatch --model tiny-math --dtype all`.")
    st.stop()
model = st.selectbox("Model", list(dict.fromkeys(reports.model)))
view = reports[reports.model == model]
cols = [c for c in ("rollout_dtype", "train_dtype", "source", "n", "kl_k1", "kl_k1_bits", "kl_k3", "prob_abs_diff_mean",
                    "prob_diff_max", "prob_diff_min", "log_ratio_slope", "log_ratio_slope_se", "created_at")
        if c in view.columns]
display.dataframe(view[cols], hide_index=True, width="stretch")
for r in view.itertuples():
    plots = r.plots or {}
    if plots:
        st.subheader(f"μ {r.rollout_dtype} · π {r.train_dtype}")
        cs = st.columns(len(plots))
        for col, (name, path) in zip(cs, plots.items()):
            try:
                col.image(path, caption=name)
            except Exception:
                col.caption(f"{name}: {path} (not readable here)")
