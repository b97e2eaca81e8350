"""Seeds and confidence: a cell aggregated over its seeds against hand-computed values (k/N,
the t-interval, medians), `--seeds` parsing, and a partly finished seeded sweep resumed."""

import json
import math
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select, update
from typer.testing import CliRunner

from bench.cli import app
from bench.stats import logit_t_interval
from bench.store import Run, RunStep, open_store, session
from conftest import add_model_and_build
from runners.sweep import parse_seeds


def test_parse_seeds():
    assert parse_seeds("3") == [0, 1, 2]
    assert parse_seeds("0,3,5") == [0, 3, 5]
    assert parse_seeds("5,") == [5]
    assert parse_seeds("2,2,1") == [2, 1]
    for bad in ("0", "-1", "a", "1,-2", ","):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def _store_with_cells(url):
    """Three cells on one build, hand-made:
    A pg-seq-is fp16, seeds 0,1,2: PASS (peak .96, 40 steps), PASS (.98, 60), max_steps (.90); seed 2 also
      has an older failed run (counted once: the newest run stands for the seed); KL k3 1e-3, 2e-3, 4e-3
    B grpo fp16, seeds 0,1: PASS (.97, 30), PASS (.99, 50)
    C gspo bf16, seed 0: running (.50)"""
    engine = open_store(url)
    t0 = datetime(2026, 1, 1)
    with session(engine) as s:
        model_id = add_model_and_build(s)
        rows = [("a0", "pg-seq-is", "fp16", 0, "converged", 0.96, 40, 1e-3),
                ("a1", "pg-seq-is", "fp16", 1, "converged", 0.98, 60, 2e-3),
                ("a2-old", "pg-seq-is", "fp16", 2, "failed", 0.10, None, 9.0),
                ("a2", "pg-seq-is", "fp16", 2, "max_steps", 0.90, None, 4e-3),
                ("b0", "grpo", "fp16", 0, "converged", 0.97, 30, 5e-4),
                ("b1", "grpo", "fp16", 1, "converged", 0.99, 50, 7e-4),
                ("c0", "gspo", "bf16", 0, "running", 0.50, None, 1e-2)]
        for i, (rid, algo, dt, seed, status, peak, to_target, kl) in enumerate(rows):
            s.add(Run(id=rid, model_id=model_id, build_id="b0", algo=algo, rollout_dtype=dt, train_dtype=dt,
                      trainer="native", engine="torch", config={"preset": "tiny", "seed": seed}, status=status,
                      peak_accuracy=peak, steps_to_target=to_target, step=100, created_at=t0 + timedelta(minutes=i)))
            s.flush()
            s.add(RunStep.from_metrics(rid, 100, {"kl_k3": kl}))
    return engine


