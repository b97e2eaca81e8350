"""Launching and following a verl run: bench starts `python -m verl.trainer.main_ppo` in its own
process group, tails the JSONL that verl's `file` logger writes (`$VERL_FILE_LOGGER_PATH`,
one `{"step": N, "data": {...}}` per line), writes every step into the store under bench's
metric names (`verl_runner.METRIC_MAP`), applies bench's stop rules and stops verl when one
fires. Resuming relaunches the same command: `trainer.resume_mode=auto` continues from verl's
latest checkpoint under `trainer.default_local_dir`.

Split accuracy for verl runs is the training reward over the last pass over the split
(`ceil(split / prompts_per_step)` steps): verl evaluates only its validation sets, and the
sanity test's quantity is accuracy on the split's problems under the current policy. The stop
rule's pooled bound counts each graded sample once (`Follower.pooled`): evaluations more often
than the pass is long share their steps.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import statuses
from bench.store import Run, session

from bench import stop as stop_rules
from . import ledger, verl_reward
from .presets import PRESETS, RunConfig, preset_defaults
from .verl_runner import VerlJob, VerlTarget, export_parquet, map_metrics, verl_command


@dataclass
class VerlLaunch:
    """One verl run's launch as its run row keeps it (`runs.config["verl"]`) to launch and relaunch
    verl: the run's id and directory, the command (argv after the interpreter's `-m main_ppo`,
    env), what it trains (build, model, split size) and where (`target`: interpreter, GPUs, nodes)."""

    run_id: str
    root: str
    argv: list[str]
    env: dict[str, str]
    build_id: str
    model_id: int
    split_size: int
    target: VerlTarget

    def to_config(self) -> dict:
        return asdict(self)

    @classmethod
    def from_config(cls, d: dict) -> "VerlLaunch":
        """A stored run's launch. One stored before the target was a field has none: its interpreter
        is the command's first word, its GPUs and nodes the command's `trainer.n_gpus_per_node` and
        `trainer.nnodes`."""
        d = dict(d)
        target = d.pop("target", None)
        if target is None:
            opts = dict(a.split("=", 1) for a in d["argv"] if a.startswith("trainer.n"))
            target = {"python": d["argv"][0], "gpus": int(opts.get("trainer.n_gpus_per_node", 1)),
                      "nodes": int(opts.get("trainer.nnodes", 1))}
        return cls(**d, target=VerlTarget(**target))


class MetricsTail:
    """New complete lines of verl's metrics file since the last read. verl opens the file
    "wb" on every (re)start, so a file shorter than what was read means start over."""

    def __init__(self, path: Path):
        self.path, self.pos = Path(path), 0

    def read(self) -> list[tuple[int, dict]]:
        if not self.path.exists():
            return []
        if self.path.stat().st_size < self.pos:
            self.pos = 0
        with self.path.open("rb") as f:
            f.seek(self.pos)
            data = f.read()
        end = data.rfind(b"\n") + 1                  # a line still being written waits
        self.pos += end
        rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        return [(int(r["step"]), r["data"]) for r in rows]


def _val_key(key: str) -> tuple[str, str] | None:
    """`val-core/<data_source>/acc/mean@<n>` → (data_source, n)."""
    if key.startswith("val-core/") and "/acc/mean@" in key:
        src, n = key[len("val-core/"):].rsplit("/acc/mean@", 1)
        return (src, n) if n.isdigit() else None
    return None


def _finite(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


SPLIT_ESTIMATOR = ("verl's training reward over the last pass over the split (ceil(split / B) steps of "
                   "B x G rollouts, each graded once, the policy moving between steps)")


@dataclass
class Follower:
    """Turns verl's per-step metrics into bench's steps, evals and stop decisions."""

    store: object
    run_id: str
    cfg: RunConfig
    split_size: int
    state: stop_rules.StopState = field(default_factory=stop_rules.StopState)
    wall: float = 0.0
    rewards: deque = field(init=False)      # the training rewards of the last pass over the split
    calibrated: bool = False                # the step-1 calibration gate has run (or the run has one)
    history: list = field(default_factory=list)     # every step's training reward, in order
    eval_ends: list = field(default_factory=list)   # len(history) at each split evaluation

    def __post_init__(self):
        self.rewards = deque(maxlen=max(1, math.ceil(self.split_size / self.cfg.prompts_per_step)))

    @property
    def split_n(self) -> int:
        """Graded responses behind the split accuracy: the last pass's B × G per step."""
        return len(self.rewards) * self.cfg.prompts_per_step * self.cfg.samples_per_prompt

    def pooled(self) -> tuple[float, int]:
        """(accuracy, n) of the last `hold` split evaluations together, over their distinct graded
        samples: the mean training reward of the distinct steps of their windows (`pooled_steps`;
        every step grades B × G responses) and n = those steps × B × G. Each step counts once
        however many windows hold it, so n is not overstated when evaluations come more often
        than the window is long."""
        steps = stop_rules.pooled_steps(self.eval_ends[-self.cfg.stop.hold:], self.rewards.maxlen)
        if not steps:
            return 0.0, 0
        acc = sum(self.history[i] for i in steps) / len(steps)
        return acc, len(steps) * self.cfg.prompts_per_step * self.cfg.samples_per_prompt

    def track(self, step: int, m: dict, split_acc: float | None = None, may_eval: bool = True):
        """Feed one training step's (bench-named) metrics to the stop rules; returns a verdict.
        The split accuracy is computed when an evaluation is due (and `may_eval`), or given
        (a step replayed from the store)."""
        if m.get("reward") is not None:
            self.rewards.append(m["reward"])
            self.history.append(m["reward"])
        kl = _finite(m.get("kl_k3"))
        kl = _finite(m.get("bypass/kl_k3")) if kl is None else kl          # bypass cells log only that
        if kl is not None and stop_rules.after_step(self.state, self.cfg.stop, step, kl):
            m["kl_warning"] = 1.0
        due = step % self.cfg.eval_every == 0 or step >= self.cfg.max_steps
        if split_acc is None and may_eval and due and len(self.rewards) == self.rewards.maxlen:
            split_acc = m["eval/split"] = sum(self.rewards) / len(self.rewards)
        if split_acc is None:
            return None
        self.eval_ends.append(len(self.history))
        return stop_rules.after_eval(self.state, self.cfg.stop, step, split_acc, self.split_n, pooled=self.pooled())

    def ingest(self, step: int, data: dict) -> tuple[str, str] | None:
        """One log line; returns (status, reason) when a stop rule fires."""
        m = map_metrics(data)
        verdict = None
        self.wall += _finite(data.get("timing_s/step")) or 0.0
        if step > 0 and not self.calibrated:
            verdict = self.calibrate(step, m)
        if step > 0 and verdict is None:
            if "actor/pg_loss" in data and _finite(data["actor/pg_loss"]) is None:
                self.track(step, m, may_eval=False)
                verdict = (statuses.DIVERGED, f"non-finite loss at step {step}")
            else:
                verdict = self.track(step, m)
        m["wall_s"] = self.wall
        evals = {key[0]: (int(key[1]), v) for k, v in data.items() if (key := _val_key(k))}
        if "eval/split" in m:
            evals["split"] = (self.split_n, m["eval/split"])
        self._write(step, m, evals, converged=bool(verdict) and verdict[0] == statuses.CONVERGED)
        return verdict

    def calibrate(self, step: int, m: dict) -> tuple[str, str] | None:
        """verl's step-0 calibration, as early as verl allows: the mismatch metrics of its first
        training step are computed from the rollout's μ and the actor's π at the weights that
        sampled the batch, before that step's update (bypass cells: the first micro-batch's π_θ
        is still those weights). Judged on k3 against the pair's band (bench/calibration.py);
        outside it the run ends `miscalibrated` (FAIL) and verl is stopped."""
        from bench import calibration

        self.calibrated = True
        k3 = _finite(m.get("kl_k3"))
        source = "rollout_corr/k3_kl"
        if k3 is None:
            k3, source = _finite(m.get("bypass/kl_k3")), "actor/rollout_corr/k3_kl (bypass)"
        if k3 is None:
            return None                     # verl logged no mismatch (calculate_log_probs off): nothing to judge
        with session(self.store) as s:
            run = s.get(Run, self.run_id)
            pair = run.rollout_dtype, run.train_dtype
        result = calibration.judge({"k3": k3, "source": f"verl step {step}: {source}",
                                    **{k: _finite(m.get(k)) for k in ("kl_k1_token", "ppl_ratio",
                                                                      "prob_abs_diff_mean", "prob_abs_diff_max")}},
                                   *pair)
        ledger.record_calibration(self.store, self.run_id, result)
        return None if result["ok"] else (statuses.MISCALIBRATED, result["message"])

    def _write(self, step: int, m: dict, evals: dict[str, tuple[int, float]], converged: bool = False) -> None:
        ledger.record_step(self.store, self.run_id, step, m, self.wall, self.state.kl_warning_step, converged)
        ledger.record_evaluations(self.store, self.run_id, step, evals)


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM verl's whole process group (the driver shuts its local Ray down), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _log_tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def launch_and_follow(follower: Follower, argv: list[str], env: dict, metrics: Path, log: Path,
                      poll: float = 1.0, progress=None) -> tuple[str, str]:
    """Run verl to its end or until a stop rule fires; returns (status, reason)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    tail = MetricsTail(metrics)
    last = 0
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=log.parent)   # Hydra's outputs/ there
        try:
            while True:
                exited = proc.poll() is not None
                for step, data in tail.read():
                    last = max(last, step)
                    verdict = follower.ingest(step, data)
                    if progress:
                        progress(step, follower.cfg.max_steps, data)
                    if verdict:
                        _stop(proc)
                        return verdict
                if exited:
                    break
                time.sleep(poll)
        except BaseException:
            _stop(proc, grace=10.0)
            raise
    if proc.returncode == 0:
        return statuses.MAX_STEPS, f"verl finished after {last} steps (max_steps={follower.cfg.max_steps})"
    return statuses.FAILED, f"verl exited with code {proc.returncode} at step {last}; {log}:\n{_log_tail(log)}"


def latest_checkpoint(ckpt_dir: Path) -> int:
    """The step of verl's latest checkpoint (`latest_checkpointed_iteration.txt`), 0 if none."""
    f = Path(ckpt_dir) / "latest_checkpointed_iteration.txt"
    try:
        return int(f.read_text().strip())
    except (OSError, ValueError):
        return 0


