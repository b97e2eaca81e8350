"""benchmarks/plot_tolerance.py: the grid's squares, their order and outline from a hand-built ladder,
the picture written, and an empty store refused with exit 2."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("plot_tolerance", ROOT / "benchmarks" / "plot_tolerance.py")
pt = importlib.util.module_from_spec(_spec)
sys.modules["plot_tolerance"] = pt
_spec.loader.exec_module(pt)

from leaderboard.tolerance import COLUMNS, tolerances  # noqa: E402


def _ladder() -> pd.DataFrame:
    # grpo: PASS 1/1 at e8m6, 3/3 at e8m4, 2/3 (one UNDECIDED) at e8m3, FAIL at e8m2 -> tolerance e8m4
    # geo: FAIL at e8m6 -> no tolerance
    rows = [("grpo", "e8m6", 8, "PASS", "1/1", 1.0), ("grpo", "e8m4", 10, "PASS", "3/3", 1.0),
            ("grpo", "e8m3", 11, "UNDECIDED", "2/3", 2 / 3), ("grpo", "e8m2", 12, "FAIL", "0/1", 0.0),
            ("geo", "e8m6", 8, "FAIL", "0/1", 0.0)]
    return pd.DataFrame([{"algo": a, "rung": r, "index": i, "sanity": s, "passes": p, "pass_rate": q,
                          "peak_mean": 0.9, "kl_k3_median": 1e-3, "n_seeds": int(p[-1])}
                         for a, r, i, s, p, q in rows], columns=COLUMNS)


def test_grid_marks_each_cell_and_outlines_the_tolerance():
    ladder = _ladder()
    sq = pt.grid(ladder, tolerances(ladder))
    assert [(s["row"], s["rung"], s["text"], s["tolerance"]) for s in sq] == [
        ("grpo", "e8m6", "✓ 1/1", False), ("grpo", "e8m4", "✓ 3/3", True), ("grpo", "e8m3", "? 2/3", False),
        ("grpo", "e8m2", "✗ 0/1", False), ("geo", "e8m6", "✗ 0/1", False)]
    assert sq[2]["pass_rate"] == 2 / 3 and sq[2]["sanity"] == "UNDECIDED"


def test_rows_run_from_the_most_tolerant_and_label_builds():
    ladder = _ladder()
    sq = pt.grid(ladder, tolerances(ladder), " (b1)")
    sq += pt.grid(ladder[ladder.algo == "grpo"].assign(rung="e8m6", index=8).iloc[:1],
                  pd.DataFrame({"algo": ["grpo"], "tolerance": ["e8m6"]}), " (b2)")
    assert pt.row_order(sq) == ["grpo (b1)", "grpo (b2)", "geo (b1)"]


def test_plot_writes_a_png(tmp_path):
    ladder = _ladder()
    out = tmp_path / "t.png"
    pt.plot(pt.grid(ladder, tolerances(ladder)), ["e8m6", "e8m4", "e8m3", "e8m2"], "t", out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_store_without_ladder_cells_is_refused(tmp_path, capsys):
    from bench.store import open_store

    url = f"sqlite:///{tmp_path}/s.db"
    open_store(url).dispose()
    assert pt.main(["--db", url, "--out", str(tmp_path / "t.png")]) == 2
    assert "no cell on the precision ladder" in capsys.readouterr().err
    assert not (tmp_path / "t.png").exists()
