"""Staleness (runners/staleness.py): K=0 reproduces the stored steps of the code from before
staleness existed; the rollout engine samples with the weights of K updates ago and π_old is
the training engine at those weights (hand-checked by recomputing both from recorded master
weights); the staleness metrics; checkpoint and resume with K=2; every algorithm at K=2."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from sqlalchemy import select

from bench.precision import Precision
from bench.store import Eval, Run, RunStep, open_store, session
from runners.algos import REGISTRY
from runners.trainer import NativeTrainer, config_from_dict, start_run

import staleness_golden as golden

GOLDEN = Path(__file__).parent / "data" / "staleness_golden.json"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The golden runs' build: 12 synthetic problems, all kept (the split does not depend on sampling)."""
    import os

    tmp = tmp_path_factory.mktemp("staleness")
    old = os.environ.get("BENCH_HOME")
    os.environ["BENCH_HOME"] = str(tmp / "home")
    url = f"sqlite:///{tmp / 'store.db'}"
    build = golden.make_build(url)
    yield url, build, tmp
    if old is None:
        os.environ.pop("BENCH_HOME", None)
    else:
        os.environ["BENCH_HOME"] = old


def small(**over):
    cfg = golden.base_config()
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def steps_of(url, run_id):
    with session(open_store(url)) as s:
        return [(st.step, golden.deterministic(st.metrics))
                for st in s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step))]


@pytest.mark.integration
def test_k0_reproduces_the_stored_steps_of_the_code_before_staleness(built, tmp_path):
    url, build, _ = built
    torch.set_num_threads(1)
    data = json.loads(GOLDEN.read_text())
    assert data["build_args"] == golden.BUILD
    for case in data["cases"]:
        config = {**case["config"], "staleness": 0}
        got = golden.run_case(url, build, config, case["algo"], case["dtype"], tmp_path)
        assert got["status"] == case["status"] and len(got["steps"]) == len(case["steps"]) == 3, case["name"]
        for want, have in zip(case["steps"], got["steps"]):
            m = have["metrics"]
            assert m.pop("staleness_k") == 0 and m.pop("staleness_kl_k3") == 0 and m.pop("staleness_abs_dp") == 0
            assert have == want, (case["name"], {k: (want["metrics"].get(k), v) for k, v in m.items()
                                                 if want["metrics"].get(k) != v})
        assert got["evals"] == case["evals"], case["name"]
        assert (got["peak_accuracy"], got["final_accuracy"], got["calibration"]) == (
            case["peak_accuracy"], case["final_accuracy"], case["calibration"]), case["name"]


