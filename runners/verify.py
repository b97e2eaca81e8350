"""`bench runs verify RUN [--steps N]`: re-run the first N steps of a stored (or imported) native
run from its build, config and seed, and compare every stored per-step metric, evaluation and
the step-0 calibration with the re-run (runners/verify_compare.py).

The re-run is the trainer's own path, `runners.runs._train` → `NativeTrainer` (calibration,
step-0 evaluation, the steps with their evaluations and checkpoints, exactly as `bench run`
starts a run), writing into a scratch SQLite store that holds a copy of the run's row: the run's
own rows are never touched, and a change to how the trainer seeds or evaluates is re-run as it
is. It stops once step N is recorded. The split is the build's kept problems as the store holds
them (`load_split`, so an imported build works; its split hash is checked), and the model must
be the one the run recorded (its weights hash).

Bit-identical is required on the device and CPU kind the run's provenance recorded (the device;
on a CPU the 16-bit kernel path `cpu_kernel_path()`, on a GPU its name; and BENCH_LOWP_MATMUL);
elsewhere, or when the provenance does not say, every number must lie within
verify_compare.TOLERANCE and the result says so. Every verification is stored
(run_verifications).

`--window A:B` re-runs steps A+1..B from the checkpoint the run kept at step A (`bench run
--keep-checkpoints K`, under its checkpoint directory's kept/, or `--checkpoint FILE`) instead of
from step 0: A must be an evaluation step (0, or one with a recorded state digest), the kept
checkpoint's state must hash to the run's digest at A (bench/statedigest.py: it is the run's own
state there, not a substitute), and the re-run's steps, evaluations and state digests of A+1..B
are compared with the stored ones — the digest at B with the chain. So the evaluations that
decided a verdict (bench/verification.py's deciding window) are re-computed at the cost of the
window, not of the run. Without a kept checkpoint only a window from step 0 can be re-run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select

from bench.statuses import BUILD_COMPLETE
from bench import provenance
from bench.errors import BenchError
from bench.device import resolve_device
from bench.engines import resolve_engine
from bench.models import ModelRef
from bench.kernels import cpu_kernel_path
from bench.precision import Precision
from bench.problem_ids import split_hash
from bench.store import Build, Eval, Model, Run, RunDigest, RunStep, RunVerification, open_store, session

from . import ledger
from . import verify_compare as vc
from .plan import RunError, config_from_dict, load_split, plan_of_run, resolve_inputs, trained_model
from .runs import _train

DEFAULT_STEPS = 3


class VerifyError(BenchError, ValueError):
    """A run that cannot be verified; the message says why."""


class _WindowDone(Exception):
    """Raised from the progress callback once the last step of the window is recorded."""


# ------------------------------------------------------------------ device and CPU kind

def machine_kind(device: str) -> dict:
    """The device and CPU kind a computation runs on here: device, device name on a GPU, the
    16-bit kernel path on a CPU, and BENCH_LOWP_MATMUL (it picks the 16-bit matmul kernels)."""
    on_gpu = str(device).startswith("cuda")
    name = None
    if on_gpu:
        import torch

        name = torch.cuda.get_device_name(torch.device(device))
    return {"device": device, "device_name": name, "cpu_16bit": None if on_gpu else cpu_kernel_path(),
            "lowp_matmul_mode": os.environ.get("BENCH_LOWP_MATMUL", "auto")}


def recorded_kind(provenance: dict | None) -> dict:
    """The same facts as the run's provenance recorded them (None where it did not)."""
    p = provenance or {}
    on_gpu = str(p.get("device", "")).startswith("cuda")
    return {"device": p.get("device"), "device_name": p.get("device_name") if on_gpu else None,
            "cpu_16bit": None if on_gpu else p.get("cpu_16bit"), "lowp_matmul_mode": p.get("lowp_matmul_mode")}


def same_kind(here: dict, recorded: dict) -> bool:
    """Whether bit-identical results are to be expected: every fact recorded and equal."""
    on_gpu = str(here["device"]).startswith("cuda")
    needed = ("device", "lowp_matmul_mode", "device_name" if on_gpu else "cpu_16bit")
    return all(recorded.get(k) is not None and recorded[k] == here[k] for k in needed)


