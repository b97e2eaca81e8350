"""A run planned once (runners/plan.py): `plan_run` resolves `auto` and checks every input of a
new run before anything is written; `plan_of_run` gives a stored run's plan (resume, extend,
verify)."""

from dataclasses import asdict, replace

import pytest
import torch
from sqlalchemy import func, select

from bench.device import DeviceError
from bench.errors import ConfigError
from bench.precision import Precision
from bench.store import Run, open_store, session
from bench.store.schema import BuildProblem
from conftest import add_model_and_build
from runners.plan import RunError, RunPlan, config_from_dict, plan_of_run, plan_run
from runners.presets import get_preset
from runners.verl_runner import VerlError, VerlTarget

FP32 = Precision("fp32", "fp32")


MODEL_ID = {}


@pytest.fixture
def store(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    with session(store) as s:
        MODEL_ID["tiny-math"] = add_model_and_build(s, "b0")
        for i in range(3):
            s.add(BuildProblem(build_id="b0", problem_id=f"p{i}", position=i, problem=f"{i}+1", answer=str(i + 1),
                               n_samples=8, n_correct=4, accuracy=0.5, bucket="kept", kept=True))
    return store


def _runs(store) -> int:
    with session(store) as s:
        return s.scalar(select(func.count()).select_from(Run))


def test_plan_run_resolves_auto_and_names_the_build_and_model(store, monkeypatch):
    import bench.engines

    monkeypatch.setattr(bench.engines, "vllm_available", lambda: False)
    plan = plan_run(store, "grpo", FP32, get_preset("tiny"), engine="auto", device="auto", preset="tiny")
    assert isinstance(plan, RunPlan)
    assert (plan.algo, plan.precision, plan.build_id, plan.engine, plan.preset) == ("grpo", FP32, "b0", "torch",
                                                                                    "tiny")
    assert plan.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert (plan.model.name, plan.model_id, plan.ckpt_root) == ("tiny-math", MODEL_ID["tiny-math"], None)
    assert _runs(store) == 0                                        # planning writes nothing


@pytest.mark.parametrize("change, error, needle", [
    (dict(algo="grpoo"), ConfigError, "did you mean 'grpo'"),
    (dict(cfg=replace(get_preset("tiny"), samples_per_prompt=1)), ConfigError, "--samples-per-prompt must be >= 2"),
    (dict(cfg=replace(get_preset("tiny"), temperature=0.7)), ConfigError, "temperature 1 and top-p 1 only"),
    (dict(build_id="nope"), RunError, "no build 'nope'"),
    (dict(model="other"), RunError, "no build yet for model 'other'"),
    (dict(cfg=replace(get_preset("tiny"), router_replay=True)), RunError, "needs a mixture-of-experts model"),
    (dict(device="cuda:64"), DeviceError, "cuda"),
])
def test_plan_run_refuses_bad_input_before_anything_is_written(store, change, error, needle):
    args = dict(algo="grpo", precision=FP32, cfg=get_preset("tiny"), build_id=None, model=None, engine="torch",
                device="cpu") | change
    with pytest.raises(error) as e:
        plan_run(store, **args)
    assert needle in str(e.value), str(e.value)
    assert _runs(store) == 0


def test_the_cascade_attention_is_the_built_in_engines(store, monkeypatch):
    import bench.engines

    monkeypatch.setattr(bench.engines, "vllm_available", lambda: True)
    cfg = replace(get_preset("tiny"), cascade_attention=True)
    with pytest.raises(RunError, match="--cascade-attention is the built-in engine's"):
        plan_run(store, "grpo", FP32, cfg, engine="vllm", device="cpu")
    with pytest.raises(VerlError, match="verl rolls out with vLLM"):
        plan_run(store, "grpo", FP32, cfg, verl=VerlTarget())
    assert plan_run(store, "grpo", FP32, cfg, engine="torch", device="cpu").cfg.cascade_attention
    assert _runs(store) == 0


def test_a_build_that_kept_nothing_is_refused(store):
    with session(store) as s:
        for bp in s.scalars(select(BuildProblem)):
            bp.kept = False
    with pytest.raises(RunError, match="build b0 kept no problems"):
        plan_run(store, "grpo", FP32, get_preset("tiny"))


def test_plan_of_run_reads_the_stored_run(store):
    from dataclasses import asdict

    cfg = get_preset("tiny", lr=5e-4)
    with session(store) as s:
        s.add(Run(id="r1", model_id=MODEL_ID["tiny-math"], build_id="b0", algo="gspo", rollout_dtype="fp16",
                  train_dtype="fp32", trainer="native", engine="torch", config={"preset": "paper", **asdict(cfg)},
                  status="failed", provenance={"device": "cpu"}))
    with session(store) as s:
        plan = plan_of_run(s, s.get(Run, "r1"))
    assert (plan.algo, plan.precision, plan.build_id, plan.engine, plan.device, plan.preset) == (
        "gspo", Precision("fp16", "fp32"), "b0", "torch", "cpu", "paper")
    assert plan.cfg == cfg


def test_a_stored_config_from_before_group_by_length_keeps_one_padded_batch():
    """A run stored before `group_by_length` existed resumes and re-verifies with its old
    arithmetic (one padded batch); a stored value is kept; a new run takes today's default."""
    stored = asdict(get_preset("tiny"))
    assert stored.pop("group_by_length") is True
    assert config_from_dict(stored).group_by_length is False
    assert config_from_dict({**stored, "group_by_length": True}).group_by_length is True
