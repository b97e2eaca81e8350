"""`bench leaderboard`: the Streamlit app over a store or a results repository."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from bench.cli import DB_OPT, _store, app, console


# what `bench leaderboard` passes to Streamlit besides the port, the address and headless: the
# same options as leaderboard/.streamlit/config.toml (which `streamlit run leaderboard/app.py` reads)
STREAMLIT_FLAGS = {"client.toolbarMode": "viewer",          # no Deploy button: a read-only viewer
                   "browser.gatherUsageStats": "false"}


def streamlit_argv(app_path: Path, url: str, port: int, address: str, headless: bool) -> list[str]:
    """The `python -m streamlit run` command line that serves the app at `app_path` on store `url`."""
    flags = [x for key, value in STREAMLIT_FLAGS.items() for x in (f"--{key}", value)]
    return [sys.executable, "-m", "streamlit", "run", str(app_path), "--server.port", str(port),
            "--server.address", address, "--server.headless", str(headless).lower(), *flags, "--", "--db", url]


@app.command()
def leaderboard(db: Optional[str] = DB_OPT, port: int = typer.Option(8501, help="Port to serve on."),
                address: str = typer.Option("127.0.0.1", help="Address to bind."),
                headless: bool = typer.Option(True, help="Do not open a browser."),
                results: Optional[Path] = typer.Option(None, help="Serve a results repository instead (`bench "
                                                       "results`): a store built from its bundles, rebuilt when "
                                                       "they change.")):
    """Serve the Streamlit leaderboard over the store (read-only), or over a results repository."""
    import leaderboard as lb

    from bench.store import default_url

    if results is not None:
        from runners.results_repo import store_url

        db = store_url(results)
    url = db or default_url()
    _store(url, read_only=True)                   # a bad or empty URL fails here, readably
    app_path = Path(lb.__file__).parent / "app.py"
    cmd = streamlit_argv(app_path, url, port, address, headless)
    console.print(f"leaderboard on http://{address}:{port} (store {url})", highlight=False)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)                 # bench becomes Streamlit: a kill of bench stops the server