class Recorder(NativeTrainer):
    """The trainer with every step's master weights (after the update), the rollout engine's
    weights when it sampled, and the step's batch and log-probs recorded."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.masters = {0: self._params()}          # θ_t by t
        self.seen = []

    def _params(self):
        return {n: p.detach().clone() for n, p in self.master.named_parameters()}

    def _rollouts(self, idx, sp):
        engine_weights = {n: p.detach().float().clone() for n, p in self.engine.model.named_parameters()}
        samples, batch, mu = super()._rollouts(idx, sp)
        self.seen.append({"step": self.step, "engine": engine_weights, "batch": batch, "mu": mu.clone()})
        return samples, batch, mu

    def train_step(self):
        metrics = super().train_step()
        self.masters[self.step + 1] = self._params()
        self.seen[-1]["metrics"] = metrics
        return metrics


def make_trainer(url, build, cfg, algo, dtype, tmp, cls=NativeTrainer, run_id="r0"):
    from runners.runs import load_split, resolve_inputs
    from bench.store import Run as RunRow

    store = open_store(url)
    with session(store) as s:
        b, m, ref = resolve_inputs(s, build, None)
        split = load_split(s, b.id)
        s.add(RunRow(id=run_id, model_id=m.id, build_id=b.id, algo=algo, rollout_dtype=dtype, train_dtype=dtype,
                     trainer="native", engine="torch", config={"seed": 0}, status="running"))
    return cls(store, run_id, cfg, algo, Precision(dtype, dtype), "torch", ref, split, tmp, device="cpu")


@pytest.mark.integration
@pytest.mark.parametrize("k", [1, 2])
def test_rollouts_use_the_weights_of_k_updates_ago(built, tmp_path, k):
    """By hand: at step t the rollout engine holds θ_{max(0, t−K)} (the master recorded after
    that step), μ is that model's log-prob of each sampled token, and π_old is the training
    engine's forward at θ_{max(0, t−K)}; the staleness metrics compare it with π_θ at θ_t."""
    from runners.logprobs import response_logprobs

    url, build, _ = built
    torch.set_num_threads(1)
    cfg = small(max_steps=5, eval_every=100, staleness=k)
    t = make_trainer(url, build, cfg, "grpo", "fp32", tmp_path, Recorder, run_id=f"hand{k}")
    for _ in range(5):
        t.train_step()
        t.step += 1
    names = list(t.masters[0])
    for rec in t.seen:
        step = rec["step"]
        lag = min(k, step)
        src = t.masters[step - lag]
        assert rec["metrics"]["staleness_k"] == lag
        for n in names:                      # the fp32 engine holds exactly θ_{t−K}
            assert torch.equal(rec["engine"][n], src[n]), (step, n)
        if step >= 2:                        # ... which is not the master's θ_t
            assert not all(torch.equal(rec["engine"][n], t.masters[step][n]) for n in names)
        model = copy.deepcopy(t.master)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(src[n])
            old = response_logprobs(model, *rec["batch"].tensors) * rec["batch"].mask
            for n, p in model.named_parameters():
                p.copy_(t.masters[step][n])
            cur = response_logprobs(model, *rec["batch"].tensors) * rec["batch"].mask
        mask = rec["batch"].mask
        # μ (rollout engine, fp32) and π_old (training engine, fp32) at θ_{t−K}: the same up to fp32 rounding
        assert (rec["mu"] - old).abs().max() < 1e-4, step
        assert rec["metrics"]["kl_k3"] < 1e-8
        from runners.staleness import staleness_metrics

        want = staleness_metrics(old, cur, mask)
        m = rec["metrics"]
        if lag:
            assert m["staleness_kl_k3"] == pytest.approx(want["staleness_kl_k3"], rel=1e-3, abs=1e-9)
            assert m["staleness_abs_dp"] == pytest.approx(want["staleness_abs_dp"], rel=1e-3, abs=1e-9)
            assert m["staleness_kl_k3"] > 0 and m["staleness_abs_dp"] > 0
        else:
            assert m["staleness_kl_k3"] == 0 and m["staleness_abs_dp"] == 0


