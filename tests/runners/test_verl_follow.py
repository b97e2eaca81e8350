"""Launching, following, stopping and resuming a verl run. verl's trainer itself needs GPUs and
vLLM, so the launched process is tests/verl_side/fake_main_ppo.py in verl's environment: it
takes bench's real overrides and writes its metrics through verl's own `Tracking` file backend,
which is what bench reads."""

import json
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bench.precision import Precision
from bench.store import Eval, Run, RunStep, open_store, session
from runners.presets import get_preset
from runners.verl_follow import MetricsTail, prepare, resume_verl_run, start_verl_run
from runners.verl_runner import METRIC_MAP

pytestmark = [pytest.mark.verl, pytest.mark.integration]
ROOT = Path(__file__).parents[2]


@pytest.fixture
def store(tmp_path):
    from bench.cli import app

    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(app, ["build", "--limit", "16", "--k", "4", "--engine", "torch", "--band", "0", "1",
                                 "--db", url])
    assert r.exit_code == 0, r.output
    return open_store(url)


def fake_job(store, verl_python, cfg, tmp_path):
    job = prepare(store, "pg-seq-is", Precision.parse("fp16"), cfg, None, None, verl_python,
                  root=tmp_path / "verl" / "run1", entry="fake_main_ppo")
    job.env["PYTHONPATH"] = str(ROOT / "tests" / "verl_side")
    return job


def steps_of(store, run_id):
    with session(store) as s:
        return {r.step: dict(r.metrics) for r in s.scalars(select(RunStep).where(RunStep.run_id == run_id))}


