"""The `bench` command line. Calls the stages; nothing imports it.

One module per verb group: `build` (build, build merge, builds, grade), `run` (run, sweep),
`results` (runs, report, leaderboard, mismatch), `admin` (model, db); this package holds the
Typer `app`, `main()` and the helpers they share.

Every bad input ends with one readable message on stderr and exit code 2 (1 for failures
while working), leaving nothing half-written.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="bench: the RL sanity test (perfectible split → RL runs → leaderboard).")
build_app = typer.Typer(help="Build the perfectible split for a base model.", invoke_without_command=True)
builds_app = typer.Typer(help="List and inspect builds.", invoke_without_command=True)
model_app = typer.Typer(help="The embedded model.", no_args_is_help=True)
db_app = typer.Typer(help="The SQL store.", no_args_is_help=True)
app.add_typer(build_app, name="build")
app.add_typer(builds_app, name="builds")
app.add_typer(model_app, name="model")
app.add_typer(db_app, name="db")
runs_app = typer.Typer(help="List and inspect runs.", invoke_without_command=True)
app.add_typer(runs_app, name="runs")

console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 200)   # no truncated tables in logs

DB_OPT = typer.Option(None, "--db", help="SQLAlchemy URL of the store (default: $BENCH_DB_URL or SQLite under $BENCH_HOME).")


def fail(msg: str, code: int = 2) -> None:
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False)   # "pip install 'x[extra]'" stays
    raise typer.Exit(code)


def _store(url: str | None):
    from bench.store import StoreError, open_store

    try:
        return open_store(url)
    except StoreError as e:
        fail(str(e))


def _user_errors():
    """Exception types whose message is the whole story for the user."""
    from bench.models import ModelError
    from bench.precision import PrecisionError
    from bench.problems import SourceError
    from bench.store import StoreError
    from datasets_build.builder import BuildError

    return (BuildError, ModelError, SourceError, PrecisionError, StoreError, ValueError, FileNotFoundError)


def _progress(description: str):
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                    TimeRemainingColumn(), console=console, transient=False)


# Typer takes one value per --band flag; accept the natural `--band 0.2 0.8` as well.
def _rewrite_band(argv: list[str]) -> list[str]:
    out_args, i = [], 0
    while i < len(argv):
        if argv[i] == "--band" and i + 2 < len(argv) and not argv[i + 2].startswith("-"):
            out_args += ["--band", argv[i + 1], "--band", argv[i + 2]]
            i += 3
        else:
            out_args.append(argv[i])
            i += 1
    return out_args



def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.argv[1:] = _rewrite_band(sys.argv[1:])
    app()


# the commands register on import, in this order (it is the order `bench --help` lists them)
from bench.cli import build, run, results, admin  # noqa: E402,F401
