"""The native entry points. A run's rows are written by runners/ledger.py alone, the same way
for the native trainer and the verl runner (runners/verl_follow.py); `run_plan`, `resume_run` and
`extend_run` create, continue and end a native run (its row, checkpoint directory and
provenance) around `NativeTrainer` (runners/trainer.py), from a plan (runners/plan.py) checked
once before anything is written."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from pathlib import Path

from bench import provenance
from bench.model_sources import gguf_provenance
from bench.models import prompt_settings
from bench.precision import Precision
from bench.statuses import EXTENDABLE, RESUMABLE, verdict
from bench.store import Run, bench_home, session

from . import ledger
from .plan import RunError, RunPlan, load_split, plan_of_run, plan_run, resumable_run
from .presets import PRESETS, RunConfig, preset_defaults


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
    """Plan a new run (`plan_run`: every input checked) and train it (`run_plan`); returns the
    run id. `device`: auto, cpu or cuda[:i] (bench/device.py), kept in the run's provenance."""
    plan = plan_run(store, algo, precision, cfg, build_id, model, engine, device, preset, ckpt_root)
    return run_plan(store, plan, progress, rollout_engine)


def run_plan(store, plan: RunPlan, progress=None, rollout_engine=None, log=None) -> str:
    """Create the planned run's row and checkpoint directory, train it to its end; the run id.
    `progress(step, total, metrics)` is called after every step; `rollout_engine`: a running
    engine of the rollout format to use instead of starting one (tests share one vLLM). A plan
    for verl (`plan.verl`) is launched there and followed (runners/verl_launch.py; `log` hears
    where verl's log is)."""
    if plan.verl is not None:
        from .verl_launch import run_verl_plan

        return run_verl_plan(store, plan, progress, log)
    cfg = plan.cfg
    with session(store) as s:
        split = load_split(s, plan.build_id)
    run_id = uuid.uuid4().hex[:12]
    ckpt_dir = Path(plan.ckpt_root or bench_home() / "runs") / run_id
    _check_ckpt_dir(ckpt_dir)
    facts = provenance.collect(plan.device, plan.precision.train,
                               split_accuracy_estimator=SPLIT_ESTIMATOR.format(m=cfg.eval_split_m),
                               preset_defaults=preset_defaults(plan.preset) if plan.preset in PRESETS else None,
                               prompt=prompt_settings(plan.model), model_source=gguf_provenance(plan.model.path))

    def create() -> None:                # under run_to_end, so an interrupt as it commits is recorded
        with session(store) as s:
            ledger.create(s, run_id, plan.model_id, plan.build_id, plan.algo, plan.precision, "native", plan.engine,
                          {"preset": plan.preset, **asdict(cfg)}, ckpt_dir, facts)
    _train(store, run_id, plan, split, ckpt_dir, progress, rollout_engine, create=create)
    return run_id


def resume_run(store, run_id: str, progress=None, device: str | None = None, replay_stop_rules: bool = False) -> str:
    """Continue a killed or failed run from its last checkpoint, on `device` (default: the
    device it started on; a resume elsewhere is appended to its provenance's `resumes`).
    `replay_stop_rules`: recompute the stop rules' state under the stored config (`extend_run`)."""
    with session(store) as s:
        run = resumable_run(s, run_id)
        plan = plan_of_run(s, run, device)
        split = load_split(s, plan.build_id)
        ckpt_dir = Path(run.checkpoint_dir)
        if plan.device != (run.provenance or {}).get("device", "cpu"):
            ledger.note(run, "resumes", step=run.step, device=plan.device)
    _check_ckpt_dir(ckpt_dir)
    _train(store, run_id, plan, split, ckpt_dir, progress, replay_stop_rules=replay_stop_rules)
    return run_id


def extend_run(store, run_id: str, max_steps: int, progress=None, device: str | None = None) -> str:
    """Continue a run that reached its budget undecided (`max_steps`, UNDECIDED) under the larger
    budget `max_steps`, from its last checkpoint: its stored config gets the new max_steps, its
    stop rules' state is recomputed under it (the futility rule projects to max_steps; its upper
    bound only rises with the horizon, so no earlier step would have decided), and it trains on as
    a run started with that budget would, bit for bit on the same device and CPU kind. The
    extension is appended to the run's provenance (`extends`). The run becomes a run with the new
    budget: another settings fingerprint, so another cell than its siblings at the old one."""
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
        cfg = plan_of_run(s, run, device).cfg           # refused here, before anything is written
        if max_steps <= cfg.max_steps:
            raise RunError(f"--max-steps {max_steps} is not above run {run_id}'s budget of {cfg.max_steps}")
        if cfg.max_steps % cfg.eval_every:
            raise RunError(f"run {run_id}'s budget max_steps={cfg.max_steps} is not a multiple of eval_every="
                           f"{cfg.eval_every}: its last evaluation (step {cfg.max_steps}) is one a run with a larger "
                           "budget would not make, so the extension could not equal such a run; start a run with "
                           f"--max-steps {max_steps} instead")
        if not Path(run.checkpoint_dir or "").exists():
            raise RunError(f"run {run_id} has no checkpoint directory here ({run.checkpoint_dir}): it cannot be "
                           "continued on this machine")
        ledger.extend(run, max_steps, cfg.max_steps)
    return resume_run(store, run_id, progress=progress, device=device, replay_stop_rules=True)


def _train(store, run_id: str, plan: RunPlan, split, ckpt_dir: Path, progress=None, rollout_engine=None,
           replay_stop_rules: bool = False, create=None) -> None:
    def fit() -> tuple[str, str]:
        from .trainer import NativeTrainer  # here: torch and the engines (which verl's runner does not need),
        trainer = None                      # imported under run_to_end, so an interrupt meanwhile is recorded
        try:
            trainer = NativeTrainer(store, run_id, plan, split, ckpt_dir, progress, rollout_engine)
            trainer.load_checkpoint()
            if replay_stop_rules:
                trainer.replay_stop_rules()
            return trainer.fit()
        finally:
            if trainer is not None:
                trainer.close()

    ledger.run_to_end(store, run_id, fit, create)
