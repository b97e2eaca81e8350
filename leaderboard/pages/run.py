"""One run's curves: reward, split accuracy, evaluations, every mismatch metric, grad norm,
loss scale, response length; its config and stop reason; its cell (engine, settings
fingerprint, seeds) and the settings that tell it apart from the other cells of its algorithm ×
precision. Refreshes while the run is running."""

import altair as alt
import pandas as pd
import streamlit as st

from bench.fingerprint import short
from leaderboard import data, display, verified
from leaderboard.cells import settings_spread, with_cell_key
from leaderboard.queries import decision_text

st.title("Run")
url, runs = data.runs_or_stop()
ids = list(runs.run)
wanted = st.query_params.get("run")
run_id = st.selectbox("Run", ids, index=ids.index(wanted) if wanted in ids else 0,
                      format_func=lambda r: f"{r} · {runs.set_index('run').loc[r, 'algo']} · "
                                            f"{runs.set_index('run').loc[r, 'precision']}")
st.query_params["run"] = run_id
info = data.run_info(url, run_id)
row = runs.set_index("run").loc[run_id]

c = st.columns(5)
c[0].metric("status", info["status"])
c[1].metric("sanity test", row.sanity)
c[2].metric("peak split accuracy", "—" if pd.isna(row.peak_accuracy) else f"{row.peak_accuracy:.3f}")
c[3].metric("steps", int(info["step"]))
c[4].metric("steps to pass", "—" if pd.isna(row.steps_to_target) else int(row.steps_to_target))
st.caption(f"decided: {decision_text(row.sanity, row.decided_by, row.decided_step)} — {row.decision} "
           "(recomputed from the run's evaluations by its own stop rules)")
if isinstance(row.evidence_problem, str):
    st.error(f"The stored status is not what the evaluations say: {row.evidence_problem}")
if isinstance(row.projection, str):
    st.caption(f"undecided: {row.projection}")
if info["stop_reason"]:
    st.caption(f"stop reason: {info['stop_reason']}")
if info.get("staleness"):
    st.caption(f"staleness K={int(info['staleness'])}: rollouts from the weights of {int(info['staleness'])} updates "
               "ago; the mismatch metrics are precision (π_old vs μ at those weights), `staleness_*` are π_θ vs π_old")
if info.get("kl_warning_step"):
    st.warning(f"Mismatch early warning: KL rose steadily up to step {int(info['kl_warning_step'])}.")

cal = info.get("calibration")
if isinstance(cal, dict):
    text = (f"step-0 calibration ({cal.get('pair')}, identical weights): mean |Δlog p| "
            f"{cal.get('abs_logp_diff_mean', float('nan')):.3g}, max {cal.get('abs_logp_diff_max', float('nan')):.3g}, "
            f"k3 {cal.get('k3', float('nan')):.3g}, IS ratio {cal.get('is_ratio_min', float('nan')):.3g}–"
            f"{cal.get('is_ratio_max', float('nan')):.3g}")
    (st.caption if cal.get("ok") else st.error)(text if cal.get("ok") else f"{text}. {cal.get('message', '')}")
checks = data.verifications(url)
checks = checks[checks.run == run_id]
last_check = verified.latest(checks).get(run_id)
window = f"; its deciding window: steps {row.deciding_window}" if isinstance(row.deciding_window, str) else ""
if last_check is None:
    st.caption(f"{row.verification}{window}: `bench runs verify {run_id}` re-runs its first steps (or `--window A:B` "
               "from a kept checkpoint) and compares every stored number")
else:
    where = last_check["device"] + (f", 16-bit path {last_check['cpu_16bit']}" if last_check.get("cpu_16bit") else "")
    text = (f"{row.verification}{window}. Latest: {verified.run_text(last_check)} ({where}, "
            f"{pd.Timestamp(last_check['created_at']):%Y-%m-%d %H:%M})")
    (st.error if last_check["verdict"] == "differs" else st.success if row.verified else st.info)(text)
prov = info.get("provenance")
if isinstance(prov, dict) and prov.get("split_accuracy_estimator"):
    st.caption(f"split accuracy: {prov['split_accuracy_estimator']}")

smooth = st.slider("Smoothing (moving average, steps)", 1, 50, 1)
live = info["status"] == "running" and st.toggle("Live refresh while running", value=True)


def curve(df: pd.DataFrame, cols: list[str], title: str, log: bool = False):
    cols = [c for c in cols if c in df.columns]
    if df.empty or not cols:
        return
    long = df[["step", *cols]].copy()
    long[cols] = long[cols].rolling(smooth, min_periods=1).mean()
    long = long.melt("step", var_name="metric", value_name="value").dropna()
    y = alt.Y("value:Q", scale=alt.Scale(type="symlog") if log else alt.Undefined, title=None)
    st.altair_chart(alt.Chart(long, title=title).mark_line().encode(x="step:Q", y=y, color="metric:N",
                                                                    tooltip=["step", "metric", "value"]),
                    width="stretch")


