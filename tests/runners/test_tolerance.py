"""`bench tolerance` (runners/tolerance.py): the search by hand on made-up verdict tables (which cells
it runs, in which order, and the answer), then for real through the CLI on a tiny-math store:
every cell a stored run, a UNDECIDED cell extended, the search resumed without a new run, bad
inputs refused with exit 2 and nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from bench.cli import app
from bench.statuses import FAIL, PASS, UNDECIDED
from bench.store import Run, open_store, session
from runners.tolerance import Probe, search

LADDER = ["fp32", "e5m10", "e5m9", "e5m8", "e8m7", "e8m6", "e8m5", "e8m4", "e8m3", "e8m2", "e8m1"]


def _table(passes: dict[int, int]):
    """A probe whose seed s passes at rung index i iff i <= passes[s], recording the cells it ran."""
    ran = []

    def probe(rung, seed):
        ran.append((rung, seed))
        return Probe(rung, seed, PASS if LADDER.index(rung) <= passes[seed] else FAIL)
    return probe, ran


def test_bisection_then_every_seed_at_the_bracket():
    """Seeds pass up to e8m5 (index 6): the first seed bisects 5 → 8 → 6 → 7 (4 cells), then seeds
    1 and 2 run at e8m5 and e8m4 (4 more)."""
    probe, ran = _table({0: 6, 1: 6, 2: 6})
    got = search(LADDER, [0, 1, 2], probe)
    assert ran == [("e8m6", 0), ("e8m3", 0), ("e8m5", 0), ("e8m4", 0),
                   ("e8m5", 1), ("e8m5", 2), ("e8m4", 1), ("e8m4", 2)]
    assert (got.tolerance, got.rungs[got.hi]) == ("e8m5", "e8m4")
    assert got.count("e8m5") == "3/3 PASS" and got.count("e8m4") == "0/3 PASS"


def test_a_seed_failing_at_the_bracket_steps_it_down():
    """Seed 0 passes up to e8m5 but seed 2 only to e8m6: the bracket steps down to (e8m6, e8m5),
    and every seed runs at both; no cell twice."""
    probe, ran = _table({0: 6, 1: 6, 2: 5})
    got = search(LADDER, [0, 1, 2], probe)
    assert (got.tolerance, got.rungs[got.hi]) == ("e8m6", "e8m5")
    assert got.count("e8m6") == "3/3 PASS" and got.count("e8m5") == "2/3 PASS"
    assert len(ran) == len(set(ran))
    assert ran[4:] == [("e8m5", 1), ("e8m5", 2), ("e8m6", 1), ("e8m6", 2)]    # e8m4 stays seed 0's alone


def test_the_ends_of_the_ladder():
    """Every rung passes: the tolerance is the last rung, nothing above it; fp32 fails: none."""
    probe, _ = _table({0: 10, 1: 10})
    got = search(LADDER, [0, 1], probe)
    assert (got.tolerance, got.hi) == ("e8m1", None)
    probe, ran = _table({0: -1, 1: -1})
    got = search(LADDER, [0, 1], probe)
    assert (got.tolerance, got.rungs[got.hi]) == (None, "fp32")
    assert got.count("fp32") == "0/2 PASS"
    with pytest.raises(ValueError, match="rungs and seeds"):
        search([], [0], probe)


def test_undecided_counts_as_not_passing():
    got = search(["fp32", "e8m1"], [0], lambda r, s: Probe(r, s, UNDECIDED))
    assert got.tolerance is None and [p.rung for p in got.probes] == ["fp32"]


# ------------------------------------------------------------------ through the CLI, for real

ARGS = ["--prompts-per-step", "2", "--samples-per-prompt", "2", "--threads", "1", "--eval-every", "2",
        "--checkpoint-every", "2", "--max-steps", "2"]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tolerance")
    url = f"sqlite:///{tmp / 's.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCH_HOME", str(tmp / "home"))
        r = CliRunner().invoke(app, ["build", "--limit", "12", "--k", "4", "--engine", "torch", "--dtype", "fp32",
                                     "--band", "0", "1", "--db", url, "--json"])
        assert r.exit_code == 0, r.output
    return url


def _runs(url) -> int:
    with session(open_store(url)) as s:
        return s.scalar(select(func.count()).select_from(Run))


@pytest.mark.integration
def test_a_search_stores_its_cells_extends_and_resumes_in_another_process(url, tmp_path):
    """Three rungs, two seeds, a 2-step budget extended to 4: no cell converges that fast, so seed 0
    bisects e5m10 then fp32, seed 1 runs at the bracket (fp32); each ends UNDECIDED, is extended to
    4 steps and still decides nothing: no tolerance. The same command again, in another process,
    runs nothing new."""
    cmd = [sys.executable, "-m", "bench.cli", "tolerance", "--algo", "grpo", "--rungs", "fp32,e5m10,e8m1",
           "--seeds", "0,1",
           "--extend-to", "4", *ARGS, "--db", url]
    env = {"BENCH_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    first = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    got = json.loads(first.stdout)
    assert [(p["rung"], p["seed"], p["status"]) for p in got["probes"]] == [
        ("e5m10", 0, "max_steps"), ("fp32", 0, "max_steps"), ("fp32", 1, "max_steps")]
    assert got["tolerance"] is None and got["bracket"] == [None, "fp32"]
    with session(open_store(url)) as s:
        runs = {p["run"]: s.get(Run, p["run"]) for p in got["probes"]}
        assert {r.config["max_steps"] for r in runs.values()} == {4}
        assert {r.step for r in runs.values()} == {4}
    n = _runs(url)
    again = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr
    assert _runs(url) == n
    assert "e5m10" in again.stdout and "no tolerance" in again.stdout


@pytest.mark.parametrize("args,msg", [
    (["--rungs", "fp32,bf16"], "--rungs takes ladder rungs"),
    (["--rungs", "fp32,e8m9"], "ladder rung"),
    (["--rungs", "e8m3,e8m3"], "each once"),
    (["--seed", "1"], "give --seeds, not --seed"),
    (["--extend-to", "2"], "--extend-to 2 is not above the budget max_steps=2"),
    (["--algo", "nope"], "unknown algorithm"),
])
def test_bad_inputs_are_refused_and_write_nothing(url, args, msg, tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_HOME", str(tmp_path / "home"))
    n = _runs(url)
    algo = [] if "--algo" in args else ["--algo", "grpo"]
    r = CliRunner().invoke(app, ["tolerance", *algo, *ARGS, *args, "--db", url])
    assert r.exit_code == 2, r.output
    assert msg in r.output
    assert _runs(url) == n
