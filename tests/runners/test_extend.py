"""`bench runs extend RUN --max-steps N`: a run undecided at its budget, continued under a larger
one, equals bit for bit a run started with that budget; what cannot be extended is refused with
exit 2 and nothing written."""

import json

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bench.cli import app
from bench.machine_metrics import deterministic
from bench.store import Eval, Run, RunDecision, RunStep, open_store, session

pytestmark = pytest.mark.integration

RUN = ["run", "--algo", "pg-seq-is", "--dtype", "fp32", "--seed", "3", "--eval-every", "2", "--checkpoint-every", "2",
       "--prompts-per-step", "2", "--samples-per-prompt", "2", "--threads", "1", "--json"]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("extend")
    url = f"sqlite:///{tmp / 's.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCH_HOME", str(tmp / "home"))
        r = CliRunner().invoke(app, ["build", "--limit", "12", "--k", "4", "--engine", "torch", "--dtype", "fp32",
                                     "--band", "0", "1", "--db", url, "--json"])
        assert r.exit_code == 0, r.output
    return url


def _run(url, *args):
    r = CliRunner().invoke(app, [*RUN, *args, "--db", url])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["id"]


def _record(url, run_id):
    """Everything a run stored that a re-run must reproduce."""
    with session(open_store(url)) as s:
        run = s.get(Run, run_id)
        steps = {x.step: deterministic(x.metrics) for x in s.scalars(select(RunStep).where(RunStep.run_id == run_id))}
        evals = sorted((e.step, e.benchmark, e.n, e.score)
                       for e in s.scalars(select(Eval).where(Eval.run_id == run_id)))
        decisions = sorted((d.rule, d.step, d.status, d.reason, d.rule_on)
                           for d in s.scalars(select(RunDecision).where(RunDecision.run_id == run_id)))
        return {"status": run.status, "stop_reason": run.stop_reason, "step": run.step, "peak": run.peak_accuracy,
                "final": run.final_accuracy, "to_target": run.steps_to_target, "config": run.config,
                "steps": steps, "evals": evals, "decisions": decisions}


def test_an_extended_run_equals_a_run_started_with_that_budget(url, tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_HOME", str(tmp_path / "home"))
    short = _run(url, "--max-steps", "4")
    assert _record(url, short)["status"] == "max_steps"
    r = CliRunner().invoke(app, ["runs", "extend", short, "--max-steps", "8", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    long = _run(url, "--max-steps", "8")
    got, want = _record(url, short), _record(url, long)
    assert sorted(got["steps"]) == list(range(1, 9))
    assert got == want
    with session(open_store(url)) as s:
        assert s.get(Run, short).provenance["extends"] == [{"step": 4, "from": 4, "to": 8}]


def test_what_cannot_be_extended_is_refused(url, tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_HOME", str(tmp_path / "home"))
    odd = _run(url, "--max-steps", "3")                  # 3 is not a multiple of eval_every 2
    before = _record(url, odd)
    for args, needle in (([odd, "--max-steps", "3"], "is not above"),
                         ([odd, "--max-steps", "6"], "not a multiple of eval_every=2"),
                         (["nope", "--max-steps", "6"], "no run 'nope'")):
        r = CliRunner().invoke(app, ["runs", "extend", *args, "--db", url])
        assert r.exit_code == 2 and needle in r.stderr, r.output
    assert _record(url, odd) == before
    with session(open_store(url)) as s:
        s.get(Run, odd).status = "futile"
    r = CliRunner().invoke(app, ["runs", "extend", odd, "--max-steps", "6", "--db", url])
    assert r.exit_code == 2 and "is futile (FAIL): only a run that reached its budget undecided" in r.stderr
