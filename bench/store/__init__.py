"""The SQL store: SQLite under BENCH_HOME by default, any SQLAlchemy URL in BENCH_DB_URL.

`open_store(url)` connects, applies pending Alembic migrations and returns an Engine; use
`session(engine)` for a transaction. Stages import this package, never each other.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, event, inspect, select, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from bench.errors import BenchError

from .schema import (Base, Build, BuildProblem, BuildRollout, CheckReport, Eval, MismatchReport, Model, Run,
                     RunDecision, RunDigest, RunStep, RunVerification)

__all__ = ["Base", "Build", "BuildProblem", "BuildRollout", "CheckReport", "Eval", "MismatchReport", "Model", "Run",
           "RunDecision", "RunDigest", "RunStep", "RunVerification", "StoreError", "bench_home", "default_url",
           "open_store",
           "session", "get_or_create_model"]

MIGRATIONS = Path(__file__).parent / "migrations"
BUSY_TIMEOUT_S = 60       # how long a SQLite writer waits for another process's write to end


class StoreError(BenchError, RuntimeError):
    """The store cannot be reached or migrated; the message says which URL and why."""


def bench_home() -> Path:
    return Path(os.environ.get("BENCH_HOME", Path.home() / ".bench")).expanduser()


def default_url() -> str:
    return os.environ.get("BENCH_DB_URL") or f"sqlite:///{bench_home() / 'bench.db'}"


def _redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def _alembic_config(engine: Engine):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def _at_head(engine: Engine, cfg) -> bool:
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    heads = set(ScriptDirectory.from_config(cfg).get_heads())
    with engine.connect() as c:
        return set(MigrationContext.configure(c).get_current_heads()) == heads


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """Serialize migrations of one store across processes (two `bench run`s opening a fresh
    database at once would both create the tables). PostgreSQL: a session advisory lock keyed
    by the schema migrated, held on its own connection. SQLite: nothing here, because Alembic's
    env.py checks and migrates in one transaction and every SQLite transaction of this store is
    BEGIN IMMEDIATE (the write lock): the second process waits, then finds the schema at head."""
    if engine.dialect.name != "postgresql":
        yield
        return
    with engine.connect() as c:
        schema = c.execute(text("SELECT current_schema()")).scalar()
        key = int.from_bytes(hashlib.blake2b(f"bench.store migrate {schema}".encode(), digest_size=8).digest(),
                             "big", signed=True)
        c.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
        c.commit()
        try:
            yield
        finally:
            c.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            c.commit()


def upgrade(engine: Engine) -> None:
    """Bring the schema to the latest migration; safe when several processes do it at once.
    On SQLite the migration runs with foreign keys off (Alembic's advice for batch mode: a
    table it recreates is dropped, and with foreign keys on that DROP would cascade)."""
    from alembic import command

    cfg = _alembic_config(engine.execution_options(bench_migration=True))
    if _at_head(engine, cfg):
        return
    with _migration_lock(engine):
        command.upgrade(cfg, "head")


def _sqlite_transactions(engine: Engine) -> None:
    """Make SQLite safe for concurrent writers (`bench sweep --jobs N`, shards, a leaderboard
    reading a running sweep): WAL (readers and the writer don't block each other), a busy timeout
    (a writer waits for the lock instead of failing), and BEGIN IMMEDIATE for every transaction.
    sqlite3's own deferred BEGIN takes the write lock only at the first write; a transaction that
    read first then cannot get it while another process writes and fails at once with "database is
    locked" whatever the timeout (and its reads outside any transaction let two read-modify-writes
    lose an update). So sqlite3's transaction handling is off and SQLAlchemy's "begin" event emits
    BEGIN itself (SQLAlchemy's SQLite docs, "Transactions with SQLite and the sqlite3 driver").
    A connection made read-only with PRAGMA query_only (leaderboard/queries.py `read_only`) gets a
    plain BEGIN: the app never takes the write lock."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, record):
        dbapi_conn.isolation_level = None                        # no implicit BEGIN/COMMIT by sqlite3
        dbapi_conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")             # SQLite enforces foreign keys only when asked
        try:                                                     # "memory" for an in-memory database
            dbapi_conn.execute("PRAGMA journal_mode=WAL").fetchone()
        except sqlite3.OperationalError:                         # a read-only file: read it as it is
            pass
        record.info["foreign_keys"] = True

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        dbapi_conn = conn.connection.dbapi_connection
        info = conn.connection.info
        opts = conn.get_execution_options()
        fk = not opts.get("bench_migration", False)
        if info.get("foreign_keys") != fk:                       # settable only outside a transaction
            dbapi_conn.execute(f"PRAGMA foreign_keys={'ON' if fk else 'OFF'}")
            info["foreign_keys"] = fk
        if opts.get("isolation_level") == "AUTOCOMMIT":
            return
        if dbapi_conn.isolation_level is not None:               # reset by the dialect after AUTOCOMMIT
            dbapi_conn.isolation_level = None
        if "query_only" not in info:
            info["query_only"] = bool(dbapi_conn.execute("PRAGMA query_only").fetchone()[0])
        conn.exec_driver_sql("BEGIN" if info["query_only"] else "BEGIN IMMEDIATE")


def open_store(url: str | None = None, migrate: bool = True, must_exist: bool = False) -> Engine:
    """Connect to `url` (default: BENCH_DB_URL or the SQLite file under BENCH_HOME), check the
    connection, and bring the schema to the latest migration. Several processes may open and
    write one store at once (SQLite: see `_sqlite_transactions`). `must_exist` (the read-only
    verbs): a store nothing was ever recorded in — no SQLite file, or a database without bench's
    tables — is a StoreError, and nothing is created."""
    url = url or default_url()
    if must_exist and url.startswith("sqlite:///") and ":memory:" not in url \
            and not Path(url[len("sqlite:///"):]).expanduser().is_file():
        raise StoreError(f"no store at {_redact(url)}: nothing has been recorded there (give --db the URL of an "
                         "existing store, or record something first, e.g. `bench build --model tiny-math`)")
    try:
        if url.startswith("sqlite:///"):
            Path(url[len("sqlite:///"):]).expanduser().parent.mkdir(parents=True, exist_ok=True)
        kw = {"connect_args": {"timeout": BUSY_TIMEOUT_S}} if url.startswith("sqlite") else {"pool_pre_ping": True}
        engine = create_engine(url, **kw)
        if engine.dialect.name == "sqlite":
            _sqlite_transactions(engine)
        with engine.connect() as c:
            c.execute(text("SELECT 1"))
        if must_exist and not inspect(engine).has_table("runs"):
            raise StoreError(f"no store at {_redact(url)}: the database has no bench tables (nothing has been "
                             "recorded there)")
        if migrate:
            upgrade(engine)
        return engine
    except (SQLAlchemyError, OSError, ImportError, ValueError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StoreError(f"cannot open store {_redact(url)}: {msg}") from None


@contextmanager
def session(engine: Engine) -> Iterator[Session]:
    """One transaction: committed on success, rolled back on any exception."""
    with Session(engine, expire_on_commit=False) as s:
        try:
            yield s
            s.commit()
        except BaseException:
            s.rollback()
            raise


def get_or_create_model(s: Session, name: str, path: str, weights_hash: str | None) -> Model:
    """The model row, made if missing; when another process makes it at the same moment (shards
    of one build on PostgreSQL), the loser of the race reads the winner's row."""
    q = select(Model).where(Model.name == name, Model.weights_hash == weights_hash)
    m = s.scalars(q).first()
    if m is None:
        try:
            with s.begin_nested():
                m = Model(name=name, path=path, weights_hash=weights_hash)
                s.add(m)
        except IntegrityError:
            m = s.scalars(q).one()
    return m
