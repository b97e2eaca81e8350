"""The store on real SQLite and real PostgreSQL: migrations, constraints, bad URLs."""

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import IntegrityError

from bench.store import (Build, BuildRollout, Run, RunStep, StoreError, get_or_create_model, open_store,
                         session)

pytestmark = pytest.mark.integration


def _build(s, model_id, bid="b1"):
    b = Build(id=bid, model_id=model_id, source="synthetic", engine="torch", dtype="bf16", k=2, lo=0.2, hi=0.8,
              seed=0, settings_hash="h", n_problems=1)
    s.add(b)
    return b


def test_migrations_create_every_table(db_url):
    engine = open_store(db_url)
    names = set(inspect(engine).get_table_names())
    assert {"models", "builds", "build_problems", "build_rollouts", "runs", "run_steps", "evals",
            "mismatch_reports", "run_decisions", "alembic_version"} <= names
    with engine.connect() as c:
        head = c.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    assert len(head) == 1
    again = open_store(db_url)                                          # idempotent: still one row, the same head
    with again.connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == head
    assert set(inspect(again).get_table_names()) == names


def test_rows_roundtrip_and_duplicate_rollout_is_refused(db_url):
    engine = open_store(db_url)
    with session(engine) as s:
        m = get_or_create_model(s, "tiny-math", "/x", "abc")
        assert get_or_create_model(s, "tiny-math", "/x", "abc").id == m.id
        _build(s, m.id)
        s.add(BuildRollout(build_id="b1", problem_id="p", sample=0, extracted="1", verdict="correct",
                           reason="", length=3, finish_reason="stop"))
    with pytest.raises(IntegrityError):
        with session(engine) as s:
            s.add(BuildRollout(build_id="b1", problem_id="p", sample=0, extracted="2", verdict="wrong",
                               reason="", length=3, finish_reason="stop"))
    with session(engine) as s:
        assert s.scalars(select(BuildRollout.extracted)).all() == ["1"]


def test_json_metrics_roundtrip(db_url):
    engine = open_store(db_url)
    with session(engine) as s:
        m = get_or_create_model(s, "m", "/m", None)
        _build(s, m.id)
        s.flush()
        s.add(Run(id="r1", model_id=m.id, build_id="b1", algo="grpo", rollout_dtype="bf16", train_dtype="bf16",
                  trainer="native", engine="torch", config={"lr": 5e-4}))
        s.flush()
        s.add(RunStep(run_id="r1", step=1, reward=0.5, metrics={"kl_k1": 1e-4, "loss": -0.1}))
    with session(engine) as s:
        st = s.get(RunStep, ("r1", 1))
        assert st.metrics == {"kl_k1": 1e-4, "loss": -0.1}
        assert s.get(Run, "r1").config == {"lr": 5e-4}


def test_unreachable_url_is_one_readable_error():
    with pytest.raises(StoreError, match="cannot open store postgresql"):
        open_store("postgresql+psycopg://nobody:secret@127.0.0.1:1/none?connect_timeout=2")
    with pytest.raises(StoreError) as e:
        open_store("postgresql+psycopg://nobody:secret@127.0.0.1:1/none?connect_timeout=2")
    assert "secret" not in str(e.value)
    with pytest.raises(StoreError, match="cannot open store"):
        open_store("notadb://x")


def test_migrations_0006_and_0007_keep_old_reports_without_conditions(db_url):
    """A store at 0005 with an offline report: at head the report has no conditions (NULL, so no
    ratio pairs it), run_verifications exists, a verification goes with its run; down to 0005
    and up again works."""
    from alembic import command
    from sqlalchemy import text

    from bench.store import RunVerification, _alembic_config
    from conftest import store_at_revision
    from leaderboard.queries import mismatch_frame
    from leaderboard.summary import offline_ratios

    engine = store_at_revision(db_url, "0005")
    with engine.begin() as c:
        for i, dt in enumerate(("bf16", "fp16")):
            c.execute(text("INSERT INTO mismatch_reports (id, model_id, rollout_dtype, train_dtype, source, n, "
                           "metrics, created_at) VALUES (:id, 1, :dt, :dt, 's', 8, :m, '2026-01-01')"),
                      {"id": i + 1, "dt": dt, "m": '{"kl_k3": 0.001}'})
    engine = open_store(db_url)
    frame = mismatch_frame(engine)
    assert len(frame) == 2 and frame[["engine", "limit", "max_tokens", "device", "cpu_16bit"]].isna().all().all()
    assert offline_ratios(frame) == []
    assert "run_verifications" in inspect(engine).get_table_names()
    with session(engine) as s:
        s.add(Run(id="r1", model_id=1, build_id="b1", algo="grpo", rollout_dtype="fp32", train_dtype="fp32",
                  trainer="native", engine="torch", config={}))
        s.flush()
        s.add(RunVerification(run_id="r1", device="cpu", cpu_16bit="none", steps=3, compared=10, differences=0,
                              verdict="bit-identical", first_difference={"step": 2, "metric": "reward"}))
    with session(engine) as s:
        assert s.scalars(select(RunVerification.first_difference)).one() == {"step": 2, "metric": "reward"}
        s.delete(s.get(Run, "r1"))
    with session(engine) as s:
        assert s.scalars(select(RunVerification)).all() == []          # gone with its run
    cfg = _alembic_config(engine.execution_options(bench_migration=True))
    command.downgrade(cfg, "0005")
    assert "run_verifications" not in inspect(engine).get_table_names()
    command.upgrade(cfg, "head")
    assert {"engine", "limit", "cpu_16bit"} <= {c["name"] for c in inspect(engine).get_columns("mismatch_reports")}


@pytest.mark.parametrize("argv", [["report"], ["runs"], ["runs", "show", "r0"], ["builds"], ["leaderboard"]])
def test_a_read_only_verb_refuses_a_store_that_does_not_exist(tmp_path, argv):
    """Reading a store nothing was recorded in says so and exits 2; it creates neither the folder
    nor an empty store (house review 2026-12-02: `bench report` on a misspelt path answered "no
    runs yet", exit 0, and left an empty store behind)."""
    from typer.testing import CliRunner

    from bench.cli import app

    where = tmp_path / "no" / "such" / "dir"
    r = CliRunner().invoke(app, [*argv, "--db", f"sqlite:///{where / 'x.db'}"])
    assert r.exit_code == 2 and "no store at" in r.output, (r.exit_code, r.output)
    assert not (tmp_path / "no").exists()
