"""The app's store connection and cached queries (short TTL, so running runs show up)."""

from __future__ import annotations

import os
import sys

import pandas as pd
import streamlit as st

from leaderboard import queries

TTL = 5  # seconds


def db_url() -> str:
    """--db URL after `--` on the streamlit command line, else BENCH_DB_URL, else the default."""
    argv = sys.argv
    if "--db" in argv[:-1]:
        return argv[argv.index("--db") + 1]
    from bench.store import default_url

    return os.environ.get("BENCH_DB_URL") or default_url()


@st.cache_resource(show_spinner=False)
def _engine(url: str):
    from bench.store import open_store

    return queries.read_only(open_store(url, migrate=False))


def engine():
    """The read-only engine; a readable error in the page for a bad URL, and what to run
    first for a store that does not exist yet (the page stops in both cases)."""
    from pathlib import Path

    from sqlalchemy import inspect

    from bench.store import StoreError

    url = db_url()
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).expanduser().exists():
        empty_store()
        st.stop()
    try:
        eng = _engine(url)
    except StoreError as e:
        st.error(f"{e}\n\nSet the store with `bench leaderboard --db URL` or BENCH_DB_URL.")
        st.stop()
    if not inspect(eng).has_table("runs"):
        empty_store()
        st.stop()
    return eng


@st.cache_data(ttl=TTL, show_spinner=False)
def runs(url: str) -> pd.DataFrame:
    return queries.runs_frame(_engine(url))


@st.cache_data(ttl=TTL, show_spinner=False)
def steps(url: str, run_ids: tuple[str, ...]) -> pd.DataFrame:
    return queries.run_steps(_engine(url), list(run_ids))


@st.cache_data(ttl=TTL, show_spinner=False)
def evals(url: str, run_ids: tuple[str, ...]) -> pd.DataFrame:
    return queries.run_evals(_engine(url), list(run_ids))


@st.cache_data(ttl=TTL, show_spinner=False)
def run_info(url: str, run_id: str) -> dict | None:
    return queries.run_info(_engine(url), run_id)


@st.cache_data(ttl=TTL, show_spinner=False)
def builds(url: str) -> pd.DataFrame:
    return queries.builds_frame(_engine(url))


@st.cache_data(ttl=TTL, show_spinner=False)
def build_problems(url: str, build_id: str) -> pd.DataFrame:
    return queries.build_problems(_engine(url), build_id)


@st.cache_data(ttl=TTL, show_spinner=False)
def verifications(url: str) -> pd.DataFrame:
    return queries.verifications_frame(_engine(url))


@st.cache_data(ttl=TTL, show_spinner=False)
def mismatch(url: str) -> pd.DataFrame:
    return queries.mismatch_frame(_engine(url))


@st.cache_data(ttl=TTL, show_spinner=False)
def checks(url: str) -> pd.DataFrame:
    return queries.check_frame(_engine(url))


def store_url() -> str:
    """The store's URL once its engine is known to work (else the page has stopped)."""
    engine()
    return db_url()


def runs_or_stop() -> tuple[str, pd.DataFrame]:
    """(url, runs); on a store without runs the page says what to run first and stops."""
    url = store_url()
    frame = runs(url)
    if frame.empty:
        empty_store()
        st.stop()
    return url, frame


def empty_store() -> None:
    st.info("The store has no runs yet. Start with:\n\n"
            "```\nbench build --model tiny-math\nbench sweep --algo pg-seq-is,grpo --dtype bf16,fp16\n```")