def replay_for_resume(follower: Follower, ckpt_step: int) -> None:
    """Drop what verl will log again (steps after its checkpoint) and rebuild the stop state
    from the steps kept."""
    kept = ledger.rewind(follower.store, follower.run_id, ckpt_step)
    for step, m in kept:
        follower.wall = m.get("wall_s") or follower.wall
        if step > 0:
            follower.track(step, m, split_acc=m.get("eval/split"), may_eval=False)


# ------------------------------------------------------------------ entry points

def prepare(store, algo: str, precision, cfg: RunConfig, build_id: str | None, model: str | None,
            target: VerlTarget | str, root: Path, entry: str = "verl.trainer.main_ppo") -> VerlLaunch:
    """Export the split (and the first benchmark) to verl's parquet under `root` (one directory
    per run: verl resumes from whatever checkpoints it finds there), copy the reward module and
    build the command for `target` (an interpreter alone: one GPU, one node). Returns what a run
    row keeps to launch and relaunch verl."""
    from bench.problems import SourceSpec, load_problems

    from .plan import RunError, load_split, resolve_inputs

    with session(store) as s:
        build, m, ref = resolve_inputs(s, build_id, model)
        split = load_split(s, build.id)
        model_id = m.id
    if not split:
        raise RunError(f"build {build.id} kept no problems; rebuild with another --band or model")
    root = Path(root).resolve()
    train = export_parquet(split, root / "train.parquet", "split")
    val = None
    if cfg.benchmarks:
        b = cfg.benchmarks[0]
        val = export_parquet(load_problems(SourceSpec(b.source, limit=b.limit)), root / "val.parquet", b.name)
    reward = root / "reward.py"
    shutil.copyfile(verl_reward.__file__, reward)
    model_path = str(Path(ref.path).resolve()) if Path(ref.path).exists() else ref.path    # verl runs in root
    if isinstance(target, str):
        target = VerlTarget(target)
    if os.sep in target.python:                 # verl runs in root: a relative interpreter path would break
        target = VerlTarget(str(Path(target.python).absolute()), target.gpus, target.nodes)
    job = VerlJob(model_path, train, val, reward, root / "metrics.jsonl", "bench", root.name,
                  checkpoint_dir=root / "checkpoints", target=target)
    argv, env = verl_command(algo, precision, cfg, job, entry=entry)
    return VerlLaunch(root.name, str(root), argv, env, build.id, model_id, len(split), target)


