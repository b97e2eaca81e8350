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
from runners.plan import config_from_dict
from runners.runs import start_run
from runners.trainer import NativeTrainer

import staleness_golden as golden

GOLDEN = Path(__file__).parents[1] / "data" / "staleness_golden.json"


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
        return [(st.step, golden.deterministic(st.metrics, staleness=True))
                for st in s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step))]


def _compare(case, got, exact: bool):
    assert got["status"] == case["status"] and len(got["steps"]) == len(case["steps"]) == 3, case["name"]
    for want, have in zip(case["steps"], got["steps"]):
        m = have["metrics"]        # staleness_* (0 here) are left out: the runs of before had none
        if exact:
            assert have == want, (case["name"], {k: (want["metrics"].get(k), v) for k, v in m.items()
                                                 if want["metrics"].get(k) != v})
        else:
            assert have["step"] == want["step"]
            assert not golden.close_enough(want["metrics"], m), (case["name"], golden.close_enough(want["metrics"], m))
    assert got["evals"] == case["evals"], case["name"]
    assert (got["peak_accuracy"], got["final_accuracy"], got["calibration"]["ok"]) == (
        case["peak_accuracy"], case["final_accuracy"], case["calibration"]["ok"]), case["name"]
    if exact:      # the keys the golden has (the gate stores more checks since: bench/calibration.py)
        assert {k: got["calibration"].get(k) for k in case["calibration"]} == case["calibration"], case["name"]


def test_cross_cpu_tolerance_by_hand():
    """1e-3 relative on training numbers, 1e-3 absolute on the engine-comparison noise metrics,
    exact on anything that is not a number."""
    want = {"loss": 1.0, "kl_k3": 1e-7, "reward": 0.5, "note": "a"}
    assert golden.close_enough(want, {"loss": 1.0009, "kl_k3": 9e-4, "reward": 0.5, "note": "a"}) == {}
    assert golden.close_enough(want, {"loss": 1.0011, "kl_k3": 1.1e-3, "reward": 0.5, "note": "b"}) == {
        "loss": (1.0, 1.0011), "kl_k3": (1e-7, 1.1e-3), "note": ("a", "b")}
    assert golden.close_enough(want, {"loss": 1.0, "kl_k3": 1e-7, "note": "a"}) == {"reward": (0.5, None)}


@pytest.mark.integration
def test_k0_reproduces_the_stored_steps_of_the_code_before_staleness(built, tmp_path):
    """The pre-change pin (fp32): bit for bit on the CPU kind it was recorded on, within
    golden.FP32_TOLERANCE on another (tests/staleness_golden.py says which is which)."""
    url, build, _ = built
    torch.set_num_threads(1)
    data = json.loads(GOLDEN.read_text())
    assert data["build_args"] == golden.BUILD and {c["dtype"] for c in data["cases"]} == {"fp32"}
    exact = golden.cpu_kind() == data["recorded_on"]
    for case in data["cases"]:
        config = {**case["config"], "staleness": 0}
        _compare(case, golden.run_case(url, build, config, case["algo"], case["dtype"], tmp_path), exact)


@pytest.mark.integration
def test_k0_fp16_regression_snapshot(built, tmp_path, monkeypatch):
    """The fp16 cases against the regression snapshot of this CPU kind on the emulated 16-bit
    kernels, bit for bit. Not a pin of the code before staleness (see tests/staleness_golden.py)."""
    url, build, _ = built
    torch.set_num_threads(1)
    monkeypatch.setenv("BENCH_CPU_16BIT", golden.FP16_SNAPSHOT_PATH)
    snap = json.loads(golden.SNAPSHOT.read_text())
    if golden.snapshot_key() not in snap:
        pytest.skip(f"no fp16 snapshot for {golden.snapshot_key()} (recorded: {', '.join(snap)}); "
                    "record one with `python tests/staleness_golden.py --fp16-snapshot`")
    data = snap[golden.snapshot_key()]
    assert data["build_args"] == golden.BUILD and len(data["cases"]) == 3
    for case in data["cases"]:
        _compare(case, golden.run_case(url, build, {**case["config"], "staleness": 0}, case["algo"], case["dtype"],
                                       tmp_path), exact=True)