def test_cells_against_hand_computed_values(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    engine = _store_with_cells(url)
    with session(engine) as s:                       # the seed column is filled from the config on insert
        assert dict(s.execute(select(Run.id, Run.seed)).all())["a2-old"] == 2
    r = CliRunner().invoke(app, ["report", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    cells = json.loads(r.stdout)["cells"]
    assert [(c["algo"], c["sanity"], c["passes"]) for c in cells] == [
        ("grpo", "PASS", "2/2"), ("pg-seq-is", "UNDECIDED", "2/3"), ("gspo", "RUNNING", "0/1")]
    b, a, c = cells
    s_a = math.sqrt(((0.96 - 2.84 / 3) ** 2 + (0.98 - 2.84 / 3) ** 2 + (0.90 - 2.84 / 3) ** 2) / 2)
    assert a["seeds"] == [0, 1, 2] and a["runs"] == ["a0", "a1", "a2"] and a["n_seeds"] == 3
    assert a["peak_mean"] == pytest.approx(2.84 / 3)
    assert a["peak_t_lo"] == pytest.approx(2.84 / 3 - 4.302652729911275 * s_a / math.sqrt(3))   # the plain one
    assert a["peak_t_hi"] == pytest.approx(2.84 / 3 + 4.302652729911275 * s_a / math.sqrt(3))   # 1.050: past 1
    lo, hi = logit_t_interval([0.96, 0.98, 0.90])[1:]                # the interval shown: on the logit scale
    assert (a["peak_ci_lo"], a["peak_ci_hi"]) == (pytest.approx(lo), pytest.approx(hi)) and 0 < lo < hi < 1
    assert a["peak_sd"] == pytest.approx(s_a)
    assert (a["steps_to_pass_median"], a["steps_to_pass_min"], a["steps_to_pass_max"]) == (50, 40, 60)
    assert a["kl_k3_median"] == pytest.approx(2e-3)
    assert a["pass_rate"] == pytest.approx(2 / 3) and a["status"] == "converged ×2, max_steps"
    s_b = math.sqrt(((0.97 - 0.98) ** 2 + (0.99 - 0.98) ** 2) / 1)
    assert b["peak_mean"] == pytest.approx(0.98)
    assert b["peak_t_hi"] - b["peak_mean"] == pytest.approx(12.706204736174707 * s_b / math.sqrt(2))
    assert (b["steps_to_pass_median"], b["steps_to_pass_min"], b["steps_to_pass_max"]) == (40, 30, 50)
    assert b["kl_k3_median"] == pytest.approx(6e-4)
    assert c["peak_ci_lo"] is None and c["steps_to_pass_median"] is None
    # the terminal table says the same; --runs lists every run
    r = CliRunner().invoke(app, ["report", "--db", url])
    assert "2/3" in r.stdout and "50 (40–60)" in r.stdout and f"0.947 [{lo:.3f}, {hi:.3f}]" in r.stdout
    r = CliRunner().invoke(app, ["report", "--db", url, "--runs", "--json"])
    assert len(json.loads(r.stdout)["runs"]) == 7


def test_seeds_refusals(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    for args, needle in ((["run", "--algo", "grpo", "--seeds", "2", "--seed", "1"], "not both"),
                         (["run", "--algo", "grpo", "--seeds", "2", "--resume", "x"], "--resume"),
                         (["run", "--algo", "grpo", "--seeds", "2", "--trainer", "verl", "--seed", "1"], "not both"),
                         (["sweep", "--seeds", "2", "--trainer", "verl", "--seed", "1"], "not both"),
                         (["sweep", "--seeds", "x"], "bad --seeds")):
        r = CliRunner().invoke(app, [*args, "--db", url])
        assert r.exit_code == 2 and needle in r.stderr, (args, r.output)


FAST = ["--max-steps", "2", "--eval-every", "2", "--prompts-per-step", "2", "--samples-per-prompt", "2"]


@pytest.mark.integration
def test_a_partly_finished_seeded_sweep_resumes_the_missing_pairs(tmp_path):
    """Seeds 0 and 1 ran; seed 1 was then killed (its run failed). `--seeds 3` skips seed 0,
    runs seed 1 again and seed 2; `bench run --seeds 0,2` afterwards has nothing to do."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(app, ["build", "--limit", "12", "--k", "4", "--engine", "torch", "--dtype", "fp32",
                                 "--band", "0", "1", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["sweep", "--algo", "pg-seq-is", "--dtype", "fp32", "--seeds", "2", "--all-seeds",
                                 *FAST, "--db", url])
    assert r.exit_code == 0, r.output
    engine = open_store(url)
    with session(engine) as s:
        first = {x.seed: x.id for x in s.scalars(select(Run))}
        assert sorted(first) == [0, 1]
        assert all(x.config["seed"] == x.seed for x in s.scalars(select(Run)))
        s.execute(update(Run).where(Run.id == first[1]).values(status="failed", stop_reason="interrupted"))
    r = CliRunner().invoke(app, ["sweep", "--algo", "pg-seq-is", "--dtype", "fp32", "--seeds", "3", "--all-seeds",
                                 *FAST, "--db", url])
    assert r.exit_code == 0, r.output
    assert f"skip pg-seq-is fp32 seed 0: finished as run {first[0]}" in r.stderr
    assert "run pg-seq-is fp32 seed 1 on build" in r.stderr and "run pg-seq-is fp32 seed 2 on build" in r.stderr
    with session(engine) as s:
        runs = s.scalars(select(Run).order_by(Run.created_at)).all()
        assert sorted((x.seed, x.status) for x in runs) == [(0, "max_steps"), (1, "failed"), (1, "max_steps"),
                                                             (2, "max_steps")]
    r = CliRunner().invoke(app, ["run", "--algo", "pg-seq-is", "--dtype", "fp32", "--seeds", "0,2", "--all-seeds",
                                 *FAST, "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    assert [x["status"] for x in json.loads(r.stdout)] == ["max_steps (earlier)", "max_steps (earlier)"]
    with session(engine) as s:
        assert s.scalar(select(func.count()).select_from(Run)) == 4
    cells = json.loads(CliRunner().invoke(app, ["report", "--db", url, "--json"]).stdout)["cells"]
    assert len(cells) == 1 and cells[0]["passes"] == "0/3" and cells[0]["seeds"] == [0, 1, 2]
    assert len(set(cells[0]["runs"])) == 3 and first[1] not in cells[0]["runs"]    # the rerun stands for seed 1


def test_eval_seed_mixes_the_run_seed_by_hand():
    from runners.eval_seeds import BENCHMARK_EVAL, SPLIT_EVAL, eval_seed

    assert eval_seed(SPLIT_EVAL, 0, 0) == 10_000_019 and eval_seed(BENCHMARK_EVAL, 0, 7) == 20_000_010  # as before
    assert eval_seed(SPLIT_EVAL, 1, 0) == 10_000_019 + 4_294_967_296
    assert eval_seed(BENCHMARK_EVAL, 3, 5) == 20_000_003 + 5 + 3 * 4_294_967_296
    seeds = {eval_seed(SPLIT_EVAL, s, t) for s in range(5) for t in range(300)}
    assert len(seeds) == 5 * 300                                     # no two (seed, step) pairs share draws
    training = {s * 1_000_003 + t for s in range(5) for t in range(300)} | {30_000_001 + s for s in range(5)}
    assert not {eval_seed(SPLIT_EVAL, s, t) for s in range(1, 5) for t in range(300)} & training


@pytest.mark.integration
def test_seeds_draw_their_own_evaluations(tmp_path, monkeypatch):
    """Step-0 evaluations (split and benchmark) of seeds 0, 1 and 0 again, no training step: the
    weights are the same, so only the sampling seed tells the draws apart. Seed 1's differ from
    seed 0's; seed 0 twice draws the same."""
    from bench.precision import Precision
    from runners import trainer
    from runners.runs import start_run
    from staleness_golden import base_config, make_build

    url = f"sqlite:///{tmp_path / 's.db'}"
    build = make_build(url)
    drawn = []
    score = trainer.NativeTrainer._score

    def spy(self, problems, samples):
        drawn[-1].append([s.text for row in samples for s in row])
        return score(self, problems, samples)

    monkeypatch.setattr(trainer.NativeTrainer, "_score", spy)
    for seed in (0, 1, 0):
        cfg = base_config()
        cfg.max_steps, cfg.seed = 0, seed
        drawn.append([])
        start_run(open_store(url), "pg-seq-is", Precision.parse("fp32"), cfg, build_id=build,
                  ckpt_root=tmp_path / "ckpt")
    first, other, again = drawn
    assert len(first) == 2                                           # split, synthetic-hard
    assert first == again
    assert first[0] != other[0] and first[1] != other[1]