def _follow(store, run_id: str, job: VerlLaunch, follower: Follower, progress=None) -> None:
    root = Path(job.root)
    ledger.run_to_end(store, run_id, lambda: launch_and_follow(
        follower, job.argv, job.env, root / "metrics.jsonl", root / "verl.log", progress=progress))


def start_verl_run(store, algo: str, precision, cfg: RunConfig, preset: str, job: VerlLaunch, progress=None) -> str:
    """Create the run row (trainer "verl", id = the name of the job's directory) and run verl
    to its end; returns the run id."""
    from bench import provenance

    from .algos import get_loss
    get_loss(algo)
    run_id = job.run_id
    facts = provenance.collect("cpu", split_accuracy_estimator=SPLIT_ESTIMATOR,
                               verl_env=provenance.package_versions_of(job.target.python),
                               verl_gpus=f"{job.target.gpus} GPU(s) x {job.target.nodes} node(s)",
                               preset_defaults=preset_defaults(preset) if preset in PRESETS else None)
    with session(store) as s:
        ledger.create(s, run_id, job.model_id, job.build_id, algo, precision, "verl", "vllm",
                      {"preset": preset, **asdict(cfg), "verl": job.to_config()}, Path(job.root) / "checkpoints",
                      facts)
    _follow(store, run_id, job, Follower(store, run_id, cfg, job.split_size), progress)
    return run_id


def resume_verl_run(store, run_id: str, progress=None) -> str:
    """Relaunch verl with the run's command (`trainer.resume_mode=auto`: it continues from its
    latest checkpoint); steps logged after that checkpoint are replaced. verl truncates its
    metrics file on start, so the previous one is kept as metrics.<n>.jsonl."""
    from .plan import config_from_dict, resumable_run

    with session(store) as s:
        run = resumable_run(s, run_id)
        cfg, calibrated = config_from_dict(run.config), run.calibration is not None
        job = VerlLaunch.from_config(run.config["verl"])
    root = Path(job.root)
    old = root / "metrics.jsonl"
    if old.exists():
        n = len(list(root.glob("metrics.*.jsonl")))
        old.rename(root / f"metrics.{n}.jsonl")
    follower = Follower(store, run_id, cfg, job.split_size, calibrated=calibrated)
    replay_for_resume(follower, latest_checkpoint(root / "checkpoints"))
    _follow(store, run_id, job, follower, progress)
    return run_id