def kind_text(kind: dict) -> str:
    """"cpu (16-bit path none)", "cuda:0 (NVIDIA H200)"; BENCH_LOWP_MATMUL when not auto."""
    extra = kind.get("device_name") if str(kind.get("device")).startswith("cuda") else (
        f"16-bit path {kind.get('cpu_16bit') or 'not recorded'}")
    lowp = kind.get("lowp_matmul_mode")
    return f"{kind.get('device') or 'an unrecorded device'} ({extra}" + (
        f", BENCH_LOWP_MATMUL={lowp})" if lowp not in ("auto", None) else ")")


# ------------------------------------------------------------------ the stored side

def _window(s, run_id: str, last_step: int, calibration: dict | None) -> vc.Window:
    steps = s.scalars(select(RunStep).where(RunStep.run_id == run_id, RunStep.step <= last_step)).all()
    evals = s.scalars(select(Eval).where(Eval.run_id == run_id, Eval.step <= last_step)).all()
    digests = s.scalars(select(RunDigest).where(RunDigest.run_id == run_id, RunDigest.step <= last_step)).all()
    return vc.Window(calibration=calibration,
                     steps={x.step: vc.step_values({c: getattr(x, c) for c in RunStep.COLUMNS}, x.metrics)
                            for x in steps},
                     evals={(e.step, e.benchmark): (e.n, e.score) for e in evals},
                     digests={d.step: d.digest for d in digests}, schemes={d.step: d.scheme for d in digests})


def parse_window(text: str) -> tuple[int, int]:
    """`A:B` → (A, B), 0 ≤ A < B; VerifyError otherwise."""
    a, sep, b = text.partition(":")
    if not sep or not a.strip().isdigit() or not b.strip().isdigit() or int(a) >= int(b):
        raise VerifyError(f"--window {text!r}: write A:B with 0 <= A < B (re-run steps A+1..B), e.g. 40:55")
    return int(a), int(b)


def _kept(s, run: Run, start: int, checkpoint: Path | None) -> Path:
    """The checkpoint of step `start` (kept by the run, or given), checked against the run's
    state digest there; VerifyError when there is none or it is not the run's state."""
    from bench.statedigest import check_chain, checkpoint_digest, checkpoint_keys, kept_checkpoint

    row = s.get(RunDigest, (run.id, start))
    if row is None:
        raise VerifyError(f"run {run.id} recorded no state digest at step {start}: a window starts at 0 or at one of "
                          "its evaluation steps (runs from before state digests can only be re-run from step 0)")
    rows = s.scalars(select(RunDigest).where(RunDigest.run_id == run.id).order_by(RunDigest.step))
    chain = [(d.step, d.digest, d.chain, d.scheme) for d in rows]
    broken = check_chain(run.id, chain)
    if broken:
        raise VerifyError(f"run {run.id}'s state digests do not chain ({broken}): its record was edited")
    path = Path(checkpoint) if checkpoint else (kept_checkpoint(Path(run.checkpoint_dir), start)
                                                if run.checkpoint_dir else None)
    if path is None or not path.is_file():
        raise VerifyError(f"run {run.id} kept no checkpoint of step {start}" + (f" ({path})" if path else "")
                          + ": start the window at 0, give --checkpoint FILE, or run with --keep-checkpoints K")
    import torch

    try:           # weights only: a checkpoint from a bundle is untrusted input, and a pickle can run code
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        raise VerifyError(f"{path} is not a checkpoint bench loads (tensors, numbers and containers only): "
                          f"{str(e).splitlines()[0][:200]}") from None
    needed = checkpoint_keys(row.scheme)        # a checkpoint of a scheme-1 run also holds the RNG states it hashed
    if not isinstance(state, dict) or not needed <= set(state):
        raise VerifyError(f"{path} is not a bench checkpoint (it needs {', '.join(sorted(needed))})")
    digest = checkpoint_digest(state, row.scheme)
    if state.get("step") != start or digest != row.digest:
        raise VerifyError(f"{path} is not run {run.id}'s state at step {start}: its state digest {digest[:12]}… "
                          f"(step {state.get('step')}) is not the recorded {row.digest[:12]}…")
    return path


