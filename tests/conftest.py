"""Shared fixtures: an isolated BENCH_HOME, store URLs for SQLite and PostgreSQL (a fresh
schema per test), one grader pool per session."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

# tools/screenshot.py starts the app and Chromium for the docs' images; the browser tests start them the same way
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

PG_BASE = os.environ.get("BENCH_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
# `./bench.sh test` sets up every service and sets BENCH_TEST_SERVICES=require: a missing service
# then fails its tests. Elsewhere (pytest by hand, `./bench.sh test --quick`) they skip, saying why.
REQUIRE_SERVICES = os.environ.get("BENCH_TEST_SERVICES") == "require"


def missing_service(reason: str):
    """Fail (services required) or skip (otherwise) a test whose service is absent."""
    (pytest.fail if REQUIRE_SERVICES else pytest.skip)(reason)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Every test starts at one torch thread and leaves the count as it found it: bench's
    bit-identities hold at one thread (docs/development.md), and a test's numbers must depend
    neither on the machine's core count nor on which tests its worker ran before (the engines
    and the trainer set the count process-wide)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def bench_home(tmp_path, monkeypatch):
    home = tmp_path / "bench_home"
    monkeypatch.setenv("BENCH_HOME", str(home))
    monkeypatch.delenv("BENCH_DB_URL", raising=False)
    return home


def _pg_schema_url():
    import psycopg
    from sqlalchemy.engine import make_url

    schema = f"t_{uuid.uuid4().hex[:10]}"
    u = make_url(PG_BASE)
    try:
        with psycopg.connect(host=u.host, port=u.port, dbname=u.database, user=u.username, autocommit=True,
                             connect_timeout=5) as c:
            c.execute(f"CREATE SCHEMA {schema}")
    except psycopg.OperationalError as e:
        missing_service(f"PostgreSQL at {u.host}:{u.port} is not reachable: {e}")
    return f"{PG_BASE}?options=-csearch_path%3D{schema}", schema, u


def _drop_schema(schema, u):
    import psycopg

    with psycopg.connect(host=u.host, port=u.port, dbname=u.database, user=u.username, autocommit=True) as c:
        c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def pg_url():
    """A fresh schema in PostgreSQL's `test` database, dropped afterwards."""
    url, schema, u = _pg_schema_url()
    yield url
    _drop_schema(schema, u)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    """A store URL: a fresh SQLite file, or a fresh schema in PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture(scope="session")
def grader():
    from bench.grading import Grader

    with Grader(timeout=5.0) as g:
        yield g


@pytest.fixture(scope="session")
def shared_data():
    """The directory of the paper's data as bench ships it (bench/data: aime24.jsonl,
    amc23.jsonl, math500.jsonl, sanity_r1d_1p5b.jsonl, paper_reference.json)."""
    from bench.problems import DATA_DIR

    return str(DATA_DIR)


@pytest.fixture(scope="session")
def verl_python():
    """verl 0.9.1's interpreter (its own environment: ./bench.sh test makes .venv-verl)."""
    from runners.verl_runner import check_verl_version, installed_verl_version

    py = os.environ.get("BENCH_VERL_PYTHON") or str(Path(__file__).parent.parent / ".venv-verl" / "bin" / "python")
    if not Path(py).exists():
        missing_service(f"no verl environment at {py}: ./bench.sh test creates it (or set BENCH_VERL_PYTHON)")
    check_verl_version(installed_verl_version(py))
    return py


