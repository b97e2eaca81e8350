"""The sweep's parts, each alone (runners/sweep.py, runners/cell_process.py): the grid planned
before any cell runs (`plan_grid`), a cell decided by its first failing seed (`SeedDecider`),
and a cell in a process of its own (`CellProcess`: a real spawned process)."""

from pathlib import Path

import pytest

from bench.errors import ConfigError
from bench.precision import Precision
from bench.store import open_store, session
from conftest import add_model_and_build
from bench.models import resolve_model
from runners.cell_process import CellProcess
from runners.plan import RunPlan
from runners.presets import get_preset
from runners.sweep import Cell, SeedDecider, plan_grid
from runners.verl_launch import VerlTarget
from runners.verl_runner import VerlError

FP32, FP16 = Precision("fp32", "fp32"), Precision("fp16", "fp16")


@pytest.fixture
def store(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    with session(store) as s:
        add_model_and_build(s, "b0")
    return store


class Handle:
    """A running seed's handle as SeedDecider sees it: something it may interrupt."""

    def __init__(self):
        self.interrupts = 0

    def interrupt(self):
        self.interrupts += 1


def test_plan_grid_orders_the_cells_and_gives_each_its_overrides(store):
    grid, cells = plan_grid(store, ["grpo", "gspo"], [FP32, FP16], None, "torch", "tiny", {"lr": 5e-4},
                            seeds=[0, 3], staleness=[0, 2])
    assert grid.build_id == "b0" and grid.trainer == "native" and grid.default_k == 0
    assert len(cells) == 2 * 2 * 2 * 2
    assert cells[:3] == [Cell("grpo", FP32, 0, 0), Cell("grpo", FP32, 0, 3), Cell("grpo", FP32, 2, 0)]
    c = Cell("gspo", FP16, 2, 3)
    assert c.label == "gspo fp16 K=2 seed 3" and c.key == ("gspo", FP16, 2)
    assert grid.args(c) == {"lr": 5e-4, "seed": 3, "staleness": 2} and grid.k(c) == 2
    assert grid.config(c)["seed"] == 3 and grid.config(c)["preset"] == "tiny"
    assert grid.fingerprint(c) == grid.fingerprint(Cell("gspo", FP16, 2, 0))        # every setting but the seed
    assert Cell("grpo", FP32).label == "grpo fp32" and grid.k(Cell("grpo", FP32)) == 0


@pytest.mark.parametrize("kw, needle", [
    (dict(seeds=[0, 1], overrides={"seed": 2}), "either a seed or seeds"),
    (dict(staleness=[0, 1], overrides={"staleness": 1}), "either a staleness or a staleness axis"),
    (dict(build_id="nope"), "no build 'nope'"),
])
def test_plan_grid_refuses_grid_wide_input(store, kw, needle):
    args = dict(algos=["grpo"], pairs=[FP32], build_id=None, engine="torch", preset="tiny", overrides={}) | kw
    with pytest.raises(Exception, match=needle):
        plan_grid(store, **args)


def test_plan_grid_refuses_what_verl_cannot_run_before_any_cell(store):
    with pytest.raises(VerlError, match="pg-seq-mis runs on the native trainer only"):
        plan_grid(store, ["grpo", "pg-seq-mis"], [FP32], None, "torch", "tiny", {}, verl=VerlTarget())
    with pytest.raises(VerlError):
        plan_grid(store, ["grpo"], [FP32], None, "torch", "tiny", {}, staleness=[0, 2], verl=VerlTarget())
    grid, _ = plan_grid(store, ["grpo"], [FP32], None, "torch", "tiny", {}, verl=VerlTarget("py", 8, 2))
    assert grid.trainer == "verl" and grid.recorded_engine == "vllm" and grid.verl.gpus == 8


def test_no_build_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no build yet"):
        plan_grid(open_store(f"sqlite:///{tmp_path / 'e.db'}"), ["grpo"], [FP32], None, "torch", "tiny", {})


def test_the_first_failing_seed_decides_its_cell_and_interrupts_its_running_seeds():
    d = SeedDecider(True)
    key, other = ("grpo", FP32, None), ("gspo", FP32, None)
    a, b, c = Handle(), Handle(), Handle()
    d.started(key, a)
    d.started(key, b)
    d.started(other, c)
    d.ended(key, b)                                     # b ended before the verdict: not interrupted
    assert d.why(key) is None
    assert d.decide(key, "seed 0 ended futile (run r0)") is True
    assert (a.interrupts, b.interrupts, c.interrupts) == (1, 0, 0)
    assert d.decide(key, "seed 1 ended collapsed") is False        # the first reason stands
    assert d.why(key) == "seed 0 ended futile (run r0)" and d.why(other) is None
    late = Handle()
    d.started(key, late)                                # launched while the cell was being decided
    assert late.interrupts == 1


def test_a_decider_that_is_off_decides_nothing():
    d = SeedDecider(False)
    h = Handle()
    d.started(("grpo", FP32, None), h)
    assert d.decide(("grpo", FP32, None), "seed 0 ended futile") is False
    assert d.why(("grpo", FP32, None)) is None and h.interrupts == 0


@pytest.mark.slow
def test_a_process_cell_reports_its_refusal(tmp_path):
    """A real spawned cell given a plan (made in this process, as the sweep makes it) whose
    checkpoint root cannot hold a directory: the run's own refusal comes back as the cell's end,
    no run id, no step."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    with session(store) as s:
        add_model_and_build(s, "b0")
    store.dispose()
    (tmp_path / "a-file").write_text("")
    plan = RunPlan("grpo", FP32, get_preset("tiny"), "b0", 1, resolve_model("tiny-math"), "torch", "cpu", "tiny",
                   tmp_path / "a-file")
    steps = []
    proc = CellProcess(url, plan)
    end = proc.follow(lambda *a: steps.append(a))
    assert end.run_id is None and not end.interrupted and "is not writable" in end.error, end
    assert end.error.endswith(f"(its output: {proc.log_path})")
    assert steps == [] and "RunError: checkpoint directory" in Path(proc.log_path).read_text()   # the traceback, kept
    Path(proc.log_path).unlink()


def test_cell_runs_tells_cells_apart_by_every_column_of_the_cell_key(tmp_path):
    """runners/sweep.py `cell_runs` and the leaderboard share bench/fingerprint.py CELL_KEY: a run that
    differs from the cell in any one column of it (the model through its build) is not the cell's."""
    from dataclasses import asdict

    from bench.fingerprint import CELL_KEY, fingerprint
    from bench.precision import Precision
    from bench.statuses import FINISHED
    from bench.store import Build, Model, Run, open_store, session
    from conftest import add_model_and_build
    from runners.presets import get_preset
    from runners.sweep import cell_runs

    cfg = {"preset": "tiny", **asdict(get_preset("tiny"))}
    base = dict(build_id="b0", algo="grpo", rollout_dtype="fp16", train_dtype="fp16", trainer="native",
                engine="torch", staleness=0, config=cfg, status="converged", seed=0)
    differs = {"model": {"build_id": "m2"}, "build": {"build_id": "b1"}, "algo": {"algo": "gspo"},
               "precision": {"rollout_dtype": "bf16"}, "trainer": {"trainer": "verl"}, "engine": {"engine": "vllm"},
               "staleness": {"staleness": 2}, "config_fp": {"config": {**cfg, "lr": 1e-2}}}
    assert set(differs) == set(CELL_KEY)
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    with session(store) as s:
        model_id = add_model_and_build(s)
        other = Model(name="tiny-math-moe", path="/y", weights_hash="h3")
        s.add(other)
        s.flush()
        for bid, mid in (("b1", model_id), ("m2", other.id)):       # another build of the model; another model's
            s.add(Build(id=bid, model_id=mid, source="synthetic", engine="torch", dtype="fp32", k=8, lo=0.2, hi=0.8,
                        seed=0, settings_hash="h2", status="complete", n_problems=10, n_kept=5))
        s.add(Run(id="same", model_id=model_id, **base))
        for key, change in differs.items():
            s.add(Run(id=key, model_id=other.id if key == "model" else model_id, **{**base, **change}))
    with session(store) as s:
        found = cell_runs(s, "b0", "grpo", Precision("fp16", "fp16"), "native", 0, "torch", fingerprint(cfg), FINISHED)
        assert [r.id for r in found] == ["same"]
