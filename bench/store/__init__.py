"""The SQL store: SQLite under BENCH_HOME by default, any SQLAlchemy URL in BENCH_DB_URL.

`open_store(url)` connects, applies pending Alembic migrations and returns an Engine; use
`session(engine)` for a transaction. Stages import this package, never each other.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from .schema import Base, Build, BuildProblem, BuildRollout, Eval, MismatchReport, Model, Run, RunStep

__all__ = ["Base", "Build", "BuildProblem", "BuildRollout", "Eval", "MismatchReport", "Model", "Run",
           "RunStep", "StoreError", "bench_home", "default_url", "open_store", "session", "get_or_create_model"]

MIGRATIONS = Path(__file__).parent / "migrations"


class StoreError(RuntimeError):
    """The store cannot be reached or migrated; the message says which URL and why."""


def bench_home() -> Path:
    return Path(os.environ.get("BENCH_HOME", Path.home() / ".bench")).expanduser()


def default_url() -> str:
    return os.environ.get("BENCH_DB_URL") or f"sqlite:///{bench_home() / 'bench.db'}"


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

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


def upgrade(engine: Engine) -> None:
    from alembic import command

    command.upgrade(_alembic_config(engine), "head")


def open_store(url: str | None = None, migrate: bool = True) -> Engine:
    """Connect to `url` (default: BENCH_DB_URL or the SQLite file under BENCH_HOME), check the
    connection, and bring the schema to the latest migration."""
    url = url or default_url()
    try:
        if url.startswith("sqlite:///"):
            Path(url[len("sqlite:///"):]).expanduser().parent.mkdir(parents=True, exist_ok=True)
        kw = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
        engine = create_engine(url, **kw)
        if url.startswith("sqlite"):
            @event.listens_for(engine, "connect")
            def _fk_on(dbapi_conn, _):  # SQLite enforces foreign keys only when asked
                dbapi_conn.execute("PRAGMA foreign_keys=ON")
        with engine.connect() as c:
            c.execute(text("SELECT 1"))
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
    from sqlalchemy import select

    m = s.scalars(select(Model).where(Model.name == name, Model.weights_hash == weights_hash)).first()
    if m is None:
        m = Model(name=name, path=path, weights_hash=weights_hash)
        s.add(m)
        s.flush()
    return m