def small_grpo_run(tmp, *run_args: str) -> tuple[str, str]:
    """(store URL, run id): a store under `tmp` (BENCH_HOME beside it) holding a real 12-problem
    tiny-math build (k 2, fp32, band [0, 1]) and one grpo fp32 run at 2 prompts × 2 on one thread,
    with `run_args` (its steps, evaluations, checkpoints)."""
    import json

    from typer.testing import CliRunner

    from bench.cli import app

    url = f"sqlite:///{tmp / 'src.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCH_HOME", str(tmp / "home"))
        r = CliRunner().invoke(app, ["build", "--limit", "12", "--k", "2", "--engine", "torch", "--dtype", "fp32",
                                     "--band", "0", "1", "--db", url, "--json"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(app, ["run", "--algo", "grpo", "--dtype", "fp32", *run_args, "--prompts-per-step", "2",
                                     "--samples-per-prompt", "2", "--threads", "1", "--db", url, "--json"])
        assert r.exit_code == 0, r.output
    return url, json.loads(r.stdout)["id"]


def store_at_revision(url: str, revision: str, build_id: str = "b1", dtype: str = "fp32"):
    """A store migrated only up to `revision`, holding model 1 and build `build_id` (written by
    raw SQL: the ORM classes describe the head schema). For migration tests: add the rows the
    migration must carry, then `open_store(url)` upgrades to head."""
    from alembic import command
    from sqlalchemy import text

    from bench.store import _alembic_config, open_store

    engine = open_store(url, migrate=False)
    command.upgrade(_alembic_config(engine.execution_options(bench_migration=True)), revision)
    with engine.begin() as c:
        c.execute(text("INSERT INTO models (id, name, path, weights_hash, created_at) VALUES (1, 'm', '/m', 'h', "
                       "'2026-01-01')"))
        c.execute(text("INSERT INTO builds (id, model_id, source, engine, dtype, k, lo, hi, seed, settings_hash, "
                       "status, created_at) VALUES (:id, 1, 's', 'torch', :dtype, 4, 0.2, 0.8, 0, 'h', 'complete', "
                       "'2026-01-01')"), {"id": build_id, "dtype": dtype})
    return engine


def add_model_and_build(s, build_id: str = "b0", dtype: str = "fp32", n_problems: int = 10, n_kept: int = 5) -> int:
    """Model `tiny-math` and a complete build `build_id` (k 8, band 0.2–0.8) added in ORM session `s`,
    flushed; returns the model's id. For tests that hand-make runs on a head-schema store."""
    from bench.store import Build, Model

    m = Model(name="tiny-math", path="/x", weights_hash="h")
    s.add(m)
    s.flush()
    s.add(Build(id=build_id, model_id=m.id, source="synthetic", engine="torch", dtype=dtype, k=8, lo=0.2, hi=0.8,
                seed=0, settings_hash="h", status="complete", n_problems=n_problems, n_kept=n_kept))
    s.flush()
    return m.id


def one_gemm_by_default(gemm):
    """Assert that `gemm(**kw)`, a GEMM taking `split_k`, sums K in one GEMM unless split-K is
    asked: its default gives split_k=1's bits and split_k=2 other ones (the case must be one where
    two slices round differently, so the default is seen, not assumed). Returns the default's
    output."""
    import torch

    default = gemm()
    assert torch.equal(default, gemm(split_k=1))
    assert not torch.equal(default, gemm(split_k=2))
    return default


# the algorithms a table over every algorithm keeps in the quick lane: a sequence-level
# importance weight (the demo's pg-seq-is), a token-level clip (grpo), a sequence ratio with an
# empty-row batch (gspo), a clipped stop-gradient weight (cispo) and the one loss that reads the
# rollout's full distribution (sc: the trainer's logq path)
QUICK_ALGOS = ("pg-seq-is", "grpo", "gspo", "cispo", "sc")


def quick_sample(values, quick) -> list:
    """`values` for a `parametrize`, each outside `quick` marked `slow`: the quick lane
    (`./bench.sh test --quick`, which deselects `slow`) runs the sample, `./bench.sh test` and CI
    run every value. For tables whose rows repeat one code path over many inputs (every
    algorithm, every bad value of every knob), sampled so the quick lane keeps each path."""
    quick = set(quick)
    assert quick <= set(values), quick - set(values)          # a sample names values of the table
    return [pytest.param(v, marks=() if v in quick else pytest.mark.slow) for v in values]


APP = str(Path(__file__).parent.parent / "leaderboard" / "app.py")


def app_page(path: str | None = None, timeout: float = 60, **query):
    """The leaderboard app run by Streamlit's AppTest (no browser) on the store that
    BENCH_DB_URL names: the landing page, or `path` (e.g. "pages/run.py") switched to, with
    `query` as its query parameters; it must raise nothing."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=timeout)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    if path:
        at.switch_page(path)
        at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


# the order and grouping of the suite's files under pytest-xdist (its hooks, registered from here)
from xdist_order import (pytest_addoption, pytest_collection_modifyitems, pytest_configure,  # noqa: E402,F401
                         pytest_itemcollected, pytest_runtest_logreport, pytest_terminal_summary)
