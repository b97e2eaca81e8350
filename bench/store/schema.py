"""The SQL store's tables (SQLAlchemy 2 declarative). Schema changes go through Alembic
migrations in bench/store/migrations; `bench db upgrade` applies them."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint,
                        event)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Model(Base):
    """A base model, identified by name and weights hash (None for hub ids not on disk)."""

    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(300))
    path: Mapped[str] = mapped_column(Text)
    weights_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    __table_args__ = (UniqueConstraint("name", "weights_hash", name="uq_models_name_hash"),)


class Build(Base):
    """One perfectible-split build: settings, status and its manifest."""

    __tablename__ = "builds"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    source: Mapped[str] = mapped_column(Text)
    engine: Mapped[str] = mapped_column(String(20))
    dtype: Mapped[str] = mapped_column(String(20))          # a format name (bench/formats.py)
    k: Mapped[int] = mapped_column(Integer)
    lo: Mapped[float] = mapped_column(Float)
    hi: Mapped[float] = mapped_column(Float)
    seed: Mapped[int] = mapped_column(Integer)
    shard: Mapped[str | None] = mapped_column(String(20))          # "i/n" for a shard, else None
    settings_hash: Mapped[str] = mapped_column(String(64))           # shards of one build share it
    status: Mapped[str] = mapped_column(String(20), default="running")  # running | complete | failed
    out_dir: Mapped[str | None] = mapped_column(Text)
    n_problems: Mapped[int | None] = mapped_column(Integer)
    n_kept: Mapped[int | None] = mapped_column(Integer)
    manifest: Mapped[dict | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    # content hash of the kept split (bench.problem_ids.split_hash): runs on one hash are comparable across stores
    split_hash: Mapped[str | None] = mapped_column(String(64), index=True)


class BuildProblem(Base):
    """Per-problem result of a build; `bucket` is kept | too_easy | too_hard | bad_gold."""

    __tablename__ = "build_problems"
    build_id: Mapped[str] = mapped_column(ForeignKey("builds.id", ondelete="CASCADE"), primary_key=True)
    problem_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    problem: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    n_samples: Mapped[int] = mapped_column(Integer)
    n_correct: Mapped[int] = mapped_column(Integer)
    accuracy: Mapped[float | None] = mapped_column(Float)
    bucket: Mapped[str] = mapped_column(String(20))
    kept: Mapped[bool] = mapped_column(Boolean)


class BuildRollout(Base):
    """One graded rollout of a build; the primary key makes a duplicate impossible."""

    __tablename__ = "build_rollouts"
    build_id: Mapped[str] = mapped_column(ForeignKey("builds.id", ondelete="CASCADE"), primary_key=True)
    problem_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    sample: Mapped[int] = mapped_column(Integer, primary_key=True)
    extracted: Mapped[str | None] = mapped_column(Text)
    verdict: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(Text)
    length: Mapped[int] = mapped_column(Integer)
    finish_reason: Mapped[str] = mapped_column(String(10))
    text: Mapped[str | None] = mapped_column(Text)


class Run(Base):
    """One training run: an algorithm at one precision pair on one build."""

    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    build_id: Mapped[str] = mapped_column(ForeignKey("builds.id"))
    algo: Mapped[str] = mapped_column(String(40))
    rollout_dtype: Mapped[str] = mapped_column(String(20))   # format names; "bf16+head32" is 11 characters
    train_dtype: Mapped[str] = mapped_column(String(20))
    trainer: Mapped[str] = mapped_column(String(20))
    engine: Mapped[str] = mapped_column(String(20))
    config: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(20), default="running")    # bench/statuses.py
    stop_reason: Mapped[str | None] = mapped_column(Text)
    step: Mapped[int] = mapped_column(Integer, default=0)
    peak_accuracy: Mapped[float | None] = mapped_column(Float)
    final_accuracy: Mapped[float | None] = mapped_column(Float)
    steps_to_target: Mapped[int | None] = mapped_column(Integer)
    wall_to_target: Mapped[float | None] = mapped_column(Float)
    kl_warning_step: Mapped[int | None] = mapped_column(Integer)
    wall_s: Mapped[float] = mapped_column(Float, default=0.0)
    checkpoint_dir: Mapped[str | None] = mapped_column(Text)
    # the step-0 gate (bench/calibration.py): μ vs π at identical weights, its band and verdict
    calibration: Mapped[dict | None] = mapped_column(JSON)
    # versions, hardware, 16-bit matmul mode, bench's commit, the split-accuracy estimator
    provenance: Mapped[dict | None] = mapped_column(JSON)
    seed: Mapped[int | None] = mapped_column(Integer)    # config["seed"], copied on insert (see below)
    # K: the rollout weights lag K optimizer steps behind (config["staleness"], copied on insert;
    # 0 for every run from before staleness): part of a leaderboard cell's key
    staleness: Mapped[int] = mapped_column(Integer, default=0, server_default="0", nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)
    # the last heartbeat of the run's process (runners/ledger.py): a `running` run silent for
    # bench.statuses.DEAD_AFTER_S reads as `interrupted`
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime)
    __table_args__ = (Index("ix_runs_build_cell", "build_id", "algo", "rollout_dtype", "train_dtype"),)


@event.listens_for(Run, "before_insert")
def _seed_from_config(mapper, connection, run: Run) -> None:
    """A run's seed and staleness are its config's: every writer (native, verl, an imported
    bundle) gets the columns filled, so a seeded sweep finds its finished (cell, K, seed) runs
    with one query."""
    if run.seed is None and isinstance(run.config, dict) and isinstance(run.config.get("seed"), int):
        run.seed = run.config["seed"]
    k = run.config.get("staleness") if isinstance(run.config, dict) else None
    if run.staleness is None and isinstance(k, int) and not isinstance(k, bool):
        run.staleness = k


class RunStep(Base):
    """Per-step metrics of a run (bench's metric names; every one defined in docs/metrics.md)."""

    __tablename__ = "run_steps"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    reward: Mapped[float | None] = mapped_column(Float)
    kl_k1: Mapped[float | None] = mapped_column(Float)       # the leaderboard's columns, also in metrics
    kl_k3: Mapped[float | None] = mapped_column(Float)
    prob_abs_diff_mean: Mapped[float | None] = mapped_column(Float)
    prob_diff_max: Mapped[float | None] = mapped_column(Float)
    prob_diff_min: Mapped[float | None] = mapped_column(Float)
    log_ratio_slope: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict] = mapped_column(JSON)              # every metric of the step, by bench's names
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)

    COLUMNS = ("reward", "kl_k1", "kl_k3", "prob_abs_diff_mean", "prob_diff_max", "prob_diff_min", "log_ratio_slope")

    @classmethod
    def from_metrics(cls, run_id: str, step: int, metrics: dict) -> "RunStep":
        """A row holding `metrics` (finite floats or None) with the leaderboard's columns filled."""
        return cls(run_id=run_id, step=step, metrics=metrics, **{k: metrics.get(k) for k in cls.COLUMNS})