def _inputs(s, run_id: str, steps: int, start: int = 0, checkpoint: Path | None = None):
    """Everything the re-run needs from the store, each refusal one VerifyError."""
    if steps < 1:
        raise VerifyError(f"--steps {steps}: give at least 1")
    run = s.get(Run, run_id)
    if run is None:
        raise VerifyError(f"no run {run_id!r}; `bench runs` lists them")
    if run.trainer != "native":
        raise VerifyError(f"run {run_id} was trained by {run.trainer}: its steps came from {run.trainer}'s own "
                          "trainer, rollout engine and seeding, which bench cannot re-run natively, so it cannot "
                          "be verified here (verify re-runs native runs only)")
    try:
        build, _, ref = resolve_inputs(s, run.build_id, None)
        resolve_engine(run.engine)
    except (RunError, ValueError) as e:
        raise VerifyError(f"run {run_id}: {e}") from None
    try:
        config_from_dict(run.config)
    except (TypeError, KeyError) as e:
        raise VerifyError(f"run {run_id}'s config cannot be read by this bench ({e}): re-run it with the bench "
                          "that made it (its provenance names the commit)") from None
    try:
        ref = trained_model(s, run, build, ref)
    except RunError as e:
        raise VerifyError(f"{e}, so its steps cannot be re-run") from None
    model = s.get(Model, run.model_id)
    split = load_split(s, build.id)
    if not split:
        raise VerifyError(f"run {run_id}: build {build.id} holds no kept problems in this store")
    if build.split_hash and split_hash((p.id, p.answer) for p in split) != build.split_hash:
        raise VerifyError(f"run {run_id}: build {build.id}'s kept problems do not hash to its split hash "
                          f"{build.split_hash[:12]}…")
    highest = s.scalar(select(func.max(RunStep.step)).where(RunStep.run_id == run_id)) or 0
    last = min(steps, max(run.step, highest))        # a row claiming fewer steps than it stores hides none
    if start and start >= last:
        raise VerifyError(f"--window {start}:{steps}: run {run_id} stored {last} step(s), none after step {start}")
    if checkpoint is not None and not start:
        raise VerifyError("--checkpoint is the state a window A:B starts from (A > 0): give --window A:B too")
    kept = _kept(s, run, start, checkpoint) if start else None
    stored = _window(s, run_id, last, run.calibration)
    return run, build, model, ref, split, last, stored, kept


# ------------------------------------------------------------------ the re-run

def _copy_rows(scratch, run: Run, build: Build, model: Model, ckpt_dir: Path, source=None, start: int = 0) -> None:
    """The run's row (reset to its start), its build and model in the scratch store; from a kept
    checkpoint at `start`, also its steps, evaluations and digests up to `start` (read from the
    `source` session), as a resume finds them."""
    with session(scratch) as s:
        s.add(Model(id=model.id, name=model.name, path=model.path, weights_hash=model.weights_hash))
        s.flush()
        s.add(Build(id=build.id, model_id=model.id, source=build.source, engine=build.engine, dtype=build.dtype,
                    k=build.k, lo=build.lo, hi=build.hi, seed=build.seed, shard=None,
                    settings_hash=build.settings_hash, status=BUILD_COMPLETE, split_hash=build.split_hash))
        s.flush()
        ledger.create(s, run.id, model.id, build.id, run.algo, Precision(run.rollout_dtype, run.train_dtype), "native",
                      run.engine, run.config, ckpt_dir, run.provenance, seed=run.seed, staleness=run.staleness,
                      calibration=run.calibration if start else None)
        if start:
            s.flush()
            for table in (RunStep, Eval, RunDigest):
                for row in source.scalars(select(table).where(table.run_id == run.id, table.step <= start)):
                    s.merge(_clone(row))


def _clone(row):
    """A detached copy of a stored row (its columns), for another session."""
    table = type(row)
    return table(**{c.key: getattr(row, c.key) for c in table.__table__.columns})