@st.fragment(run_every=data.TTL if live else None)
def charts():
    steps = data.steps(url, (run_id,))
    evals = data.evals(url, (run_id,))
    left, right = st.columns(2)
    with left:
        curve(steps, ["reward"], "training reward (batch accuracy)")
        if not evals.empty:
            st.altair_chart(alt.Chart(evals, title="evaluations (avg@n)").mark_line(point=True).encode(
                x="step:Q", y=alt.Y("score:Q", scale=alt.Scale(domain=[0, 1])), color="benchmark:N",
                tooltip=["step", "benchmark", "n", "score"]), width="stretch")
        curve(steps, ["response_len", "response_len_max"], "response length (tokens)")
        curve(steps, ["grad_norm"], "grad norm")
        curve(steps, ["loss_scale", "skipped_steps"], "fp16 loss scale / skipped steps", log=True)
    with right:
        curve(steps, ["kl_k1", "kl_k3", "kl_k2"], "KL[μ‖π] (nats)", log=True)
        curve(steps, ["prob_diff_max", "prob_diff_min", "prob_abs_diff_mean"], "π − μ on sampled tokens")
        curve(steps, ["log_ratio_slope"], "log(π/μ) vs length slope (per 1k tokens)")
        curve(steps, ["is_ratio_seq_min", "is_ratio_seq_mean", "is_ratio_seq_max"], "sequence IS ratio π/μ", log=True)
        if "staleness_k" in steps.columns and (steps.staleness_k.fillna(0) > 0).any():
            curve(steps, ["kl_k3", "staleness_kl_k3"], "KL k3: precision (π_old vs μ) and staleness (π_θ vs π_old)",
                  log=True)
            curve(steps, ["prob_abs_diff_mean", "staleness_abs_dp"], "mean |Δp|: precision and staleness")
        curve(steps, ["rollout_weights_moved"], "rollout weights moved at the sync (fraction of linear weights)")
        curve(steps, ["rollout_update_to_step"], "update size / the rollout format's grid step (median)", log=True)
        # MoE models only (docs/moe.md; absent columns: no curve); a group without tokens stores null
        moe = steps.assign(**{c: pd.to_numeric(steps[c], errors="coerce") for c in steps.columns if "router" in c})
        curve(moe, ["router_flip_frac", "router_token_flip_frac"], "router flips: (token, layer) pairs, tokens")
        curve(moe, ["kl_k3_router_flipped", "kl_k3_router_unflipped"], "KL k3: flipped / unflipped tokens", log=True)
        curve(steps, ["time_rollout", "time_scoring", "time_update", "time_eval"], "seconds per step")
    other = [c for c in steps.columns if c.startswith("loss/")] + ["loss"]
    curve(steps, other, "loss and loss metrics")


charts()
with st.expander("Config"):
    st.json(info["config"])
if isinstance(prov, dict):
    with st.expander("Provenance (versions, device, 16-bit matmuls, bench commit)"):
        st.json(prov)
if not checks.empty:
    with st.expander(f"Verifications ({len(checks)})"):
        shown = checks.drop(columns=["run"]).assign(first_difference=checks.first_difference.map(
            lambda d: "" if not isinstance(d, dict) else f"step {d.get('step')} {d.get('metric')}: stored "
            f"{d.get('stored')!r}, re-run {d.get('replayed')!r}"))
        display.dataframe(shown, hide_index=True, width="stretch")


def _config_diff():
    """What else changed: the stored config against its preset's defaults, as the run recorded
    them in its provenance (the app reads the store only)."""
    from bench import configdiff

    preset = (info["config"] or {}).get("preset")
    defaults = (prov or {}).get("preset_defaults") if isinstance(prov, dict) else None
    diff = None if defaults is None else configdiff.diff(defaults, info["config"] or {})
    st.subheader("What else changed")
    if diff is None:
        st.caption(f"The run recorded no preset defaults (preset {preset}); the Config above is the whole story.")
    elif not diff:
        st.caption(f"Every setting is preset {preset}'s default: the precision pair "
                   f"({info['rollout_dtype']} → {info['train_dtype']}) and the algorithm are the only choices.")
    else:
        st.caption(f"Settings that differ from preset {preset}'s defaults (besides the algorithm and the "
                   f"precision pair {info['rollout_dtype']} → {info['train_dtype']}):")
        display.dataframe(pd.DataFrame([{"setting": k, f"preset {preset}": a, "this run": b} for k, a, b in diff]),
                          hide_index=True, width="stretch")


_config_diff()


def _cell():
    """The run's cell (leaderboard/cells.py): its engine, settings fingerprint and seeds; and what
    tells it apart from the other cells of the same algorithm × precision on this build (another
    engine, or settings that differ: bench/configdiff.spread over the cells' newest configs)."""
    keyed = with_cell_key(runs)
    me = keyed.set_index("run").loc[run_id]
    same = ["model", "build", "algo", "precision", "trainer", "staleness"]
    near = keyed[(keyed[same] == me[same]).all(axis=1)]
    mine = near[(near.engine == me.engine) & (near.config_fp == me.config_fp)]
    seeds = " ".join("-" if x is None or x != x else str(int(x)) for x in sorted(set(mine.seed.dropna())))
    st.subheader("Cell")
    st.caption(f"{info['algo']} · {row.precision} on build {info['build_id']} · {info['trainer']} · engine "
               f"{me.engine} · settings cfg {short(me.config_fp)} (every setting but the seed): "
               f"{len(mine)} run(s), seeds {seeds or '-'}.")
    others = near[(near.engine != me.engine) | (near.config_fp != me.config_fp)]
    if others.empty:
        return
    name = lambda e, fp: f"{e} · cfg {short(fp)}"          # noqa: E731
    newest = near.sort_values("created_at", kind="stable")
    configs = {name(e, fp): c for e, fp, c in zip(newest.engine, newest.config_fp, newest.config)}
    this = name(me.engine, me.config_fp)
    configs = {this: configs.pop(this), **configs}
    st.caption(f"Other cells of {info['algo']} · {row.precision} on this build: "
               + ", ".join(k for k in configs if k != this) + ". What tells them apart:")
    spread = settings_spread(configs)
    engines = {k: k.split(" · ")[0] for k in configs}
    rows = ([{"setting": "engine", **engines}] if len(set(engines.values())) > 1 else []) + \
        [{"setting": key, **values} for key, values in spread]
    display.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


_cell()