class Eval(Base):
    """avg@n score of a run on one benchmark (or the split itself) at one step."""

    __tablename__ = "evals"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    benchmark: Mapped[str] = mapped_column(String(100), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    score: Mapped[float] = mapped_column(Float)


class RunDecision(Base):
    """A stop rule's shadow decision on a run (bench/stop.py `StopState.shadow`): the first
    split evaluation at which `rule` (converged, collapsed, futile, plateaued) would have ended
    the run, and what it would have said, whether or not the rule was on (`rule_on`); no row
    while a rule has not decided. Written by the native trainer after every evaluation."""

    __tablename__ = "run_decisions"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rule: Mapped[str] = mapped_column(String(20), primary_key=True)
    step: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(Text)
    rule_on: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class RunDigest(Base):
    """The digest of a native run's training state at an evaluation step and the chain over
    them (bench/statedigest.py): what a kept checkpoint and a re-run window are checked against."""

    __tablename__ = "run_digests"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    chain: Mapped[str] = mapped_column(String(64))
    # what the digest hashes (bench/statedigest.py SCHEMES): 1 for digests from before 2026-12-04 (the
    # migration's default); a new row without one is of the scheme the trainer records now
    scheme: Mapped[int] = mapped_column(Integer, server_default="1", default=2)


class RunVerification(Base):
    """One `bench runs verify` (runners/verify.py): the run's steps `window_start`+1 … `steps`
    re-run — from its build, config and seed (window_start 0: the first `steps` steps, with the
    calibration) or from a checkpoint it kept at `window_start` — and every stored per-step
    metric, evaluation and state digest in that window compared. `verdict`: bit-identical
    (required on the device and CPU kind the run recorded), within-tolerance (elsewhere;
    `tolerance` says which) or differs (`first_difference`: step, metric, stored and re-run
    values)."""

    __tablename__ = "run_verifications"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    device: Mapped[str] = mapped_column(String(20))
    device_name: Mapped[str | None] = mapped_column(Text)
    cpu_16bit: Mapped[str | None] = mapped_column(String(10))   # cpu_kernel_path() on a CPU; None on a GPU
    steps: Mapped[int] = mapped_column(Integer)
    compared: Mapped[int] = mapped_column(Integer)             # values compared
    differences: Mapped[int] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(20))
    tolerance: Mapped[str | None] = mapped_column(Text)        # None: bit-identical was required
    first_difference: Mapped[dict | None] = mapped_column(JSON)
    bench_commit: Mapped[str | None] = mapped_column(String(40))   # the bench that re-ran (the run's: provenance)
    window_start: Mapped[int] = mapped_column(Integer, default=0)  # re-run from the state after this step
    # how the state digests were compared (runners/verify_compare.py comparable_digests): None where every one
    # was, else e.g. "not comparable (scheme 1)"; None too on verifications from before it was recorded
    digests: Mapped[str | None] = mapped_column(Text)