def replay(source, run: Run, build: Build, model: Model, ref, split, last_step: int, device: str,
           progress=None, kept: Path | None = None, start: int = 0) -> vc.Window:
    """Re-run the run's steps 1..last_step (with its calibration and step-0 evaluation), or from
    the checkpoint `kept` at `start` its steps start+1..last_step, through the trainer's own path
    (a resume) into a scratch store; the re-run window."""
    stop_at = max(last_step, 1)

    def until_window(step, total, metrics):
        if progress:
            progress(step, stop_at, metrics)
        if step >= stop_at:
            raise _WindowDone

    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        scratch = open_store(f"sqlite:///{Path(tmp) / 'verify.db'}")
        ckpt_dir = Path(tmp) / "checkpoints"
        ckpt_dir.mkdir()
        if kept is not None:
            shutil.copyfile(kept, ckpt_dir / "checkpoint.pt")
        with session(source) as src:
            _copy_rows(scratch, run, build, model, ckpt_dir, src, start)
            plan = plan_of_run(src, src.get(Run, run.id), device, (model, ref))
        try:
            _train(scratch, run.id, plan, split, ckpt_dir, until_window)
        except _WindowDone:
            pass
        with session(scratch) as s:
            window = _window(s, run.id, last_step, s.get(Run, run.id).calibration)
        scratch.dispose()
    return window


# ------------------------------------------------------------------ entry points

@dataclass
class RerunPlan:
    """A verification ready to run: the run's rows, its model and split, the window, the stored
    side, where it re-runs and whether bit-identical is required there."""

    run: Run
    build: Build
    model: Model
    ref: ModelRef
    split: list
    last_step: int
    requested: int
    start: int
    kept: Path | None
    stored: vc.Window
    here: dict
    recorded: dict
    exact: bool
    bench_recorded: str | None      # the commit of bench that made the run, and the one re-running it
    bench_here: str | None


def plan_verification(store, run_id: str, steps: int = DEFAULT_STEPS, device: str | None = None, start: int = 0,
                      checkpoint: Path | None = None) -> RerunPlan:
    """Every check before the re-run (VerifyError, nothing stored): a native run, its build and
    split, the model by its weights hash, the device (default: the one the run recorded); for a
    window from `start` > 0 the kept checkpoint, checked against the run's state digest."""
    with session(store) as s:
        run, build, model, ref, split, last, stored, kept = _inputs(s, run_id, steps, start, checkpoint)
    recorded = recorded_kind(run.provenance)
    want = device or recorded["device"] or "cpu"
    try:
        device = resolve_device(want)
    except ValueError as e:
        raise VerifyError(f"run {run_id} ran on {want}: {e}") from None
    here = machine_kind(device)
    return RerunPlan(run, build, model, ref, split, last, steps, start, kept, stored, here, recorded,
                same_kind(here, recorded),
                ((run.provenance or {}).get("bench") or {}).get("commit"), provenance.git_commit()["commit"])


def run_verification(store, plan: RerunPlan, progress=None) -> dict:
    """Re-run the plan's window, compare, store the verification; returns it (see the module
    docstring): the verdict, values compared and differing, the first difference, where it ran,
    what the run recorded and the tolerance applied (None: bit-identical was required)."""
    tolerance = None if plan.exact else vc.TOLERANCE
    replayed = replay(store, plan.run, plan.build, plan.model, plan.ref, plan.split, plan.last_step,
                      plan.here["device"], progress, plan.kept, plan.start)
    result = vc.compare(plan.stored, replayed, plan.last_step, tolerance, plan.start)
    first = _jsonable(result["first_difference"])
    text = None if plan.exact else vc.TOLERANCE_TEXT
    with session(store) as s:
        v = RunVerification(run_id=plan.run.id, device=plan.here["device"], device_name=plan.here["device_name"],
                            cpu_16bit=plan.here["cpu_16bit"], steps=plan.last_step, compared=result["compared"],
                            differences=result["differences"], verdict=result["verdict"], tolerance=text,
                            first_difference=first, bench_commit=plan.bench_here, window_start=plan.start,
                            digests=result["digests"])
        s.add(v)
        s.flush()
        vid, when = v.id, v.created_at
    return {"run": plan.run.id, "verification": vid, "created_at": when.isoformat(), "steps": plan.last_step,
            "window_start": plan.start, "requested_steps": plan.requested, "here": plan.here, "recorded": plan.recorded,
            "same_kind": plan.exact, "tolerance": text, "bench_recorded": plan.bench_recorded,
            "bench_here": plan.bench_here, **result, "first_difference": first}


def _jsonable(d: dict | None) -> dict | None:
    """A difference whose values are JSON (floats, ints, strings, None) as stored."""
    if d is None:
        return None
    return {k: (v if v is None or isinstance(v, (int, float, str, bool)) else repr(v)) for k, v in d.items()}
