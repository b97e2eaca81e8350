"""benchmarks/results/tolerance/: every kept tolerance search says in its index what its bundle holds.
The bundles are imported into one scratch store as `bench runs import` does, and each algorithm's
tolerance, seeds and next rung are recomputed as the Tolerance page computes them
(leaderboard/tolerance.py) and compared with the index row; every bundle has a row and every row a
bundle."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "benchmarks" / "results" / "tolerance"


def index_rows() -> list[dict]:
    """The index table of DIR/README.md, one dict per row by its header."""
    lines = [ln for ln in (DIR / "README.md").read_text().splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[1:]
            if not ln.startswith("|---")]


def test_every_bundle_has_a_row_and_every_row_a_bundle():
    rows = index_rows()
    assert rows, "the index has no row"
    assert sorted(r["bundle"] for r in rows) == sorted(p.name for p in DIR.glob("*.tar.gz"))


@pytest.fixture(scope="module")
def stored_runs(tmp_path_factory):
    """Every bundle imported into one scratch store, in name order (bundles of one build share it)."""
    from bench.bundle import import_bundle
    from bench.store import open_store
    from leaderboard.queries import runs_frame

    engine = open_store(f"sqlite:///{tmp_path_factory.mktemp('tol')}/s.db")
    for b in sorted(DIR.glob("*.tar.gz")):
        import_bundle(engine, b)
    runs = runs_frame(engine)
    engine.dispose()
    return runs


@pytest.mark.integration
@pytest.mark.parametrize("row", index_rows(), ids=lambda r: r["bundle"])
def test_the_bundle_recomputes_its_row(row, stored_runs):
    from leaderboard.tolerance import ladder_frame, search_cells, tolerances

    runs = stored_runs[stored_runs.algo == row["algorithm"]]
    assert set(runs.build) == {row["build"]}, "one search, one build"
    assert set(runs.trainer) == {"native"} and not set(runs.status) & {"running", "failed", "interrupted"}
    tol = tolerances(ladder_frame(search_cells(runs))).iloc[0]
    got = {"tolerance": tol.tolerance or "none", "passed there": tol.passes or "-",
           "next rung run": tol.above or "-", "passed at the next": tol.above_passes or "-"}
    assert got == {k: row[k] for k in got}
