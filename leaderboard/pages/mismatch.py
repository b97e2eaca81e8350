"""The newest `bench check` (each pair's verdict against its contract, where a broken pair's
mismatch enters, each layer's relative error), then the offline mismatch reports (`bench
mismatch`), side by side per precision pair, with the conditions each was measured under; the
bf16 ÷ fp16 ratio pairs reports of the same conditions only (leaderboard/summary.py `offline_ratios`)."""

import pandas as pd
import streamlit as st

from leaderboard import data, display
from leaderboard.summary import conditions_text, offline_ratios, ratio_text

ROUTER_COLUMNS = ("router_replay", "router_flip_frac", "router_token_flip_frac", "kl_k3_router_flipped",
                  "kl_k3_router_unflipped", "abs_logp_diff_mean_router_flipped", "abs_logp_diff_mean_router_unflipped",
                  "router_tokens")

st.title("Training–inference mismatch")
url = data.store_url()
checks = data.checks(url)
if not checks.empty:
    newest = checks[checks.report == checks.report.iloc[0]]
    first = newest.iloc[0]
    st.subheader("Consistency check (`bench check`)")
    st.caption(f"{first.model}, {first.engine} engine, {first.created_at:%Y-%m-%d %H:%M}, contract {first.contract}"
               f"{', CPU 16-bit path ' + first.cpu_16bit if first.cpu_16bit else ''}: "
               f"{(newest.verdict == 'PASS').sum()} of {len(newest)} pairs meet their contract (docs/check.md).")
    display.dataframe(newest[["pair", "verdict", "lines", "broken", "enters", "kl_k3", "kl_full",
                              "token_mult_prob_error", "flags"]], hide_index=True, width="stretch")
    pick = st.selectbox("Layers of", list(newest.pair), help="Each layer's output against an fp32 forward of the "
                        "same tokens: the rollout side, the training side, and the two sides' divergence.")
    layers = newest[newest.pair == pick].iloc[0].layers
    if layers:
        display.dataframe(pd.DataFrame(layers), hide_index=True, width="stretch")
reports = data.mismatch(url)
if reports.empty:
    st.info("No mismatch reports yet. Run `bench mismatch --model tiny-math --dtype all`.")
    st.stop()
model = st.selectbox("Model", list(dict.fromkeys(reports.model)))
view = reports[reports.model == model]
cols = [c for c in ("rollout_dtype", "train_dtype", "source", "engine", "limit", "n", "max_tokens", "device",
                    "cpu_16bit", "kl_k1", "kl_k1_bits", "kl_k3", "prob_abs_diff_mean", "prob_diff_max",
                    "prob_diff_min", "log_ratio_slope", "log_ratio_slope_se", "created_at")
        if c in view.columns]
display.dataframe(view[cols], hide_index=True, width="stretch")
router = [c for c in ROUTER_COLUMNS if c in view.columns]
if "router_flip_frac" in router and view.router_flip_frac.notna().any():
    st.subheader("Routing")
    st.caption("Mixture-of-experts reports: the share of (token, layer) top-k sets and of tokens the rollout and "
               "training engines routed differently, and the mismatch split by flipped and unflipped tokens; "
               "router_replay 1: π was scored with the rollout's experts (R3), the flips are what the trainer "
               "would have chosen (docs/moe.md).")
    moe = view[view.router_flip_frac.notna()]
    display.dataframe(moe[["rollout_dtype", "train_dtype", *router]], hide_index=True, width="stretch")
by_length = [r for r in view.itertuples() if isinstance(getattr(r, "length_buckets", None), list)
             and r.length_buckets]
if by_length:
    st.subheader("By response length")
    st.caption("Each report's sequences bucketed by response length |y|: per-token k3, and the sequence log-ratio "
               "ℓ = Σ_t (log π_t − log μ_t) — its mean, its variance (which sets a sequence IS weight's) and mean |ℓ| "
               "(bench/mismatch.py length_buckets).")
    display.dataframe(pd.DataFrame([{"rollout_dtype": r.rollout_dtype, "train_dtype": r.train_dtype,
                                     "|y|": f"{b['min_len']}–{b['max_len'] - 1}" if b["max_len"] else
                                     f"≥ {b['min_len']}", **{k: b[k] for k in ("sequences", "tokens", "k3",
                                                                            "seq_log_ratio_mean", "seq_log_ratio_var",
                                                                            "abs_log_w")}}
                                    for r in by_length for b in r.length_buckets]), hide_index=True, width="stretch")
ratios = offline_ratios(view)
st.subheader("bf16 ÷ fp16")
if ratios:
    st.caption("KL k3 of the newest bf16/bf16 report over the newest fp16/fp16 report measured under the same "
               "conditions (source, engine, problems, n, max tokens, device, CPU 16-bit kernel path).")
    display.dataframe(pd.DataFrame([{"source": r["source"], "conditions": conditions_text(r),
                                     "KL k3 bf16": r["kl_k3_bf16"], "KL k3 fp16": r["kl_k3_fp16"],
                                     "ratio": ratio_text(r["ratio"])} for r in ratios]),
                      hide_index=True, width="stretch")
else:
    st.caption("No bf16/bf16 and fp16/fp16 reports measured under the same conditions (reports from before "
               "conditions were recorded are never paired): run `bench mismatch --dtype bf16,fp16`.")
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