@pytest.mark.integration
def test_checkpoint_and_resume_with_k2_give_the_steps_of_an_uninterrupted_run(built, tmp_path):
    url, build, _ = built
    torch.set_num_threads(1)
    store = open_store(url)
    cfg = small(max_steps=5, eval_every=2, checkpoint_every=2, staleness=2)
    full = start_run(store, "pg-seq-is", Precision("fp16", "fp16"), copy.deepcopy(cfg), build_id=build,
                     ckpt_root=tmp_path / "a")
    # the same run killed after storing step 3 (last checkpoint: step 2), then resumed

    class Killed(Exception):
        pass

    def kill(step, total, metrics):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        start_run(store, "pg-seq-is", Precision("fp16", "fp16"), copy.deepcopy(cfg), build_id=build,
                  ckpt_root=tmp_path / "b", progress=kill)
    with session(store) as s:
        part = s.scalars(select(Run.id).where(Run.status == "failed")).one()
    assert [st for st, _ in steps_of(url, part)] == [1, 2, 3]
    ckpt = torch.load(tmp_path / "b" / part / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == 2 and len(ckpt["staleness"]) == 2
    from runners.trainer import resume_run

    resume_run(store, part)
    a, b = steps_of(url, full), steps_of(url, part)
    assert [s for s, _ in a] == [1, 2, 3, 4, 5] and a == b
    assert [m["staleness_k"] for _, m in a] == [0, 1, 2, 2, 2]
    with session(store) as s:
        evals = {rid: s.execute(select(Eval.step, Eval.benchmark, Eval.score).where(Eval.run_id == rid)
                                .order_by(Eval.step, Eval.benchmark)).all() for rid in (full, part)}
        assert evals[full] == evals[part] and {e[0] for e in evals[full]} == {0, 2, 4, 5}
        assert s.get(Run, full).staleness == 2


@pytest.mark.integration
def test_every_algorithm_runs_two_steps_at_k2(built, tmp_path):
    url, build, _ = built
    torch.set_num_threads(1)
    store = open_store(url)
    assert len(REGISTRY) == 7
    for algo in REGISTRY:
        cfg = small(max_steps=2, eval_every=2, staleness=2)
        cfg.benchmarks = []
        run_id = start_run(store, algo, Precision("fp16", "fp16"), cfg, build_id=build, ckpt_root=tmp_path)
        st = steps_of(url, run_id)
        with session(store) as s:
            run = s.get(Run, run_id)
            assert (run.status, run.staleness) == ("max_steps", 2), (algo, run.stop_reason)
        assert [m["staleness_k"] for _, m in st] == [0, 1], algo
        assert st[0][1]["staleness_kl_k3"] == 0
        assert st[1][1]["staleness_kl_k3"] > 0 and st[1][1]["staleness_abs_dp"] > 0, algo
        assert all(m["loss"] == m["loss"] for _, m in st), algo


def test_bad_staleness_is_refused():
    from runners.presets import check_run_config, get_preset

    for bad in (-1, 1.5, True, "2"):
        cfg = get_preset("tiny")
        cfg.staleness = bad
        with pytest.raises(ValueError, match="staleness must be an integer >= 0"):
            check_run_config(cfg)
    assert config_from_dict({**json.loads(GOLDEN.read_text())["cases"][0]["config"]}).staleness == 0


def test_migration_0005_adds_staleness_from_the_config(tmp_path):
    from alembic import command
    from sqlalchemy import text

    from bench.store import _alembic_config

    url = f"sqlite:///{tmp_path / 's.db'}"
    engine = open_store(url, migrate=False)
    command.upgrade(_alembic_config(engine.execution_options(bench_migration=True)), "0004")
    with engine.begin() as c:
        c.execute(text("INSERT INTO models (id, name, path, weights_hash, created_at) VALUES (1, 'm', '/m', 'h', "
                       "'2026-01-01')"))
        c.execute(text("INSERT INTO builds (id, model_id, source, engine, dtype, k, lo, hi, seed, settings_hash, "
                       "status, created_at) VALUES ('b1', 1, 's', 'torch', 'fp32', 4, 0.2, 0.8, 0, 'h', 'complete', "
                       "'2026-01-01')"))
        for rid, cfg in (("old", {"seed": 1}), ("k4", {"seed": 0, "staleness": 4})):
            c.execute(text("INSERT INTO runs (id, model_id, build_id, algo, rollout_dtype, train_dtype, trainer, "
                           "engine, config, status, step, wall_s, created_at, updated_at) VALUES (:id, 1, 'b1', "
                           "'grpo', 'fp32', 'fp32', 'native', 'torch', :cfg, 'converged', 5, 1.0, '2026-01-01', "
                           "'2026-01-01')"), {"id": rid, "cfg": json.dumps(cfg)})
    engine = open_store(url)                  # upgrades to head
    with engine.connect() as c:
        assert dict(c.execute(text("SELECT id, staleness FROM runs")).all()) == {"old": 0, "k4": 4}
    with session(engine) as s:                # new rows: from the config on insert, else 0
        s.add(Run(id="new", model_id=1, build_id="b1", algo="grpo", rollout_dtype="fp32", train_dtype="fp32",
                  trainer="native", engine="torch", config={"staleness": 8}))
        s.add(Run(id="none", model_id=1, build_id="b1", algo="grpo", rollout_dtype="fp32", train_dtype="fp32",
                  trainer="verl", engine="vllm", config={}))
    with session(engine) as s:
        assert (s.get(Run, "new").staleness, s.get(Run, "none").staleness) == (8, 0)
