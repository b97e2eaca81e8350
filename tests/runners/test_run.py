"""`bench run` end to end on a real tiny-math build: every algorithm × dtype, stop rules,
bad input, and SIGKILL + resume with contiguous steps."""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bench.cli import app
from bench.precision import Precision
from bench.statuses import DEAD_AFTER_S
from bench.store import Eval, Run, RunStep, open_store, session
from bench.algorithms import PAPER_ALGORITHMS
from runners.algos import REGISTRY
from runners.presets import get_preset
from runners.runs import start_run

pytestmark = pytest.mark.integration

BUILD = ["build", "--model", "tiny-math", "--limit", "64", "--k", "8", "--engine", "torch", "--dtype", "fp32",
         "--band", "0.1", "0.9", "--json"]


def make_build(url: str) -> str:
    r = CliRunner().invoke(app, [*BUILD, "--db", url])
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)
    assert m["counts"]["kept"] >= 4, m["counts"]
    return m["build_id"]


@pytest.fixture(scope="module")
def sqlite_build(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('runs') / 'store.db'}"
    return url, make_build(url)


def small_cfg(steps=2):
    cfg = get_preset("tiny")
    cfg.prompts_per_step, cfg.samples_per_prompt, cfg.max_steps = 4, 4, steps
    cfg.eval_every, cfg.checkpoint_every, cfg.eval_split_m = steps, steps, 1
    cfg.benchmarks[0].limit, cfg.benchmarks[0].n = 8, 1
    cfg.max_tokens = cfg.algo.max_len = 40
    return cfg


def test_every_algorithm_at_every_dtype(sqlite_build, tmp_path):
    url, build = sqlite_build
    store = open_store(url)
    absdp = {}
    for algo in REGISTRY:
        for d in (("fp32", "bf16", "fp16") if algo in PAPER_ALGORITHMS else ("bf16",)):   # the corrections: one
            run_id = start_run(store, algo, Precision(d, d), small_cfg(), build_id=build, ckpt_root=tmp_path)
            with session(store) as s:
                run = s.get(Run, run_id)
                assert run.status == "max_steps" and run.step == 2, (algo, d, run.stop_reason)
                steps = s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step)).all()
                assert [st.step for st in steps] == [1, 2]
                m = steps[-1].metrics
                for key in ("reward", "response_len", "kl_k1", "kl_k1_bits", "kl_k3", "prob_diff_max", "prob_diff_min",
                            "prob_abs_diff_mean", "log_ratio_slope", "is_ratio_seq_mean", "loss", "grad_norm",
                            "loss_scale", "skipped_steps", "time_rollout", "time_scoring", "time_update",
                            "time_eval", "tokens_per_s", "eval/split", "eval/synthetic-hard"):
                    assert key in m, (algo, d, key)
                assert m["loss_scale"] == (2.0 ** 16 if d == "fp16" else 1.0)
                benches = set(s.scalars(select(Eval.benchmark).where(Eval.run_id == run_id)).all())
                assert benches == {"split", "synthetic-hard"}
                absdp.setdefault(d, []).extend(st.metrics["prob_abs_diff_mean"] for st in steps)
    mean = {d: sum(v) / len(v) for d, v in absdp.items()}
    assert mean["bf16"] > mean["fp16"] > mean["fp32"], mean


def test_pg_seq_is_learns_in_fp32(sqlite_build, tmp_path):
    url, build = sqlite_build
    store = open_store(url)
    cfg = small_cfg(steps=30)
    cfg.prompts_per_step, cfg.samples_per_prompt, cfg.eval_every, cfg.eval_split_m = 8, 8, 15, 8
    run_id = start_run(store, "pg-seq-is", Precision("fp32", "fp32"), cfg, build_id=build, ckpt_root=tmp_path)
    with session(store) as s:
        scores = s.scalars(select(Eval.score).where(Eval.run_id == run_id, Eval.benchmark == "split")
                           .order_by(Eval.step)).all()
    assert len(scores) == 3 and scores[-1] > scores[0] + 0.1, scores


@pytest.mark.parametrize("args,needle", [
    (["--algo", "ppo"], "unknown algorithm 'ppo'"),
    (["--algo", "grpo", "--dtype", "fp6"], "unknown dtype"),
    (["--algo", "grpo", "--build", "nope"], "no build 'nope'"),
    (["--algo", "grpo", "--model", "other/model"], "no build yet for model 'other/model'"),
    (["--algo", "grpo", "--checkpoint-dir", "/proc/ckpt"], "not writable"),
    (["--algo", "grpo", "--samples-per-prompt", "1"], "--samples-per-prompt must be >= 2"),
    (["--algo", "grpo", "--max-steps", "-3"], "--max-steps must be >= 0"),
    (["--algo", "grpo", "--lr", "-1"], "--lr must be > 0"),
])
def test_bad_run_input(sqlite_build, args, needle):
    url, _ = sqlite_build
    r = CliRunner().invoke(app, ["run", *args, "--db", url])
    assert r.exit_code == 2 and needle in " ".join(r.output.split()), r.output
    with session(open_store(url)) as s:
        assert s.scalars(select(Run).where(Run.status.in_(("running", "failed")))).all() == []