class MismatchReport(Base):
    """Offline mismatch analysis of one model at one precision pair, with the conditions it was
    measured under (None on reports from before they were recorded): only reports of the same
    conditions are compared with one another."""

    __tablename__ = "mismatch_reports"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    rollout_dtype: Mapped[str] = mapped_column(String(20))   # format names; "bf16+head32" is 11 characters
    train_dtype: Mapped[str] = mapped_column(String(20))
    source: Mapped[str] = mapped_column(Text)
    n: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict] = mapped_column(JSON)
    plots: Mapped[dict | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    engine: Mapped[str | None] = mapped_column(String(20))       # rollout engine: torch | vllm
    limit: Mapped[int | None] = mapped_column(Integer)           # first N problems; None: all (or not recorded)
    max_tokens: Mapped[int | None] = mapped_column(Integer)      # the response budget the samples had
    device: Mapped[str | None] = mapped_column(String(20))
    cpu_16bit: Mapped[str | None] = mapped_column(String(10))    # cpu_kernel_path() on a CPU; None on a GPU
    attention: Mapped[str | None] = mapped_column(String(20))    # "cascade"; None: the engine's plain decode


class CheckReport(Base):
    """One `bench check`: a model's engine pairs judged against a tolerance contract, with the
    conditions it was measured under and each pair's metrics, layers and verdicts (JSON)."""

    __tablename__ = "check_reports"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    engine: Mapped[str] = mapped_column(String(20))
    ok: Mapped[bool] = mapped_column(Boolean)
    contract_digest: Mapped[str] = mapped_column(String(40))
    conditions: Mapped[dict] = mapped_column(JSON)
    pairs: Mapped[list] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
