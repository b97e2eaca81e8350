"""The `bench` command line. Calls the stages; nothing imports it.

One module per verb group: `build` (build, build merge, builds, grade), `run` (run, sweep),
`results` (runs, report, leaderboard, mismatch), `admin` (model, db); this package holds the
Typer `app`, `main()` and the helpers they share.

Every bad input (a `bench.errors.BenchError`: each stage's error class derives from it) ends
with one readable message on stderr and exit code 2, leaving nothing written; any other
exception is a bug or a failure while working and shows its traceback, exit code 1. The
settings of `bench run`, `bench sweep`, `bench build` and `bench mismatch` are options generated
from the config dataclasses (bench/cli/options.py), checked before anything is written.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from typer.core import TyperGroup


class _BenchGroup(TyperGroup):
    """The root command: a BenchError raised anywhere below is one `error:` line, exit 2."""

    def invoke(self, ctx):
        from bench.errors import BenchError

        try:
            return super().invoke(ctx)
        except BenchError as e:
            fail(str(e))


app = typer.Typer(cls=_BenchGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="bench: the RL sanity test (perfectible split → RL runs → leaderboard).")
build_app = typer.Typer(help="Build the perfectible split for a base model.", invoke_without_command=True)
builds_app = typer.Typer(help="List and inspect builds.", invoke_without_command=True)
model_app = typer.Typer(help="The embedded models, and the warm-up of a small real model.", no_args_is_help=True)
db_app = typer.Typer(help="The SQL store.", no_args_is_help=True)
app.add_typer(build_app, name="build")
app.add_typer(builds_app, name="builds")
app.add_typer(model_app, name="model")
app.add_typer(db_app, name="db")
runs_app = typer.Typer(help="List and inspect runs.", invoke_without_command=True)
app.add_typer(runs_app, name="runs")

console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 200)   # no truncated tables in logs

DB_OPT = typer.Option(None, "--db",
                      help="SQLAlchemy URL of the store (default: $BENCH_DB_URL or SQLite under $BENCH_HOME).")


def fail(msg: str, code: int = 2) -> None:
    from rich.markup import escape

    # one line, never wrapped; escaped so that "pip install 'x[extra]'" stays
    console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _store(url: str | None, read_only: bool = False):
    """The store at `url` (opened and migrated); `read_only` verbs (report, runs, builds,
    leaderboard) refuse a store that does not exist instead of creating an empty one."""
    from bench.store import open_store

    return open_store(url, must_exist=read_only)


def fmt3(x) -> str:
    """A number to 3 decimals, "-" for a missing one (None or NaN)."""
    return "-" if x is None or x != x else f"{x:.3f}"


def _progress(description: str):
    from bench.cli.progress import progress

    return progress(description, console)


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()


# the commands register on import, in this order (it is the order `bench --help` lists them)
from bench.cli import build, run, tolerance, runs, report, serve, mismatch, compare, check, repo, admin  # noqa: E402,F401
