"""Read-only queries over the store, shared by the Streamlit app and `bench report`.
Every filter is a bound parameter; results are pandas frames."""

from __future__ import annotations

import pandas as pd
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from bench.store import Build, Eval, Model, Run, RunStep

PASS_THRESHOLD = 0.95


def runs_frame(engine: Engine, build_id: str | None = None) -> pd.DataFrame:
    """One row per run with its leaderboard columns."""
    q = (select(Run.id.label("run"), Model.name.label("model"), Run.build_id.label("build"), Run.algo,
                Run.rollout_dtype, Run.train_dtype, Run.trainer, Run.engine, Run.status, Run.stop_reason,
                Run.peak_accuracy, Run.final_accuracy, Run.steps_to_target, Run.wall_to_target, Run.step.label("steps"),
                Run.wall_s, Run.kl_warning_step, Run.created_at)
         .join(Model, Model.id == Run.model_id))
    if build_id:
        q = q.where(Run.build_id == build_id)
    with engine.connect() as c:
        runs = pd.read_sql(q.order_by(Run.created_at.desc()), c)
        # mismatch over the last tenth of each run: steps > 0.9 * last step
        last = select(RunStep.run_id, func.max(RunStep.step).label("last")).group_by(RunStep.run_id).subquery()
        tail = pd.read_sql(select(RunStep.run_id, RunStep.step, RunStep.kl_k1, RunStep.metrics)
                           .join(last, last.c.run_id == RunStep.run_id)
                           .where(RunStep.step * 10 >= last.c.last * 9), c)
        evals = pd.read_sql(select(Eval.run_id, Eval.step, Eval.benchmark, Eval.score).where(Eval.benchmark != "split"), c)
    if runs.empty:
        return runs
    if not tail.empty:
        tail["prob_diff_absmax"] = tail.metrics.map(
            lambda m: max(abs(m.get("prob_diff_max") or 0), abs(m.get("prob_diff_min") or 0)))
        tail["log_ratio_slope"] = tail.metrics.map(lambda m: m.get("log_ratio_slope"))
        agg = tail.groupby("run_id").agg(mean_kl=("kl_k1", "mean"), max_abs_dp=("prob_diff_absmax", "max"),
                                         log_ratio_slope=("log_ratio_slope", "mean"))
        runs = runs.merge(agg, left_on="run", right_index=True, how="left")
    else:
        runs[["mean_kl", "max_abs_dp", "log_ratio_slope"]] = None
    if not evals.empty:
        ev = evals.sort_values("step").groupby("run_id").agg(best_eval=("score", "max"), last_eval=("score", "last"))
        runs = runs.merge(ev, left_on="run", right_index=True, how="left")
    else:
        runs[["best_eval", "last_eval"]] = None
    runs["precision"] = [r if r == t else f"{r}→{t}" for r, t in zip(runs.rollout_dtype, runs.train_dtype)]
    runs["sanity"] = ["PASS" if (p or 0) >= PASS_THRESHOLD else "FAIL" for p in runs.peak_accuracy.fillna(0)]
    return runs


def report_columns() -> list[str]:
    return ["run", "model", "build", "algo", "precision", "status", "sanity", "peak_accuracy", "final_accuracy",
            "steps_to_target", "wall_to_target", "best_eval", "last_eval", "mean_kl", "max_abs_dp",
            "log_ratio_slope", "steps"]


def ranked(runs: pd.DataFrame) -> pd.DataFrame:
    """Best first: passing runs by steps to target, then the rest by peak accuracy."""
    if runs.empty:
        return runs
    r = runs.copy()
    r["_pass"] = r.sanity == "PASS"
    r = r.sort_values(["_pass", "steps_to_target", "peak_accuracy"], ascending=[False, True, False], na_position="last")
    return r.drop(columns="_pass").reset_index(drop=True)
