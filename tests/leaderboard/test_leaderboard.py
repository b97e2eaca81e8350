"""The Streamlit app (AppTest) on a store filled by real short runs, `bench report`, and a
read-only check; PostgreSQL too."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from sqlalchemy import select
from conftest import app_page
from typer.testing import CliRunner

from bench import statuses
from bench.cli import app
from bench.fingerprint import fingerprint
from bench.store import Run, RunStep, open_store, session

pytestmark = pytest.mark.integration
PAGES = ["pages/leaderboard.py", "pages/grid.py", "pages/run.py", "pages/compare.py", "pages/builds.py",
         "pages/mismatch.py"]


def fill(url: str, tmp: Path) -> dict:
    """A real build and three real short runs (two algorithms, fp32 and bf16)."""
    r = CliRunner().invoke(app, ["build", "--limit", "48", "--k", "8", "--engine", "torch", "--dtype", "fp32",
                                 "--band", "0.1", "0.9", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    build = json.loads(r.stdout)["build_id"]
    r = CliRunner().invoke(app, ["sweep", "--algo", "pg-seq-is,grpo", "--dtype", "fp32,bf16", "--max-steps", "3",
                                 "--eval-every", "3", "--prompts-per-step", "4", "--samples-per-prompt", "4",
                                 "--db", url])
    assert r.exit_code == 0, r.output
    return {"build": build}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lb")
    url = f"sqlite:///{tmp / 'store.db'}"
    os.environ["BENCH_HOME"] = str(tmp / "home")
    info = fill(url, tmp)
    return url, info


def page(url, path=None, **query):
    os.environ["BENCH_DB_URL"] = url
    return app_page(path, timeout=120, **query)


def test_every_page_renders_on_real_runs(store):
    url, info = store
    at = page(url)
    assert at.title[0].value == "Leaderboard"
    df = at.dataframe[0].value
    assert len(df) == 4 and set(df.algo) == {"pg-seq-is", "grpo"} and set(df.precision) == {"fp32", "bf16"}
    assert list(df.sanity) == [statuses.verdict(st) for st in df.status]   # recomputed: what the statuses say
    for p in PAGES[1:]:
        at = page(url, p)
        assert at.title[0].value


def test_pass_is_the_stop_rules_verdict_not_one_noisy_reading(tmp_path):
    """A run whose readings were 0.954, 0.943, 0.955 and that ended at max_steps did not pass (it is
    UNDECIDED: its budget ran out); only a converged run passes; a run still going is RUNNING;
    passing runs rank first."""
    from leaderboard.queries import ranked, runs_frame
    from conftest import add_model_and_build
    from bench.store import Eval

    engine = open_store(f"sqlite:///{tmp_path / 's.db'}")
    with session(engine) as s:
        model_id = add_model_and_build(s, n_problems=200, n_kept=120)
        runs = {"noisy": ("max_steps", 0.955, 10), "conv": ("converged", 0.97, 120), "live": ("running", 0.96, 20),
                "conv-fast": ("converged", 0.99, 60), "low": ("plateaued", 0.6, None)}
        for rid, (status, peak, to_target) in runs.items():
            s.add(Run(id=rid, model_id=model_id, build_id="b0", algo="grpo", rollout_dtype="fp32", train_dtype="fp32",
                      trainer="native", engine="torch", config={"max_steps": 30} if rid == "noisy" else {},
                      status=status, peak_accuracy=peak, steps_to_target=to_target, step=30 if rid == "noisy" else 0))
        s.flush()
        for step, score in ((10, 0.954), (20, 0.943), (30, 0.955)):
            s.add(Eval(run_id="noisy", step=step, benchmark="split", n=4, score=score))
    df = runs_frame(engine).set_index("run")
    assert df.sanity.to_dict() == {"noisy": "UNDECIDED", "conv": "PASS", "live": "RUNNING", "conv-fast": "PASS",
                                   "low": "FAIL"}
    # converged runs by steps to target; then by peak, a single reading >= 0.95 earning nothing
    assert list(ranked(df.reset_index()).run) == ["conv-fast", "conv", "live", "noisy", "low"]


def test_leaderboard_filters(store):
    url, _ = store
    at = page(url)
    at.multiselect[2].select("grpo").run()        # Algorithm filter
    df = at.dataframe[0].value
    assert len(df) == 2 and set(df.algo) == {"grpo"}
    at.text_input[0].input("bf16").run()
    assert len(at.dataframe[0].value) == 1


def test_run_page_by_query_param_shows_curves(store):
    url, _ = store
    with session(open_store(url)) as s:
        run_id = s.scalars(select(Run.id).where(Run.algo == "grpo", Run.train_dtype == "bf16")).first()
    at = page(url, "pages/run.py", run=run_id)
    assert at.selectbox[0].value == run_id
    assert [m.value for m in at.metric][0] == "max_steps"
    # the curves: one chart per group of metrics, each named; the reward chart plots the stored rewards
    charts = {json.loads(c.proto.spec)["title"]: c for c in at.get("vega_lite_chart")}
    assert {"training reward (batch accuracy)", "evaluations (avg@n)", "KL[μ‖π] (nats)", "π − μ on sampled tokens",
            "loss and loss metrics"} <= set(charts), list(charts)
    (ds,) = charts["training reward (batch accuracy)"].proto.datasets
    plotted = pa.ipc.open_stream(ds.data.data).read_all().to_pandas()
    with session(open_store(url)) as s:
        stored = {st.step: st.metrics["reward"] for st in s.scalars(select(RunStep).where(RunStep.run_id == run_id))}
    assert len(stored) == 3 and set(plotted.metric) == {"reward"}
    assert dict(zip(plotted.step, plotted.value)) == pytest.approx(stored)


def test_grid_fills_its_empty_cells_with_one_sweep(store):
    """One algorithm at a time, every rollout format × every training format (7 × 5); the empty
    ones as one `bench sweep` that the real CLI parses, whose runs get the grid's fingerprint."""
    from test_app import parse_sweep, sweep_fingerprint

    from bench.precision import parse_list

    url, info = store
    at = page(url, "pages/grid.py")
    assert at.selectbox(key="grid_algo").value == "pg-seq-is"
    (code,) = at.code
    params = parse_sweep(code.value)
    filled = {(p.rollout, p.train) for p in parse_list(params["dtype"])}
    assert len(filled) == 35 - 2 and ("int8", "fp32") in filled and not {("bf16", "bf16"), ("fp32", "fp32")} & filled
    assert (params["algo"], params["build_id"], params["max_steps"], params["prompts_per_step"]) == \
        ("pg-seq-is", info["build"], 3, 4)
    with session(open_store(url)) as s:
        stored = {fingerprint(r.config) for r in s.scalars(select(Run).where(Run.algo == "pg-seq-is"))}
    assert stored == {sweep_fingerprint(params)}
    at.selectbox(key="grid_algo").set_value("gspo").run()
    (code,) = at.code
    assert code.value == f"bench sweep --algo gspo --build {info['build']} --dtype all"
    at.selectbox(key="grid_algo").set_value("grpo").run()
    grpo = {(p.rollout, p.train) for p in parse_list(parse_sweep(at.code[0].value)["dtype"])}
    assert len(grpo) == 33 and ("bf16", "bf16") not in grpo
    at.radio[0].set_value("peak_mean").run()
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    scales = [layer["encoding"]["color"].get("scale", {}) for sp in specs for layer in sp.get("layer", [])
              if "color" in layer.get("encoding", {})]
    assert any(sc.get("domain", [None])[0] == 0.0 and 0.95 in sc["domain"] and sc["domain"][-1] == 1.0
               for sc in scales), scales                                 # a fixed scale, not min–max


