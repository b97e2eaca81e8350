"""Read-only queries over the store, shared by the Streamlit app and `bench report`.
Every filter is a bound parameter; results are pandas frames."""

from __future__ import annotations

import pandas as pd
from sqlalchemy import event, func, select
from sqlalchemy.engine import Engine

from bench import statuses
from bench.fingerprint import fingerprint
from bench.precision import pair_name
from bench.store import (Build, BuildProblem, CheckReport, Eval, MismatchReport, Model, Run, RunStep,
                         RunVerification)


EARLY_RULES = ("converged", "futile", "plateaued", "collapsed")   # bench/stop.py: the rules a verdict comes from


def early_verdict(status: str | None, step) -> str | None:
    """A verdict a stop rule gave before max_steps, as such: "FAIL by futile at step 95",
    "PASS by converged at step 60"; None for any other end (max_steps, diverged, ...)."""
    if status not in EARLY_RULES or step is None or step != step:
        return None
    return f"{statuses.verdict(status)} by {status} at step {int(step)}"


def decision_text(verdict: str, rule, step) -> str:
    """How a run's verdict was reached: "PASS by converged at step 60", "FAIL by calibration at
    step 0", "UNDECIDED: budget at step 80"; the verdict alone where no rule decided."""
    if not isinstance(rule, str) or step is None or step != step:
        return verdict
    return f"{verdict}{': budget' if rule == 'budget' else f' by {rule}'} at step {int(step)}"


LABEL_ONLY = "label only"          # evidence_problem's start for a run whose rules have nothing to replay