def test_run_without_any_build_says_which_command_makes_one():
    r = CliRunner().invoke(app, ["run", "--algo", "grpo"])
    assert r.exit_code == 2 and "bench build --model tiny-math" in " ".join(r.output.split())


def test_algo_list():
    r = CliRunner().invoke(app, ["run", "--algo", "list"])
    assert r.exit_code == 0 and all(a in r.stdout for a in REGISTRY)


def _steps(url, run_id):
    with session(open_store(url)) as s:
        return s.execute(select(RunStep.step, RunStep.reward).where(RunStep.run_id == run_id)
                         .order_by(RunStep.step)).all()


def test_sigkill_then_resume_gives_contiguous_identical_steps(db_url, tmp_path):
    build = make_build(db_url)
    # evaluations at 0, 6, 12: the stop rule pools 3 of them, so no verdict can end the run before step 12
    args = ["run", "--algo", "grpo", "--dtype", "fp32", "--build", build, "--max-steps", "12", "--eval-every", "6",
            "--checkpoint-every", "3", "--prompts-per-step", "4", "--samples-per-prompt", "4", "--eval-split-m", "1",
            "--threads", "1", "--db", db_url]
    env = {**os.environ, "BENCH_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    engine = open_store(db_url)
    run_id, deadline = None, time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        with session(engine) as s:
            run = s.scalars(select(Run)).first()
            if run and run.step >= 5:
                run_id = run.id
                break
        time.sleep(0.05)
    assert run_id and proc.poll() is None, "run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = _steps(db_url, run_id)
    assert 5 <= len(killed) < 12
    # killed: the store still says running, with a heartbeat; once that is older than DEAD_AFTER_S
    # every reader shows the run interrupted (as after a kill on another host of a team's store)
    with session(engine) as s:
        run = s.get(Run, run_id)
        assert run.status == "running" and run.heartbeat_at is not None
        run.heartbeat_at = run.updated_at = run.heartbeat_at - timedelta(seconds=DEAD_AFTER_S + 60)
    listed = subprocess.run([sys.executable, "-m", "bench.cli", "runs", "--json", "--db", db_url], env=env,
                            capture_output=True, text=True, timeout=120)
    assert [r["status"] for r in json.loads(listed.stdout)] == ["interrupted"], listed.stderr
    shown = json.loads(subprocess.run([sys.executable, "-m", "bench.cli", "runs", "show", run_id, "--json", "--db",
                                       db_url], env=env, capture_output=True, text=True, timeout=120).stdout)
    assert shown["status"] == "interrupted" and f"bench run --resume {run_id}" in shown["stop_reason"]
    assert shown["steps"] == len(killed) and shown["peak_accuracy"] is not None           # the rest as stored
    r = subprocess.run([sys.executable, "-m", "bench.cli", "run", "--resume", run_id, "--db", db_url], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    resumed = _steps(db_url, run_id)
    assert [s for s, _ in resumed] == list(range(1, 13))
    # an uninterrupted run with the same settings gives the same rewards step for step
    r = subprocess.run([sys.executable, "-m", "bench.cli", *args, "--json"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    fresh = _steps(db_url, json.loads(r.stdout)["id"])
    assert resumed == fresh


def test_a_run_of_zero_steps_is_evaluated_and_no_cell(sqlite_build, tmp_path):
    """`--max-steps 0`: the step-0 gate and evaluation only (the equivalence protocol's sweep):
    status `evaluated`, supported by its evidence, and no seed of any leaderboard cell."""
    from bench import verdicts
    from leaderboard.cells import cells_frame
    from leaderboard.queries import runs_frame

    url, build = sqlite_build
    store = open_store(url)
    cfg = small_cfg()
    cfg.max_steps = 0
    run_id = start_run(store, "grpo", Precision("fp32", "fp32"), cfg, build_id=build, ckpt_root=tmp_path)
    with session(store) as s:
        run = s.get(Run, run_id)
        assert (run.status, run.step) == ("evaluated", 0) and run.calibration["ok"]
        assert s.scalars(select(Eval).where(Eval.run_id == run_id, Eval.benchmark == "split")).one().step == 0
    with store.connect() as conn:
        ev = verdicts.from_store(conn, [run_id])[run_id]
    assert verdicts.check(ev) is None and verdicts.decide(ev).status == "evaluated"
    runs = runs_frame(store)
    mine = runs[runs.run == run_id]
    assert list(mine.status) == ["evaluated"] and list(mine.sanity) == ["NO VERDICT"]
    assert mine.config_fp.iloc[0] not in set(cells_frame(runs).config_fp)          # no cell holds it