def test_empty_store_says_what_to_run(tmp_path):
    at = page(f"sqlite:///{tmp_path / 'empty.db'}")
    assert "bench build --model tiny-math" in at.info[0].value


def test_bad_url_is_a_readable_message_in_the_page():
    os.environ["BENCH_DB_URL"] = "postgresql+psycopg://nobody@127.0.0.1:1/x?connect_timeout=2"
    at = app_page()                               # raises nothing
    assert "cannot open store" in at.error[0].value


def test_app_is_read_only(store):
    from leaderboard.queries import read_only
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    url, _ = store
    engine = read_only(open_store(url, migrate=False))
    with pytest.raises(OperationalError):
        with engine.begin() as c:
            c.execute(text("DELETE FROM runs"))


def test_report_ranks_real_runs(store, tmp_path):
    url, _ = store
    r = CliRunner().invoke(app, ["report", "--runs", "--db", url, "--json", "--csv", str(tmp_path / "r.csv")])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["runs"]
    assert len(rows) == 4 and {"sanity", "mean_kl", "max_abs_dp", "peak_accuracy"} <= set(rows[0])
    assert (tmp_path / "r.csv").read_text().startswith("run,model,build,algo")
    r = CliRunner().invoke(app, ["report", "--db", url, "--json"])          # one row per cell (one seed each)
    cells = json.loads(r.stdout)["cells"]
    assert len(cells) == 4 and all(c["passes"] in ("0/1", "1/1") and len(c["runs"]) == 1 for c in cells)