def _with_decisions(engine: Engine, runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with each run's verdict recomputed from its stored evidence (bench/verdicts.py):
    `sanity` (the verdict), `decided_by` (the rule), `decided_step`, `decision` (its reason),
    `evidence_problem` (None, or why the stored status is not what the evidence says; a run with
    no split evaluation stored at all keeps its status's verdict, flagged as a label) and, for an
    UNDECIDED run, `projection` (where the futility rule's optimistic line reaches the target)."""
    from bench import verdicts, verification

    with engine.connect() as c:
        evidence = verdicts.from_store(c, list(runs.run))
    checks = {}
    for v in verifications_frame(engine, list(runs.run)).to_dict("records"):
        checks.setdefault(v["run"], []).append(v)
    rows = []
    for rid in runs.run:
        ev = evidence.get(rid)
        if ev is None:
            rows.append((statuses.NO_VERDICT, None, None, None, "no evidence", None, None))
            continue
        if not ev.evals and ev.status not in verdicts.NO_CLAIM and ev.status != statuses.MISCALIBRATED:
            # nothing to replay the rules over: the label stands, and says it is only a label
            rows.append((statuses.verdict(ev.status), None, None, None,
                         f"{LABEL_ONLY}: no split evaluation stored, {ev.status!r} is as recorded", None, None))
            continue
        d = verdicts.decide(ev)
        proj = verdicts.projection(ev)[1] if d.verdict == statuses.UNDECIDED else None
        rows.append((d.verdict, d.rule, d.step, d.reason, verdicts.check(ev, d), proj, verdicts.deciding_window(ev, d)))
    r = runs.copy()
    (r["sanity"], r["decided_by"], r["decided_step"], r["decision"], r["evidence_problem"],
     r["projection"], windows) = ([x[i] for x in rows] for i in range(7))
    r["decided_step"] = r.decided_step.astype("Int64")
    levels = [verification.level(int(step or 0), w, checks.get(rid, [])) for rid, step, w in
              zip(r.run, r.steps, windows)]
    r["deciding_window"] = [None if w is None else f"{w[0] + 1}–{w[1]}" if w[1] else "0" for w in windows]
    r["verification"] = [x.text for x in levels]
    r["verification_level"] = [x.level for x in levels]
    r["verified"] = [x.verified for x in levels]
    return r


# split accuracy as training sees it (rollout format) and as the trained policy answers (train format)
SPLIT_EVALS = ("split", "split@train")


def read_only(engine: Engine) -> Engine:
    """Make every connection of `engine` refuse writes (SQLite query_only, PostgreSQL read-only
    transactions): the app never writes to the store."""
    dialect = engine.dialect.name

    @event.listens_for(engine, "connect")
    def _ro(dbapi_conn, _):
        if dialect == "sqlite":
            dbapi_conn.execute("PRAGMA query_only=ON")
        elif dialect == "postgresql":
            prev = dbapi_conn.autocommit
            dbapi_conn.autocommit = True
            cur = dbapi_conn.cursor()
            cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            cur.close()
            dbapi_conn.autocommit = prev
    engine.dispose()          # connections opened before the listener was added would still write
    return engine


def _read(engine: Engine, q) -> pd.DataFrame:
    with engine.connect() as c:
        return pd.read_sql(q, c)


ROUTER_TAIL = ("router_flip_frac", "router_token_flip_frac")   # MoE runs' step metrics (bench/router_metrics.py)


def live(status: str, heartbeat_at, updated_at) -> str:
    """The status shown: `interrupted` for a `running` run whose process went silent
    (bench/statuses.py `live_status`; its heartbeat, else its last update)."""
    sign = statuses.last_sign(heartbeat_at, updated_at)
    return statuses.live_status(status, None if sign is None else pd.Timestamp(sign).to_pydatetime())


def runs_frame(engine: Engine, build_id: str | None = None) -> pd.DataFrame:
    """One row per run with its leaderboard columns; mismatch over the last tenth of the run.
    `mean_router_flip_frac` / `mean_router_token_flip_frac`: an MoE run's router flips over
    the same steps (null for a dense model).
    `mean_kl` is the per-token k3 estimate of KL[μ‖π] (non-negative, low variance); the
    per-sequence k1 (`mean_kl_k1`) sits at its noise floor for fp16 on short answers.
    `config` is the stored run config and `config_fp` its settings fingerprint
    (bench/fingerprint.py: every setting but the seed), part of the cell key."""
    q = (select(Run.id.label("run"), Model.name.label("model"), Run.build_id.label("build"), Run.algo,
                Run.rollout_dtype, Run.train_dtype, Run.trainer, Run.engine, Run.status, Run.stop_reason,
                Run.peak_accuracy, Run.final_accuracy, Run.steps_to_target, Run.wall_to_target, Run.step.label("steps"),
                Run.wall_s, Run.kl_warning_step, Run.seed, Run.staleness, Run.config, Run.created_at, Run.updated_at,
                Run.heartbeat_at)
         .join(Model, Model.id == Run.model_id))
    if build_id:
        q = q.where(Run.build_id == build_id)
    runs = _read(engine, q.order_by(Run.created_at.desc()))
    if runs.empty:
        return runs
    runs["status"] = [live(st, hb, up) for st, hb, up in zip(runs.status, runs.heartbeat_at, runs.updated_at)]
    last = select(RunStep.run_id, func.max(RunStep.step).label("last")).group_by(RunStep.run_id).subquery()
    tail = _read(engine, select(RunStep.run_id.label("run"), func.avg(RunStep.kl_k3).label("mean_kl"),
                                func.avg(RunStep.kl_k1).label("mean_kl_k1"),
                                func.max(func.abs(RunStep.prob_diff_max)).label("dp_max"),
                                func.max(func.abs(RunStep.prob_diff_min)).label("dp_min"),
                                func.avg(RunStep.log_ratio_slope).label("log_ratio_slope"),
                                *[func.avg(RunStep.metrics[key].as_float()).label(f"mean_{key}")
                                  for key in ROUTER_TAIL])
                 .join(last, last.c.run_id == RunStep.run_id)
                 .where(RunStep.step * 10 >= last.c.last * 9).group_by(RunStep.run_id))
    tail["max_abs_dp"] = tail[["dp_max", "dp_min"]].max(axis=1)
    runs = runs.merge(tail.drop(columns=["dp_max", "dp_min"]), on="run", how="left")
    best = _read(engine, select(Eval.run_id.label("run"), func.max(Eval.score).label("best_eval"))
                 .where(Eval.benchmark.notin_(SPLIT_EVALS)).group_by(Eval.run_id))
    last_eval = select(Eval.run_id, func.max(Eval.step).label("s")).where(Eval.benchmark.notin_(SPLIT_EVALS)) \
        .group_by(Eval.run_id).subquery()
    lastv = _read(engine, select(Eval.run_id.label("run"), func.avg(Eval.score).label("last_eval"))
                  .join(last_eval, (last_eval.c.run_id == Eval.run_id) & (last_eval.c.s == Eval.step))
                  .where(Eval.benchmark.notin_(SPLIT_EVALS)).group_by(Eval.run_id))
    runs = runs.merge(best, on="run", how="left").merge(lastv, on="run", how="left")
    runs["precision"] = [pair_name(r, t) for r, t in zip(runs.rollout_dtype, runs.train_dtype)]
    runs["config_fp"] = [fingerprint(c) for c in runs.config]
    return _with_decisions(engine, runs)


def report_columns() -> list[str]:
    return ["run", "model", "build", "algo", "precision", "engine", "config_fp", "staleness", "status", "sanity",
            "decided_by", "decided_step", "evidence_problem", "deciding_window", "verification", "verified",
            "peak_accuracy", "final_accuracy", "steps_to_target", "wall_to_target",
            "best_eval", "last_eval", "mean_kl", "mean_kl_k1", "max_abs_dp", "log_ratio_slope", "steps"]


def ranked(runs: pd.DataFrame) -> pd.DataFrame:
    """Best first: passing (converged) runs by steps to target, then the rest (running or
    ended otherwise) by peak accuracy; a single reading >= target (steps_to_target) does not
    rank a run that did not pass."""
    if runs.empty:
        return runs
    r = runs.copy()
    r["_pass"] = r.sanity == "PASS"
    r["_to_target"] = r.steps_to_target.where(r._pass)
    r = r.sort_values(["_pass", "_to_target", "peak_accuracy"], ascending=[False, True, False], na_position="last")
    return r.drop(columns=["_pass", "_to_target"]).reset_index(drop=True)


def run_info(engine: Engine, run_id: str) -> dict | None:
    df = _read(engine, select(Run, Model.name.label("model")).join(Model, Model.id == Run.model_id)
               .where(Run.id == run_id))
    return None if df.empty else df.iloc[0].to_dict()


def run_steps(engine: Engine, run_ids: list[str]) -> pd.DataFrame:
    """Per-step metrics of the runs, one column per metric (bench's names)."""
    df = _read(engine, select(RunStep.run_id, RunStep.step, RunStep.metrics).where(RunStep.run_id.in_(run_ids))
               .order_by(RunStep.run_id, RunStep.step))
    if df.empty:
        return pd.DataFrame(columns=["run_id", "step"])
    metrics = pd.DataFrame(list(df.metrics.map(lambda m: m or {})))
    return pd.concat([df[["run_id", "step"]].reset_index(drop=True), metrics], axis=1)


def run_evals(engine: Engine, run_ids: list[str]) -> pd.DataFrame:
    return _read(engine, select(Eval.run_id, Eval.step, Eval.benchmark, Eval.n, Eval.score)
                 .where(Eval.run_id.in_(run_ids)).order_by(Eval.step))


def builds_frame(engine: Engine) -> pd.DataFrame:
    return _read(engine, select(Build.id.label("build"), Model.name.label("model"), Build.status, Build.source,
                                Build.engine, Build.dtype, Build.k, Build.lo, Build.hi, Build.shard, Build.n_problems,
                                Build.n_kept, Build.manifest, Build.split_hash, Build.created_at)
                 .join(Model, Model.id == Build.model_id).order_by(Build.created_at.desc()))


def build_problems(engine: Engine, build_id: str) -> pd.DataFrame:
    return _read(engine, select(BuildProblem.problem_id, BuildProblem.problem, BuildProblem.answer,
                                BuildProblem.accuracy, BuildProblem.n_correct, BuildProblem.n_samples,
                                BuildProblem.bucket).where(BuildProblem.build_id == build_id)
                 .order_by(BuildProblem.position))


VERIFICATION_COLUMNS = ["run", "created_at", "device", "device_name", "cpu_16bit", "steps", "compared", "differences",
                        "verdict", "tolerance", "first_difference", "bench_commit", "window_start", "digests"]


def verifications_frame(engine: Engine, run_ids: list[str] | None = None) -> pd.DataFrame:
    """Every `bench runs verify` of the runs (all runs when None), newest first; empty on a store
    from before verifications were stored."""
    from sqlalchemy import inspect

    if not inspect(engine).has_table(RunVerification.__tablename__):
        return pd.DataFrame(columns=VERIFICATION_COLUMNS)
    q = select(RunVerification.run_id.label("run"), *(getattr(RunVerification, c) for c in VERIFICATION_COLUMNS[1:]))
    if run_ids is not None:
        q = q.where(RunVerification.run_id.in_(run_ids))
    df = _read(engine, q.order_by(RunVerification.created_at.desc(), RunVerification.id.desc()))
    return df if not df.empty else pd.DataFrame(columns=VERIFICATION_COLUMNS)


def check_frame(engine: Engine) -> pd.DataFrame:
    """`bench check` reports, newest first: one row per report × pair, with its verdict, the
    broken lines and where the mismatch enters."""
    rows = _read(engine, select(CheckReport.id, Model.name.label("model"), CheckReport.engine, CheckReport.ok,
                                CheckReport.contract_digest, CheckReport.conditions, CheckReport.pairs,
                                CheckReport.created_at)
                 .join(Model, Model.id == CheckReport.model_id).order_by(CheckReport.created_at.desc()))
    out = []
    for r in rows.itertuples():
        cond = r.conditions or {}
        for p in r.pairs or []:
            broken = [f"{v['metric']}: {v['reason']}" for v in p.get("verdicts", []) if not v.get("ok")]
            m = p.get("metrics") or {}
            out.append({"report": r.id, "model": r.model, "created_at": r.created_at, "engine": r.engine,
                        "cpu_16bit": cond.get("cpu_16bit"), "contract": r.contract_digest, "pair": p.get("pair"),
                        "verdict": "PASS" if not broken else "FAIL", "lines": len(p.get("verdicts", [])),
                        "broken": "; ".join(broken), "enters": p.get("enters") or "", "kl_k3": m.get("kl_k3"),
                        "kl_full": m.get("kl_full"), "token_mult_prob_error": m.get("token_mult_prob_error"),
                        "flags": "; ".join(p.get("flags") or []), "layers": p.get("layers") or []})
    return pd.DataFrame(out)


def mismatch_frame(engine: Engine) -> pd.DataFrame:
    df = _read(engine, select(MismatchReport.id, Model.name.label("model"), MismatchReport.rollout_dtype,
                              MismatchReport.train_dtype, MismatchReport.source, MismatchReport.n,
                              MismatchReport.engine, MismatchReport.limit, MismatchReport.max_tokens,
                              MismatchReport.device, MismatchReport.cpu_16bit, MismatchReport.attention,
                              MismatchReport.metrics, MismatchReport.plots, MismatchReport.created_at)
               .join(Model, Model.id == MismatchReport.model_id).order_by(MismatchReport.created_at.desc()))
    if df.empty:
        return df
    # scalar metrics become columns; the per-length table (bench/mismatch.py length_buckets) stays one column
    scalars = pd.DataFrame(list(df.metrics.map(lambda m: {k: v for k, v in (m or {}).items()
                                                          if not isinstance(v, (list, dict))})))
    scalars["length_buckets"] = list(df.metrics.map(lambda m: (m or {}).get("length_buckets")))
    return pd.concat([df.drop(columns=["metrics"]).reset_index(drop=True), scalars], axis=1)
