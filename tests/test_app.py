"""The app's surface (issue 21 item 7): the viewer toolbar wherever the app is launched, the grid's
empty cells as one `bench sweep` command parsed back by the real CLI, PASS/FAIL colours, and the
Leaderboard page's chart of peak split accuracy per cell with its seed interval and the 0.95 line."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from bench.cli.results import STREAMLIT_FLAGS, streamlit_argv

ROOT = Path(__file__).parent.parent
APP = ROOT / "leaderboard" / "app.py"
CONFIG = ROOT / "leaderboard" / ".streamlit" / "config.toml"


# ------------------------------------------------------------------ the viewer toolbar

def test_bench_leaderboard_passes_the_viewer_toolbar():
    argv = streamlit_argv(APP, "sqlite:///x.db", 8555, "127.0.0.1", True)
    assert argv[argv.index("--client.toolbarMode") + 1] == "viewer"
    assert argv[-3:] == ["--", "--db", "sqlite:///x.db"] and argv[argv.index("run") + 1] == str(APP)


def test_the_shipped_config_sets_what_bench_leaderboard_passes():
    cfg = tomllib.loads(CONFIG.read_text())
    assert cfg["client"]["toolbarMode"] == "viewer"
    flat = {f"{section}.{k}": str(v).lower() if isinstance(v, bool) else str(v)
            for section, values in cfg.items() for k, v in values.items()}
    assert flat == STREAMLIT_FLAGS
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert ".streamlit/config.toml" in shipped["leaderboard"]


def test_streamlit_run_reads_the_config_beside_the_app_from_any_directory(tmp_path):
    """What `streamlit run leaderboard/app.py` does before serving (streamlit/web/cli.py sets the
    main script, then the config is parsed): from another working directory, with an empty home,
    the toolbar mode is the app's own."""
    code = ("import streamlit.config as c, sys; c._main_script_path = sys.argv[1]; "
            "c.get_config_options(force_reparse=True); print(c.get_option('client.toolbarMode'))")
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("STREAMLIT_CLIENT_TOOLBAR_MODE", None)
    got = subprocess.run([sys.executable, "-c", code, str(APP)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert got[-1] == "viewer"
    moved = tmp_path / "elsewhere" / "app.py"        # the same script without its .streamlit: the default
    moved.parent.mkdir()
    moved.write_text(APP.read_text())
    got = subprocess.run([sys.executable, "-c", code, str(moved)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert got[-1] == "auto"
