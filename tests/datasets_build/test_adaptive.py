"""Adaptive builds: the Wilson interval by hand, and a real adaptive build against the full one."""

import json

import pytest
from typer.testing import CliRunner

from bench.cli import app
from datasets_build.adaptive import decided


def test_decisions():
    assert decided(0, 16, 0.2, 0.8, 0.9)             # surely too hard
    assert not decided(0, 4, 0.2, 0.8, 0.9, min_samples=1)   # too few samples to tell
    assert not decided(0, 6, 0.2, 0.8, 0.5)          # the floor of 8 samples
    assert decided(16, 16, 0.2, 0.8, 0.9)            # surely too easy
    assert decided(20, 40, 0.2, 0.8, 0.9)            # surely inside
    assert not decided(9, 40, 0.2, 0.8, 0.9)         # on the edge


@pytest.mark.integration
def test_adaptive_build_spends_fewer_rollouts_and_agrees(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    args = ["build", "--limit", "40", "--k", "40", "--engine", "torch", "--dtype", "fp32", "--db", url, "--json"]
    full = json.loads(CliRunner().invoke(app, args).stdout)
    r = CliRunner().invoke(app, [*args, "--adaptive"])
    assert r.exit_code == 0, r.output
    ada = json.loads(r.stdout)
    assert ada["build_id"] != full["build_id"] and ada["adaptive"]["interval"] == "Wilson"
    assert ada["rollouts"] < 0.8 * full["rollouts"]
    from sqlalchemy import select

    from bench.store import BuildProblem, BuildRollout, open_store, session

    def verdicts(build_id):
        with session(open_store(url)) as s:
            rows = s.execute(select(BuildRollout.problem_id, BuildRollout.sample, BuildRollout.verdict)
                             .where(BuildRollout.build_id == build_id).order_by(BuildRollout.sample)).all()
        out = {}
        for pid, j, v in rows:
            out.setdefault(pid, []).append(v == "correct")
        return out

    va, vf = verdicts(ada["build_id"]), verdicts(full["build_id"])
    for pid, seq in va.items():
        n = len(seq)
        assert seq == vf[pid][:n]                     # the same seeds: a prefix of the full build's samples
        assert n == 40 or decided(sum(seq), n, 0.2, 0.8, 0.85)        # stopped only once decided
        assert n % 2 == 0 and n >= 8 and not decided(sum(seq[:n - 2]), n - 2, 0.2, 0.8, 0.85)
    with session(open_store(url)) as s:
        rows = s.scalars(select(BuildProblem).where(BuildProblem.build_id == ada["build_id"])).all()
        assert all(r.n_samples == len(va[r.problem_id]) and r.accuracy == r.n_correct / r.n_samples for r in rows)