def test_app_follows_a_run_that_is_still_writing(store, tmp_path):
    url, info = store
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", "run", "--algo", "gspo", "--dtype", "fp32",
                             "--build", info["build"], "--max-steps", "200", "--prompts-per-step", "4",
                             "--samples-per-prompt", "4", "--db", url],
                            env={**os.environ, "BENCH_HOME": str(tmp_path)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run_id, deadline = None, time.time() + 120
        while time.time() < deadline and not run_id:
            with session(open_store(url)) as s:
                r = s.scalars(select(Run).where(Run.algo == "gspo", Run.status == "running", Run.step >= 2)).first()
                run_id = r.id if r else None
            time.sleep(0.2)
        assert run_id
        at = page(url, "pages/run.py", run=run_id)
        assert [m.value for m in at.metric][0] == "running"
        assert at.toggle[0].value is True                 # live refresh on while it runs
        page(url)                                         # the leaderboard lists it mid-run
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.mark.postgres
def test_app_on_postgresql(pg_url, tmp_path):
    fill(pg_url, tmp_path)
    at = page(pg_url)
    assert len(at.dataframe[0].value) == 4
    for p in PAGES[1:]:
        page(pg_url, p)


def test_mismatch_reports_side_by_side(store, tmp_path):
    url, _ = store
    every_rollout = ";".join(f"rollout={d},train=fp32"
                             for d in ("fp32", "bf16", "bf16+head32", "fp16", "fp8", "int8", "nvfp4"))
    r = CliRunner().invoke(app, ["mismatch", "--dtype", every_rollout, "--limit", "8", "--n", "8", "--db", url,
                                 "--json", "--out", str(tmp_path / "plots")])
    assert r.exit_code == 0, r.output
    reports = {(x["rollout"], x["train"]): x for x in json.loads(r.stdout)}
    assert len(reports) == 7                          # every rollout format against fp32 (`all`: 35 pairs)
    dp = {d: reports[(d, "fp32")]["prob_abs_diff_mean"] for d in ("fp32", "fp16", "bf16", "fp8", "nvfp4")}
    assert dp["nvfp4"] > dp["fp8"] > dp["bf16"] > dp["fp16"] > dp["fp32"], dp
    for x in reports.values():
        assert all(Path(p).stat().st_size > 5_000 for p in x["plots"].values())
    at = page(url, "pages/mismatch.py")
    table = at.dataframe[0].value
    assert len(table) == 7 and {"kl_k1", "prob_abs_diff_mean", "log_ratio_slope"} <= set(table.columns)
    assert "bf16+head32" in set(table.rollout_dtype) and {"int8", "nvfp4"} <= set(table.rollout_dtype)


def test_mismatch_refuses_reshaped_sampling():
    r = CliRunner().invoke(app, ["mismatch", "--temperature", "0.6"])
    assert r.exit_code == 2 and "temperature 1 and top-p 1 only" in " ".join(r.output.split())


def test_mismatch_page_pairs_reports_of_the_same_conditions_only(tmp_path):
    """bf16 at limit 100 with fp16 at limit 100 (30×), never with the newer fp16 at limit 8."""
    from datetime import datetime, timedelta

    from bench.store import MismatchReport
    from conftest import add_model_and_build

    url = f"sqlite:///{tmp_path / 's.db'}"
    cond = {"engine": "torch", "limit": 100, "max_tokens": 64, "device": "cpu", "cpu_16bit": "none"}
    with session(open_store(url)) as s:
        model_id = add_model_and_build(s)
        s.add(Run(id="r", model_id=model_id, build_id="b0", algo="grpo", rollout_dtype="fp32", train_dtype="fp32",
                  trainer="native", engine="torch", config={}, status="max_steps"))
        for i, (dt, k3, changed) in enumerate([("bf16", 6e-3, {}), ("fp16", 2e-4, {}), ("fp16", 1e-6, {"limit": 8})]):
            s.add(MismatchReport(model_id=model_id, rollout_dtype=dt, train_dtype=dt, source="synthetic-hard", n=64,
                                 metrics={"kl_k3": k3}, plots={},
                                 created_at=datetime(2026, 1, 1) + timedelta(minutes=i), **{**cond, **changed}))
    at = page(url, "pages/mismatch.py")
    reports, ratios = at.dataframe[0].value, at.dataframe[1].value
    assert sorted(reports.limit) == [8, 100, 100] and {"engine", "max_tokens", "cpu_16bit"} <= set(reports.columns)
    assert list(ratios.ratio) == ["30×"] and "100 problems" in ratios.conditions[0]
