"""`bench runs heldback`: which problems are held back and the paired summary by hand; a real tiny-math
run, then its held-back evaluation in another process (problems the build never screened, the
checkpoint's step, nothing written to the store); a run without a checkpoint is refused (exit 2)."""

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from sqlalchemy import select

from bench.problems import Problem
from bench.store import BuildProblem, open_store, session
from conftest import small_grpo_run
from runners.heldback import held_back, paired_summary


def test_held_back_leaves_the_screened_problems_out_before_the_limit():
    probs = [Problem(str(i), t, "1") for i, t in enumerate(["a", "b", "c", "d", "e"])]
    kept, dropped = held_back(probs, {"b", "d"}, 2)
    assert [p.problem for p in kept] == ["a", "c"] and dropped == 1       # "d" lies past the limit
    kept, dropped = held_back(probs, {"b", "d"}, 10)
    assert [p.problem for p in kept] == ["a", "c", "e"] and dropped == 2
    assert held_back(probs, {"a", "b", "c", "d", "e"}, 3) == ([], 5)
    # screened texts are normalised ones (bench/problem_ids.py): whitespace and case do not hide a problem
    probs = [Problem("x", "What  is 7 +\n5?", "12"), Problem("y", "What is 8 + 5?", "13")]
    assert held_back(probs, {"what is 7 + 5?"}, 5) == ([probs[1]], 1)


def test_the_paired_summary_by_hand():
    base = [[True, False], [False, False], [True, True]]          # avg@2 per problem: 0.5, 0, 1
    trained = [[True, True], [True, False], [True, True]]        # 1, 0.5, 1
    r = paired_summary(base, trained)
    assert r["base"] == pytest.approx({"accuracy": 0.5, "pass_at_n": 2 / 3})
    assert r["trained"] == pytest.approx({"accuracy": 5 / 6, "pass_at_n": 1.0})
    # d = (0.5, 0.5, 0): mean 1/3, s = sqrt(1/12), t(0.975, 2) = 4.302653 → half-width 4.302653 · s / √3
    half = 4.302653 * (1 / 12) ** 0.5 / 3 ** 0.5
    assert r["difference"] == pytest.approx({"mean": 1 / 3, "lo": 1 / 3 - half, "hi": 1 / 3 + half}, abs=1e-5)
    # one problem: no interval (None, which JSON writes as null, not NaN)
    assert paired_summary([[False]], [[True]])["difference"] == {"mean": 1.0, "lo": None, "hi": None}


def _dump(db) -> list[str]:
    with sqlite3.connect(db) as c:
        return list(c.iterdump())


def _bench(tmp, *args):
    return subprocess.run([sys.executable, "-m", "bench.cli", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "BENCH_HOME": str(tmp / "home")})


@pytest.mark.integration
def test_a_run_answers_problems_its_build_never_screened(tmp_path):
    url, run_id = small_grpo_run(tmp_path, "--max-steps", "3", "--eval-every", "3", "--checkpoint-every", "3")
    before = _dump(tmp_path / "src.db")
    r = _bench(tmp_path, "runs", "heldback", run_id, "--limit", "8", "--n", "2", "--threads", "1", "--db", url,
               "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    with session(open_store(url)) as s:
        screened = set(s.scalars(select(BuildProblem.problem)))
    assert len(screened) == 12 and out["problems"] == 8 and out["step"] == 3 and out["algo"] == "grpo"
    assert out["settings"]["n"] == 2 and out["draw_seed"] == 1 and out["source"] == "synthetic"  # the build's seed + 1
    assert out["screened"] == 12 and out["screened_all"]
    for side in ("base", "trained"):
        assert 0 <= out[side]["accuracy"] <= out[side]["pass_at_n"] <= 1
    d = out["difference"]
    assert d["lo"] <= d["mean"] <= d["hi"]
    assert d["mean"] == pytest.approx(out["trained"]["accuracy"] - out["base"]["accuracy"])
    assert _dump(tmp_path / "src.db") == before                   # nothing written

    ckpt = tmp_path / "home" / "runs" / run_id / "checkpoint.pt"
    assert ckpt.is_file()
    ckpt.unlink()
    r = _bench(tmp_path, "runs", "heldback", run_id, "--db", url)
    assert r.returncode == 2 and "has no checkpoint" in r.stderr
    r = _bench(tmp_path, "runs", "heldback", "nope", "--db", url)
    assert r.returncode == 2 and "no run 'nope'" in r.stderr