class Recorder(NativeTrainer):
    """The trainer with every step's master weights (after the update), the rollout engine's
    weights when it sampled, and the step's batch and log-probs recorded."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.masters = {0: self._params()}          # θ_t by t
        self.seen = []

    def _params(self):
        return {n: p.detach().clone() for n, p in self.learner.master.named_parameters()}

    def _rollouts(self, idx, sp, for_loss=True):
        engine_weights = {n: p.detach().float().clone() for n, p in self.engine.model.named_parameters()}
        samples, batch, mu, logq = super()._rollouts(idx, sp, for_loss)
        self.seen.append({"step": self.step, "engine": engine_weights, "batch": batch, "mu": mu.clone()})
        return samples, batch, mu, logq

    def train_step(self):
        metrics = super().train_step()
        self.masters[self.step + 1] = self._params()
        self.seen[-1]["metrics"] = metrics
        return metrics


def make_trainer(url, build, cfg, algo, dtype, tmp, cls=NativeTrainer, run_id="r0"):
    from runners.plan import RunPlan, load_split, resolve_inputs
    from bench.store import Run as RunRow

    store = open_store(url)
    with session(store) as s:
        b, m, ref = resolve_inputs(s, build, None)
        split = load_split(s, b.id)
        s.add(RunRow(id=run_id, model_id=m.id, build_id=b.id, algo=algo, rollout_dtype=dtype, train_dtype=dtype,
                     trainer="native", engine="torch", config={"seed": 0}, status="running"))
    plan = RunPlan(algo, Precision(dtype, dtype), cfg, b.id, m.id, ref, "torch", "cpu")
    return cls(store, run_id, plan, split, tmp)


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
        model = copy.deepcopy(t.learner.master)
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
    # an evaluation samples the current weights θ_5, then the engine holds θ_{5−K} again, and its
    # sync statistics still remember θ_{5−K} as the last sync (the next step compares stale to stale)
    during = []
    generate = t.engine.generate
    t.engine.generate = lambda *a, **kw: (during.append({n: p.detach().clone() for n, p in
                                                          t.engine.model.named_parameters()}), generate(*a, **kw))[1]
    stats = dict(t.engine.sync_stats)
    t.evaluate()
    assert during and all(torch.equal(w[n], t.masters[5][n]) for w in during for n in names)
    after = dict(t.engine.model.named_parameters())
    assert all(torch.equal(after[n], t.masters[5 - k][n]) for n in names)
    assert t.engine.sync_stats == stats and t.engine.track_updates
    for n, prev in t.engine.weights.prev.items():
        assert torch.equal(prev, t.masters[5 - k][n].flatten()), n


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
    from runners.runs import resume_run

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
def test_every_algorithm_runs_three_steps_at_k2(built, tmp_path):
    url, build, _ = built
    torch.set_num_threads(1)
    store = open_store(url)
    for algo in REGISTRY:
        cfg = small(max_steps=3, eval_every=3, staleness=2)
        cfg.benchmarks = []
        run_id = start_run(store, algo, Precision("fp16", "fp16"), cfg, build_id=build, ckpt_root=tmp_path)
        st = steps_of(url, run_id)
        with session(store) as s:
            run = s.get(Run, run_id)
            assert (run.status, run.staleness) == ("max_steps", 2), (algo, run.stop_reason)
        assert [m["staleness_k"] for _, m in st] == [0, 1, 2], algo
        assert st[0][1]["staleness_kl_k3"] == 0
        assert all(m["staleness_kl_k3"] > 0 and m["staleness_abs_dp"] > 0 for _, m in st[1:]), algo
        assert all(m["loss"] == m["loss"] for _, m in st), algo


def test_bad_staleness_is_refused():
    from runners.presets import check_run_config, get_preset

    for bad in (-1, 1.5, True, "2"):
        cfg = get_preset("tiny")
        cfg.staleness = bad
        with pytest.raises(ValueError, match="--staleness must be (an integer )?>= 0"):
            check_run_config(cfg)
    assert config_from_dict({**json.loads(GOLDEN.read_text())["cases"][0]["config"]}).staleness == 0


def test_migration_0005_adds_staleness_from_the_config(tmp_path):
    from sqlalchemy import text

    from conftest import store_at_revision

    url = f"sqlite:///{tmp_path / 's.db'}"
    engine = store_at_revision(url, "0004")
    with engine.begin() as c:
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


FAST = ["--max-steps", "2", "--eval-every", "2", "--prompts-per-step", "4", "--samples-per-prompt", "4",
        "--threads", "1"]


@pytest.fixture(scope="module")
def swept(built, tmp_path_factory):
    """In a store of its own: `bench sweep --staleness 0,2 --seeds 1`, then `--staleness 0,1,2`:
    the finished (cell, K, seed) runs are skipped, K=1 runs."""
    from typer.testing import CliRunner

    from bench.cli import app

    url = f"sqlite:///{tmp_path_factory.mktemp('swept') / 'store.db'}"
    build = golden.make_build(url)
    cell = ["--algo", "pg-seq-is", "--dtype", "fp32", "--build", build, *FAST, "--db", url]
    first = CliRunner().invoke(app, ["sweep", *cell, "--staleness", "0,2", "--seeds", "1"])
    assert first.exit_code == 0, first.output
    second = CliRunner().invoke(app, ["sweep", *cell, "--staleness", "0,1,2", "--seeds", "1"])
    assert second.exit_code == 0, second.output
    return url, build, first, second


@pytest.mark.integration
def test_sweep_staleness_axis_skips_finished_cell_k_seed_runs(swept):
    from typer.testing import CliRunner

    from bench.cli import app

    url, build, first, second = swept
    with session(open_store(url)) as s:
        runs = {(r.staleness, r.seed): r for r in s.scalars(select(Run).where(Run.algo == "pg-seq-is",
                                                                                 Run.build_id == build))}
    assert sorted(runs) == [(0, 0), (1, 0), (2, 0)]
    assert all(r.config["staleness"] == k and r.status == "max_steps" for (k, _), r in runs.items())
    assert "run pg-seq-is fp32 K=0 seed 0 on build" in first.stderr and "run pg-seq-is fp32 K=2 seed 0" in first.stderr
    assert f"skip pg-seq-is fp32 K=0 seed 0: finished as run {runs[0, 0].id}" in second.stderr
    assert f"skip pg-seq-is fp32 K=2 seed 0: finished as run {runs[2, 0].id}" in second.stderr
    assert "run pg-seq-is fp32 K=1 seed 0 on build" in second.stderr
    assert "┃ K ┃" in second.stdout                                  # the grid's K column
    # without the axis a cell is the preset's K (0): finished; `bench run --staleness 2 --seeds 1` too
    r = CliRunner().invoke(app, ["sweep", "--algo", "pg-seq-is", "--dtype", "fp32", "--build", build, *FAST,
                                 "--db", url])
    assert r.exit_code == 0 and f"skip pg-seq-is fp32: finished as run {runs[0, 0].id}" in r.stderr, r.output
    r = CliRunner().invoke(app, ["run", "--algo", "pg-seq-is", "--dtype", "fp32", "--build", build, *FAST,
                                 "--staleness", "2", "--seeds", "1", "--json", "--db", url])
    assert r.exit_code == 0, r.output
    assert [(x["run"], x["status"]) for x in json.loads(r.stdout)] == [(runs[2, 0].id, "max_steps (earlier)")]
    with session(open_store(url)) as s:
        assert len(s.scalars(select(Run).where(Run.algo == "pg-seq-is", Run.build_id == build)).all()) == 3


@pytest.mark.integration
def test_report_groups_cells_by_staleness(swept):
    from typer.testing import CliRunner

    from bench.cli import app

    url, build, _, _ = swept
    r = CliRunner().invoke(app, ["report", "--db", url, "--build", build, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    cells = [c for c in doc["cells"] if c["algo"] == "pg-seq-is"]
    assert [c["staleness"] for c in cells] == [0, 1, 2] and all(c["passes"].endswith("/1") for c in cells)
    assert [c["staleness"] for c in doc["summary"]["per_cell"] if c["algo"] == "pg-seq-is"] == [0, 1, 2]
    runs = json.loads(CliRunner().invoke(app, ["report", "--db", url, "--build", build, "--runs", "--json"])
                      .stdout)["runs"]
    ks = [x["staleness"] for x in runs]
    assert ks == sorted(ks) and {0, 1, 2} <= set(ks)
    text = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["report", "--db", url, "--build", build]).stdout
    assert "┃ K ┃" in text and "pg-seq-is fp32 K=1 (0/1 pass: p ≥ 0.00)" in " ".join(text.split())


@pytest.mark.integration
def test_staleness_page(swept):
    import os

    from streamlit.testing.v1 import AppTest

    url, build, _, _ = swept
    os.environ["BENCH_DB_URL"] = url
    at = AppTest.from_file(str(Path(__file__).parents[2] / "leaderboard" / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("pages/staleness.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.title[0].value == "Staleness"
    algo = next(sb for sb in at.selectbox if sb.label == "Algorithm")
    assert algo.value == "pg-seq-is"
    table = at.dataframe[0].value
    assert list(table.staleness) == [0, 1, 2] and set(table.precision) == {"fp32"}
    assert (table.staleness_kl_k3[table.staleness == 0] == 0).all()
    assert (table.staleness_kl_k3[table.staleness > 0] > 0).all() and (table.kl_k3 >= 0).all()
    run = next(sb for sb in at.selectbox if sb.label == "Run")
    with session(open_store(url)) as s:                      # the stalest run first
        assert s.get(Run, run.value).staleness == 2
    titles = [json.loads(c.proto.spec).get("title") for c in at.get("vega_lite_chart")]
    assert len(titles) == 3 and any("precision vs staleness" in str(t) for t in titles), titles
    # the Run page of a stale run shows its K and both components
    at = AppTest.from_file(str(Path(__file__).parents[2] / "leaderboard" / "app.py"), default_timeout=120)
    at.query_params["run"] = run.value
    at.run()
    at.switch_page("pages/run.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("staleness K=2" in c.value for c in at.caption)
    titles = [json.loads(c.proto.spec).get("title") for c in at.get("vega_lite_chart")]
    assert any("staleness (π_θ vs π_old)" in str(t) for t in titles), titles


def test_verl_refuses_staleness_with_what_is_missing(tmp_path):
    from typer.testing import CliRunner

    from bench.cli import app
    from runners.verl_runner import VERL_STALENESS

    url = f"sqlite:///{tmp_path / 's.db'}"
    for args in (["run", "--algo", "grpo", "--trainer", "verl", "--staleness", "1"],
                 ["run", "--algo", "grpo", "--trainer", "verl", "--staleness", "2", "--dry-run"],
                 ["sweep", "--algo", "grpo", "--dtype", "fp16", "--trainer", "verl", "--staleness", "0,1"]):
        r = CliRunner().invoke(app, [*args, "--db", url])
        text = " ".join(r.output.split())
        assert r.exit_code == 2 and "native trainer only" in text and "one_step_off_policy" in text, r.output
        assert "bypass_mode=True" in text and text.count("error:") == 1
    assert not (tmp_path / "s.db").exists()                # refused before the store is opened
    assert not (tmp_path / "bench_home" / "verl").exists()
    assert "staleness_threshold" in VERL_STALENESS


@pytest.mark.parametrize("text", ["x", "-1", "1,-2", ",", "1.5"])
def test_bad_staleness_axis(text, tmp_path):
    from typer.testing import CliRunner

    from bench.cli import app
    from runners.sweep import parse_staleness

    r = CliRunner().invoke(app, ["sweep", "--staleness", text, "--db", f"sqlite:///{tmp_path / 's.db'}"])
    assert r.exit_code == 2 and "bad --staleness" in r.stderr, r.output
    assert parse_staleness("0,1,2,4,8,16") == [0, 1, 2, 4, 8, 16] and parse_staleness("2,2,0") == [2, 0]
    r = CliRunner().invoke(app, ["run", "--algo", "grpo", "--staleness", "-3",
                                 "--db", f"sqlite:///{tmp_path / 's.db'}"])
    assert r.exit_code == 2 and "--staleness must be >= 0" in " ".join(r.output.split())