def test_ingests_verls_file_and_stops_verl_when_converged(store, verl_python, tmp_path):
    cfg = get_preset("tiny", eval_every=5, max_steps=300, checkpoint_every=5)
    job = fake_job(store, verl_python, cfg, tmp_path)
    run_id = start_verl_run(store, "pg-seq-is", Precision.parse("fp16"), cfg, "tiny", job)
    assert run_id == "run1"
    with session(store) as s:
        run = s.get(Run, run_id)
        # split accuracy 0.9, 1.0, 1.0 at the evals of 20-30: the pooled bound passes 0.95 at 30
        assert (run.trainer, run.status, run.step) == ("verl", "converged", 30)
        assert run.peak_accuracy == pytest.approx(1.0) and run.steps_to_target == 30     # the verdict's step
        assert run.calibration["ok"] and run.calibration["k3"] == pytest.approx(1.2e-4)
        assert "bypass" in run.calibration["source"]                     # pg-seq-is: verl's bypass mode
        assert run.provenance["verl_env"]["verl"] == "0.9.1" and "verl's training reward" in \
            run.provenance["split_accuracy_estimator"]
        evals = {(e.step, e.benchmark): (e.n, e.score) for e in s.scalars(select(Eval).where(Eval.run_id == run_id))}
    # everything verl wrote is in the store, under bench's names, and verl was stopped at 30 of 300
    lines = [json.loads(x) for x in (tmp_path / "verl" / "run1" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines[:31]] == list(range(31)) and len(lines) < 100   # stopped within a few steps
    steps = steps_of(store, run_id)
    assert sorted(steps) == list(range(31))                                          # nothing after the verdict
    for x in lines[1:31]:
        m = steps[x["step"]]
        for verl_key, ours in METRIC_MAP.items():
            if verl_key in x["data"]:
                assert m[ours] == pytest.approx(x["data"][verl_key])
        assert m["verl/actor/entropy"] == 0.5
    assert evals[(0, "aime24")] == (4, pytest.approx(0.1))
    assert evals[(25, "split")][1] == pytest.approx(1.0) and evals[(20, "split")][1] == pytest.approx(0.9)
    assert "verl/training/global_step" in steps[30]


def test_a_crashed_verl_run_fails_then_resumes_from_its_checkpoint(store, verl_python, tmp_path, monkeypatch):
    cfg = get_preset("tiny", eval_every=5, max_steps=300, checkpoint_every=5)
    job = fake_job(store, verl_python, cfg, tmp_path)
    monkeypatch.setenv("FAKE_VERL_CRASH_AT", "12")
    run_id = start_verl_run(store, "pg-seq-is", Precision.parse("fp16"), cfg, "tiny", job)
    with session(store) as s:
        run = s.get(Run, run_id)
        assert run.status == "failed" and "exited with code 3 at step 11" in run.stop_reason
    assert sorted(steps_of(store, run_id)) == list(range(12))
    monkeypatch.delenv("FAKE_VERL_CRASH_AT")
    resume_verl_run(store, run_id)
    with session(store) as s:
        run = s.get(Run, run_id)
        assert (run.status, run.step, run.steps_to_target) == ("converged", 30, 30)
    assert sorted(steps_of(store, run_id)) == list(range(31))
    first = (tmp_path / "verl" / "run1" / "metrics.0.jsonl").read_text().splitlines()  # kept: verl truncates on start
    assert json.loads(first[-1])["step"] == 11
    assert json.loads((tmp_path / "verl" / "run1" / "metrics.jsonl").read_text().splitlines()[0])["step"] == 11


def test_calibration_gate_stops_verl_after_its_first_step(store, verl_python, tmp_path, monkeypatch):
    """A k3 of 0.05 per token at fp16 (band 5e-4) is a plumbing fault, not precision: the run
    fails at step 1 and verl is stopped."""
    cfg = get_preset("tiny", eval_every=5, max_steps=300, checkpoint_every=5)
    job = fake_job(store, verl_python, cfg, tmp_path)
    monkeypatch.setenv("FAKE_VERL_K3", "0.05")
    run_id = start_verl_run(store, "pg-seq-is", Precision.parse("fp16"), cfg, "tiny", job)
    with session(store) as s:
        run = s.get(Run, run_id)
        assert run.status == "miscalibrated", run.stop_reason
        assert run.stop_reason.startswith("step-0 calibration failed"), run.stop_reason
        assert run.calibration["ok"] is False and run.calibration["k3"] == pytest.approx(0.05)
        assert run.step == 1 and run.peak_accuracy is None
    lines = (tmp_path / "verl" / "run1" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) < 60                                              # stopped within a few of 300 steps


def test_metrics_tail_waits_for_whole_lines_and_follows_truncation(tmp_path):
    f = tmp_path / "m.jsonl"
    tail = MetricsTail(f)
    assert tail.read() == []
    f.write_bytes(b'{"step": 0, "data": {"a": 1}}\n{"step": 1, "da')
    assert tail.read() == [(0, {"a": 1})]
    with f.open("ab") as w:
        w.write(b'ta": {"a": null}}\n')
    assert tail.read() == [(1, {"a": None})]
    f.write_bytes(b'{"step": 5, "data": {}}\n')                   # verl restarted: "wb"
    assert tail.read() == [(5, {})]


def test_reward_module_runs_in_verls_environment(store, verl_python, tmp_path):
    """The copied reward.py is what verl's reward workers import: it must grade there."""
    import subprocess

    import os

    job = prepare(store, "grpo", Precision.parse("bf16"), get_preset("tiny"), None, None, os.path.relpath(verl_python),
                  root=tmp_path / "v")
    assert job.argv[0] == verl_python                  # verl runs in its run directory: paths made absolute
    code = ("import importlib.util as u, json; s = u.spec_from_file_location('r', 'REWARD'); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); "
            "print(json.dumps([m.compute_score('split', 'so \\\\boxed{\\\\frac{1}{2}}', '0.5'), "
            "m.compute_score('split', 'no idea', '0.5')]))").replace("REWARD", str(Path(job.root) / "reward.py"))
    r = subprocess.run([verl_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    good, bad = json.loads(r.stdout.strip().splitlines()[-1])
    assert good == {"score": 1.0, "acc": True, "pred": "\\frac{1}{2}"} and bad["score"] == 0.0


def test_seeds_reach_verl_and_a_failing_seed_decides_the_cell(store, verl_python, tmp_path, monkeypatch):
    """`bench run --trainer verl --seeds 0,1,2` (a one-cell sweep on verl): each seed is its run's
    verl seeds (validated by verl's validate_config), the user's overrides are in every command and
    in each run's config, and seed 1 failing (the fake miscalibrates at data.seed=1) decides the
    cell: seed 2 is recorded skipped, a verl run, never started."""
    import functools

    import runners.verl_launch as launch
    from bench.cli import app

    def fake_prepare(*args, **kw):
        job = prepare(*args, entry="fake_main_ppo", **kw)
        job.env["PYTHONPATH"] = str(ROOT / "tests" / "verl_side")
        return job

    monkeypatch.setattr(launch, "prepare", fake_prepare)
    monkeypatch.setattr(launch, "missing_launch_modules", functools.partial(lambda python: []))
    monkeypatch.setenv("BENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FAKE_VERL_BAD_SEED", "1")
    url = store.url.render_as_string(hide_password=False)
    r = CliRunner().invoke(app, ["run", "--trainer", "verl", "--algo", "pg-seq-is", "--dtype", "fp16", "--preset",
                                 "tiny", "--seeds", "0,1,2", "--eval-every", "5", "--max-steps", "300",
                                 "--checkpoint-every", "5", "--verl-python", verl_python,
                                 "--verl-override", "data.max_prompt_length=512",
                                 "--verl-override", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                                 "--db", url])
    assert r.exit_code == 1, r.output                          # the cell failed
    with session(store) as s:
        runs = sorted(s.scalars(select(Run)).all(), key=lambda run: run.config["seed"])
        assert [(run.config["seed"], run.trainer, run.status) for run in runs] == [
            (0, "verl", "converged"), (1, "verl", "miscalibrated"), (2, "verl", "skipped")]
        for run in runs[:2]:
            argv = run.config["verl"]["argv"]
            seed = run.config["seed"]
            assert f"data.seed={seed}" in argv and f"actor_rollout_ref.rollout.seed={seed}" in argv
            assert "data.max_prompt_length=512" in argv and "data.max_prompt_length=1024" not in argv
            assert run.config["verl_settings"] == ["data.max_prompt_length=512"]
            assert run.config["verl_resources"] == ["actor_rollout_ref.rollout.tensor_model_parallel_size=1"]
        assert "seed 1 ended miscalibrated" in runs[2].stop_reason
