"""A cell decided by its first failing seed (runners/sweep.py): real runs of the tiny model with a
tiny step limit and a futility window of 3 evaluations (every seed ends futile at step 4, a FAIL by
the futility rule: split accuracy ~0.5, at most ~0.72 projected), in process and in processes of their own,
and the report's "decided after k of N seeds"."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bench.cli import app
from bench.store import Run, open_store, session
from leaderboard.cells import cells_frame
from leaderboard.queries import runs_frame

FAST = ["--max-steps", "6", "--eval-every", "2", "--futility-window", "3", "--prompts-per-step", "2",
        "--samples-per-prompt", "2"]


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(app, ["build", "--limit", "12", "--k", "4", "--engine", "torch", "--dtype", "fp32",
                                 "--band", "0", "1", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    return url


def _runs(url):
    with session(open_store(url)) as s:
        return sorted(((r.seed, r.status, r.stop_reason or "", r.step, r.id) for r in s.scalars(select(Run))))


@pytest.mark.integration
def test_the_first_failing_seed_decides_the_cell_in_process(url):
    """`bench run --seeds 3` (jobs 1): seed 0 ends futile, so seeds 1 and 2 are never started
    but recorded skipped with the reason; the report says so; a second call adds nothing."""
    r = CliRunner().invoke(app, ["run", "--algo", "pg-seq-is", "--dtype", "fp32", "--seeds", "3", *FAST,
                                 "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    assert [x["status"] for x in json.loads(r.stdout)] == ["futile", "skipped", "skipped"]
    runs = _runs(url)
    assert [(s, st) for s, st, *_ in runs] == [(0, "futile"), (1, "skipped"), (2, "skipped")]
    first = runs[0][4]
    for _, _, reason, step, _ in runs[1:]:
        assert reason.startswith("not run: the cell was decided when seed 0 ended futile") and first in reason
        assert step == 0
    cells = cells_frame(runs_frame(open_store(url)))
    assert len(cells) == 1
    c = cells.iloc[0]
    assert (c.passes, c.seeds, c.decided, c.sanity) == ("0/1", [0], "decided after 1 of 3 seeds", "FAIL")
    text = CliRunner().invoke(app, ["report", "--db", url]).stdout
    assert "decided after 1 of 3 seeds" in " ".join(text.split())
    # the cell is decided by the finished seed 0: nothing starts, no second skipped row per seed
    r = CliRunner().invoke(app, ["run", "--algo", "pg-seq-is", "--dtype", "fp32", "--seeds", "3", *FAST,
                                 "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    assert _runs(url) == runs


@pytest.mark.integration
@pytest.mark.slow
def test_the_first_failing_seed_stops_the_cells_other_processes(url):
    """`bench sweep --seeds 3 --jobs 2`: seeds 0 and 1 start together in their own processes;
    the first to end (futile: FAIL) decides the cell, the other one is interrupted (recorded
    skipped at the step it reached) unless it had finished too, and seed 2 is never started.
    Another cell of the same sweep is decided on its own."""
    r = CliRunner().invoke(app, ["sweep", "--algo", "pg-seq-is", "--dtype", "fp32", "--seeds", "3", "--jobs", "2",
                                 *FAST, "--db", url])
    assert r.exit_code == 0, r.output
    runs = _runs(url)
    statuses = [st for _, st, *_ in runs]
    assert len(runs) == 3 and set(statuses) <= {"futile", "skipped"}, runs
    assert statuses[2] == "skipped" and runs[2][2].startswith("not run: the cell was decided when seed "), runs
    finished = [x for x in runs if x[1] == "futile"]
    assert 1 <= len(finished) <= 2
    for seed, status, reason, step, _ in runs[:2]:
        if status == "skipped":          # interrupted: stopped by the other seed's verdict, before its end
            assert reason.startswith("interrupted at step ") and step < 4, runs
            assert f"seed {1 - seed} ended futile" in reason
    k = len(finished)
    c = cells_frame(runs_frame(open_store(url))).iloc[0]
    assert c.decided == f"decided after {k} of 3 seeds" and c.passes == f"0/{k}"
    assert "skip pg-seq-is fp32 seed 2: cell decided" in r.stderr
