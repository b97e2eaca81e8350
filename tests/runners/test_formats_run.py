"""Every pair with a format below 16 bits or bf16+head32 runs 2 steps in the native trainer on
a real tiny-math build: one algorithm per pair (cycling through the seven), and all seven
algorithms on one fp8 and one int8 pair. Mixed pairs also store `split@train`; every step
stores the rollout-sync statistics."""

import json

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bench.cli import app
from bench.precision import ALL_PAIRS, CLASSIC_PAIRS, Precision
from bench.store import Eval, Run, RunStep, open_store, session
from bench.algorithms import PAPER_ALGORITHMS

from runners.presets import get_preset
from runners.runs import start_run

pytestmark = pytest.mark.integration

NEW_PAIRS = [p for p in ALL_PAIRS if p not in CLASSIC_PAIRS]          # 26
ALGOS = list(PAPER_ALGORITHMS)        # the corrections' arithmetic is the same per format: test_run.py runs each
CELLS = ([(ALGOS[i % len(ALGOS)], p) for i, p in enumerate(NEW_PAIRS)]
         + [(a, Precision("fp8", "fp8")) for a in ALGOS] + [(a, Precision("int8", "bf16")) for a in ALGOS])
CELLS = list(dict.fromkeys(CELLS))


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('formats') / 'store.db'}"
    r = CliRunner().invoke(app, ["build", "--model", "tiny-math", "--limit", "24", "--k", "4", "--engine", "torch",
                                 "--dtype", "fp32", "--band", "0.1", "0.9", "--json", "--db", url])
    assert r.exit_code == 0, r.output
    return url, json.loads(r.stdout)["build_id"]


def cfg2():
    cfg = get_preset("tiny")
    cfg.prompts_per_step, cfg.samples_per_prompt, cfg.max_steps = 2, 4, 2
    cfg.eval_every, cfg.checkpoint_every, cfg.eval_split_m = 2, 2, 1
    cfg.benchmarks = []
    cfg.max_tokens = cfg.algo.max_len = 32
    return cfg


def test_cells_cover_the_issue():
    assert len(NEW_PAIRS) == 26 and {p for _, p in CELLS} == set(NEW_PAIRS)
    assert {a for a, p in CELLS if p == Precision("fp8", "fp8")} == set(PAPER_ALGORITHMS)
    assert {a for a, p in CELLS if p.rollout == "int8"} == set(PAPER_ALGORITHMS)


@pytest.mark.parametrize("algo,pair", CELLS, ids=[f"{a}-{p.rollout}-{p.train}" for a, p in CELLS])
def test_every_new_pair_runs_two_steps(build, tmp_path, algo, pair):
    url, build_id = build
    store = open_store(url)
    run_id = start_run(store, algo, pair, cfg2(), build_id=build_id, ckpt_root=tmp_path)
    with session(store) as s:
        run = s.get(Run, run_id)
        assert run.status == "max_steps" and run.step == 2, (run.status, run.stop_reason)
        assert (run.rollout_dtype, run.train_dtype) == (pair.rollout, pair.train) and run.calibration["ok"]
        steps = s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step)).all()
        assert [st.step for st in steps] == [1, 2]
        for st in steps:
            m = st.metrics
            assert 0.0 <= m["rollout_weights_moved"] <= 1.0 and m["rollout_update_to_step"] >= 0.0, m
            assert m["kl_k3"] is not None and m["grad_norm"] is not None
        benches = set(s.scalars(select(Eval.benchmark).where(Eval.run_id == run_id)).all())
        assert benches == ({"split", "split@train"} if pair.rollout != pair.train else {"split"})
