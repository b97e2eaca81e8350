"""The native trainer: one process, CPU or one GPU (`device`: bench/device.py).

Per step: sample B prompts × G responses with the rollout engine (μ log-probs) → grade →
π_old log-probs with the training engine (the extra forward) → leave-one-out advantages →
`updates_per_batch` mini-batch updates of the registered loss → push the new weights to the
rollout engine. The training engine (runners/train_engine.py): fp32 master weights and AdamW
state; forward and backward on a compute copy in the train dtype, in micro-batches of a token
budget when set; log-softmax in fp32 over chunks of the logits (runners/logprobs.py); fp16
uses dynamic loss scaling. Master, compute copy, built-in rollout engine and batches live on
the run's device. Metrics land in the store every step (with the step's peak memory and
tokens/s); checkpoints every N steps make a killed run resumable with no gap and no
duplicate step.

Staleness (`RunConfig.staleness`, K; runners/staleness.py has the definitions): the rollout
engine samples step t with θ_{t−K_eff}, K_eff = min(K, t), from a queue of the last K master
snapshots; μ = the rollout engine and π_old = the training engine, both at θ_{t−K_eff} (so the
precision metrics, π_old vs μ, stay precision only); π_θ, the weights being updated, is
compared with π_old in `staleness_kl_k3` / `staleness_abs_dp` (with `staleness_k` = K_eff);
w = π_θ/μ carries both. After each update the oldest snapshot, not the master, goes to the
rollout engine; evaluations sample the current weights. At K = 0 the step is the code of
before, bit for bit (tests/runners/test_staleness.py compares stored steps).
"""

from __future__ import annotations

import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench import calibration, statedigest, statuses
from bench.device import is_cuda, peak_memory_mb, release_free_memory, reset_peak_memory, resident_mb, synchronize
from bench.engines import Sampling
from bench.errors import ConfigError
from bench.engines.torch_engine import TorchEngine
from bench.grading import Grader
from bench.mismatch import mismatch_metrics
from bench.models import load_model, load_tokenizer, render_prompt
from bench.moe import is_moe
from bench.precision import Precision
from bench.router_metrics import at_positions, router_metrics
from bench.routes import TrainRoutes, pad_routes, routed
from bench.problems import Problem, SourceSpec, load_problems

from bench import stop as stop_rules
from bench.algorithms import SPECS
from . import ledger, rollouts
from .algos import LossInputs, get_loss, leave_one_out_advantages
from .eval_seeds import BENCHMARK_EVAL, SPLIT_EVAL, eval_seed
from .logprobs import response_logprobs
from .plan import RunPlan
from .staleness import NO_STALENESS, WeightQueue, staleness_metrics
from .train_engine import Batch, TrainingEngine


def _norm_order(x: float) -> float:
    """Sort key that puts a non-finite grad norm above every finite one (the step's worst)."""
    return math.inf if not math.isfinite(x) else x


def step0_gate(learner: TrainingEngine, engine, precision: Precision, batch: Batch, logp_mu: torch.Tensor) -> dict:
    """The calibration gate's verdict (bench/calibration.judge) on the step-0 `batch` sampled by
    `engine` with log-probs `logp_mu` [N, T] (CPU), the compute copy synced to the master: π from
    the training engine, the fp32 reference ρ with its entropy, the twin τ in the rollout's
    format (π, ρ, or a temporary copy: bench/calibration.twin_model), and both engines' buffers
    against the master's."""
    r, t = precision.rollout, precision.train
    # the fp32 reference ρ with its entropy; for fp32 training it is π itself (the same bits)
    logp_ref, entropy = (x.cpu() for x in learner.reference_logprobs(batch))
    logp_pi = logp_ref if t == "fp32" else learner.logprobs(batch).cpu()
    if r == t or r == "fp32":
        logp_twin = logp_pi if r == t else logp_ref
    else:
        twin = calibration.twin_model(learner.master, r, learner.device)
        logp_twin = learner.logprobs(batch, model=twin).cpu()
        del twin
    mask = batch.mask.cpu()
    buffers = {"rollout": calibration.buffer_mismatches(learner.master, getattr(engine, "model", None)),
               "training": calibration.buffer_mismatches(learner.master, learner.compute)}
    return calibration.judge(calibration.calibration_metrics(logp_mu, logp_pi, mask), r, t,
                             reference=calibration.reference_metrics(logp_mu, logp_twin, logp_ref, mask,
                                                                     calibration.TWIN_RATIO[r]),
                             processing=calibration.processing_metrics(logp_mu, logp_twin, logp_ref, entropy, mask),
                             buffers=buffers)


@dataclass
class PiOld:
    """π_old of one step's batch and how it was had (`pi_old`)."""

    case: str                        # STALE, REUSE_UPDATE, FILLED_BY_UPDATE or EXTRA_FORWARD
    logp_old: torch.Tensor           # [N, T] log π_old of the response tokens (zeros until filled in)
    first: torch.Tensor | None       # [N, T] the update's own forward with grad (π_θ now), when it is reused
    fill_old: bool                   # the update fills logp_old in, one micro-batch forward at a time
    logp_cur: torch.Tensor | None    # [N, T] π_θ now, detached: only under staleness (its metrics)


STALE, REUSE_UPDATE, FILLED_BY_UPDATE, EXTRA_FORWARD = "stale", "reuse-update", "filled-by-update", "extra-forward"


def pi_old(learner: TrainingEngine, stale: WeightQueue, batch: Batch, updates_per_batch: int,
           microbatched: bool, reuse: bool = True) -> PiOld:
    """π_old, the training engine's log-probs of the sampled tokens at the sampling weights θ',
    in the cheapest way the step allows (the compute copy synced to the master first):

    1. STALE (K_eff = `stale.effective` > 0): θ' = θ_{t−K}, so π_old is a forward of the stale
       snapshot (`stale.old_logprobs`); π_θ now (`logp_cur`, for the staleness metrics) is the
       update's forward when case 2's condition holds, else one more forward.
    2. REUSE_UPDATE (on-policy, one update per batch, no micro-batches): θ' = θ, so π_old is
       the update's own forward with grad, detached (`first`): no extra forward.
    3. FILLED_BY_UPDATE (on-policy, one update, micro-batches): the same, one micro-batch at a
       time: `logp_old` starts at 0 and the update fills it in (`fill_old`).
    4. EXTRA_FORWARD (on-policy, several updates per batch): θ moves between the updates, so
       π_old is one forward before the first (`learner.logprobs`).
    `reuse` False (Score Centering, whose update's forward also computes its centering term): no
    forward with grad ahead of the update; case 2 becomes case 3.
    Every forward counts in `learner.passes`."""
    mask = batch.mask
    first = None
    if updates_per_batch == 1 and not microbatched and reuse:
        learner.passes += 1
        with routed(learner.routes):             # MoE: the forward records (or replays) the step's routes
            first = response_logprobs(learner.compute, *batch.tensors)
    if stale.effective:
        logp_old = stale.old_logprobs(batch)
        logp_cur = first.detach() * mask if first is not None else learner.logprobs(batch)
        return PiOld(STALE, logp_old, first, False, logp_cur)
    if first is not None:
        return PiOld(REUSE_UPDATE, first.detach() * mask, first, False, None)
    if updates_per_batch == 1:
        return PiOld(FILLED_BY_UPDATE, torch.zeros_like(mask), None, True, None)
    return PiOld(EXTRA_FORWARD, learner.logprobs(batch), None, False, None)


# ------------------------------------------------------------------ the trainer

class NativeTrainer:
    def __init__(self, store, run_id: str, plan: RunPlan, split: list[Problem], ckpt_dir: Path, progress=None,
                 rollout_engine=None):
        """Train run `run_id` of `plan` (runners/plan.py: every input already checked) on `split`,
        checkpointing to `ckpt_dir`; `progress(step, total, metrics)` after every step. Ctrl-C or
        an error while starting closes what was started (the grader's worker processes, the
        rollout engine) before it is raised: a process that ends then is not held by them."""
        self.engine = self.grader = None
        self.own_engine = rollout_engine is None
        try:
            self._start(store, run_id, plan, split, ckpt_dir, progress, rollout_engine)
        except BaseException:
            self.close()
            raise

    def _start(self, store, run_id: str, plan: RunPlan, split: list[Problem], ckpt_dir: Path, progress,
               rollout_engine) -> None:
        cfg, algo, precision, ref = plan.cfg, plan.algo, plan.precision, plan.model
        self.store, self.run_id, self.cfg, self.algo, self.precision = store, run_id, cfg, algo, precision
        self.loss_fn = get_loss(algo)
        self.ckpt_dir, self.progress, self.ref = ckpt_dir, progress, ref
        self.device = torch.device(plan.device)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.tok = load_tokenizer(ref)
        self.learner = TrainingEngine(load_model(ref, torch.float32), precision.train, cfg, self.loss_fn, algo,
                                      self.device)
        self.stale = WeightQueue(cfg.staleness, self.learner)   # K = 0: empty, unused
        self.stop_state = stop_rules.StopState()
        self.step = 0
        self.wall = 0.0
        self.split = split
        self.prompts = [render_prompt(ref, self.tok, p.problem) for p in split]
        self.prompt_ids = [self.tok.encode(p, add_special_tokens=False) for p in self.prompts]
        self.benchmarks = [(b, load_problems(SourceSpec(b.source, limit=b.limit))) for b in cfg.benchmarks]
        if rollout_engine is None:
            rollout_engine = rollouts.start_engine(plan, self.learner.master, self.tok, track_updates=True,
                                                   record_routes=True)
        else:   # a running engine of the rollout dtype (tests share one vLLM engine): start it at our weights
            rollout_engine.update_weights(self.learner.master.named_parameters())
        self.engine = rollout_engine
        # split accuracy of the training-precision policy too, where it differs from the rollout format
        self.train_sampler = (TorchEngine(ref.path, precision.train, model=self.learner.compute, tokenizer=self.tok,
                                          prepared=True, device=str(self.device),
                                          **rollouts.engine_batch(cfg))
                              if precision.rollout != precision.train else None)
        self.grader = Grader()
        self.moe = is_moe(self.learner.master)
        if cfg.router_replay and not getattr(self.engine, "record_routes", False):
            raise ConfigError("--router-replay needs a mixture-of-experts model and the built-in rollout engine "
                           "(--engine torch), which records the experts it chose")

    def close(self) -> None:
        if self.own_engine and self.engine is not None:
            self.engine.close()
        if self.grader is not None:
            self.grader.close()

    # ---------------------------------------------------------- checkpoints
    @property
    def ckpt_path(self) -> Path:
        return self.ckpt_dir / "checkpoint.pt"

    def training_state(self) -> dict:
        """What a checkpoint restores and a state digest covers (bench/statedigest.py): the fp32
        master, the optimizer, the loss scaler and the staleness queue — each a function of the
        run's settings and seed. No process-wide RNG state: bench draws from none (its sampling,
        prompt order and batch order use generators seeded from the run's seed), and torch's and
        Python's are seeded by the OS at each start (digest scheme 1 hashed them)."""
        state = {"model": self.learner.master.state_dict(), "optimizer": self.learner.opt.state_dict(),
                 "scaler": self.learner.scaler.state_dict()}
        if self.cfg.staleness:
            state["staleness"] = self.stale.state()
        return state

    def save_checkpoint(self) -> None:
        state = {"step": self.step, "wall": self.wall, "stop": self.stop_state.to_dict(), **self.training_state()}
        tmp = self.ckpt_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.ckpt_path)
        keep = self.cfg.keep_checkpoints
        if keep and self.step % keep == 0:
            kept = statedigest.kept_checkpoint(self.ckpt_dir, self.step)
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.ckpt_path, kept)

    def record_digest(self) -> None:
        """The state's digest at this evaluation step and the chain over the run's digests."""
        ledger.record_digest(self.store, self.run_id, self.step, statedigest.state_digest(self.training_state()))

    def load_checkpoint(self) -> None:
        """Restore from the last checkpoint (or the start) and drop later steps from the store (the
        run's peak and final accuracy then read off the evaluations left)."""
        if self.ckpt_path.exists():
            # state dicts copy to the device
            # weights only: tensors, numbers and containers (a window re-run loads a bundle's checkpoint here)
            state = torch.load(self.ckpt_path, weights_only=True, map_location="cpu")
            self.learner.master.load_state_dict(state["model"])
            self.learner.opt.load_state_dict(state["optimizer"])
            for k, v in state["scaler"].items():
                setattr(self.learner.scaler, k, v)
            self.stop_state = stop_rules.StopState.from_dict(state["stop"])
            self.step, self.wall = state["step"], state["wall"]
            self.stale.load_state(state.get("staleness", []))
            self.learner.sync_compute()
            self.engine.update_weights(self.stale.rollout_weights(self.learner.master))
        ledger.rewind(self.store, self.run_id, self.step)

    # ---------------------------------------------------------- pieces
    def _step_prompts(self, step: int) -> list[int]:
        """Indices of the B prompts of `step`: epochs over a seeded shuffle of the split."""
        b, n = self.cfg.prompts_per_step, len(self.split)
        out = []
        for k in range(step * b, step * b + b):
            epoch, i = divmod(k, n)
            perm = list(range(n))
            random.Random(f"{self.cfg.seed}:{epoch}").shuffle(perm)
            out.append(perm[i])
        return out

    def _rollouts(self, idx: list[int], sp: Sampling, for_loss: bool = True):
        """G responses to each prompt of `idx` from the rollout engine: runners/rollouts.py `draw`
        (μ's distributions too when they feed the loss and the algorithm reads them)."""
        return rollouts.draw(self.engine, [self.prompts[i] for i in idx], [self.prompt_ids[i] for i in idx],
                             self.cfg.samples_per_prompt, sp, self.tok.pad_token_id, self.device,
                             distributions=for_loss and SPECS[self.algo].needs_distribution)

    def _score(self, problems: list[Problem], samples) -> torch.Tensor:
        texts = [s.text for row in samples for s in row]
        golds = [p.answer for p, row in zip(problems, samples) for _ in row]
        return torch.tensor([float(v.correct) for v in self.grader.grade(texts, golds)])

    def evaluate(self) -> dict[str, float]:
        """avg@m on the whole split (training sampling) and avg@n on every benchmark, sampled by
        the rollout engine; and, when the rollout format differs from the training format,
        `split@train`: the same avg@m (same seeds) sampled from the training engine's compute
        copy (fp32 master weights in the training format, its forward as in training), i.e.
        what the run learned rather than what its quantized sampler answers. The draws are
        seeded by the run's seed and the step (runners/eval_seeds.py): seeds never share them. The
        stop rules, peak and final accuracy read `split` (what training sees, as before). With staleness
        the rollout engine holds the current weights for the evaluation (runners/staleness.py)."""
        with self.stale.current_weights(self.engine, self.learner.master):
            scores = self._evaluate()
        release_free_memory(self.device)       # its batch is a step's several times over
        ledger.record_evaluations(self.store, self.run_id, self.step, scores)
        return {name: score for name, (_, score) in scores.items()}

    def _evaluate(self) -> dict[str, float]:
        cfg = self.cfg
        sp = Sampling(cfg.temperature, cfg.top_p, cfg.max_tokens, seed=eval_seed(SPLIT_EVAL, cfg.seed, self.step))
        scores = {"split": (cfg.eval_split_m,
                            self._score(self.split, self.engine.generate(self.prompts, cfg.eval_split_m, sp)))}
        if self.train_sampler is not None:
            self.learner.sync_compute()
            with torch.no_grad():
                samples = self.train_sampler.generate(self.prompts, cfg.eval_split_m, sp)
            scores["split@train"] = (cfg.eval_split_m, self._score(self.split, samples))
        for b, probs in self.benchmarks:
            ref_prompts = [render_prompt(self.ref, self.tok, p.problem) for p in probs]
            bsp = Sampling(b.temperature, b.top_p, cfg.max_tokens, seed=eval_seed(BENCHMARK_EVAL, cfg.seed, self.step))
            scores[b.name] = (b.n, self._score(probs, self.engine.generate(ref_prompts, b.n, bsp)))
        return {name: (n, r.mean().item()) for name, (n, r) in scores.items()}

    # ---------------------------------------------------------- one step
    def train_step(self) -> dict[str, float]:
        cfg, g, dev, learner = self.cfg, self.cfg.samples_per_prompt, self.device, self.learner
        reset_peak_memory(dev)
        learner.passes = 0
        t0 = time.time()
        idx = self._step_prompts(self.step)
        sp = Sampling(cfg.temperature, cfg.top_p, cfg.max_tokens, seed=cfg.seed * 1_000_003 + self.step)
        samples, batch, logp_rollout, logq = self._rollouts(idx, sp)
        t1 = time.time()
        rewards = self._score([self.split[i] for i in idx], samples)
        flat = [s for row in samples for s in row]
        mask = batch.mask
        logp_rollout = logp_rollout.to(dev)
        tt = time.time()
        learner.sync_compute()
        k_eff = self.stale.effective
        routes = learner.routes = self._train_routes(batch, flat) if not k_eff else None
        old = pi_old(learner, self.stale, batch, cfg.updates_per_batch, learner.microbatched(batch),
                     reuse=not SPECS[self.algo].needs_distribution)
        first, logp_old, fill_old, logp_cur = old.first, old.logp_old, old.fill_old, old.logp_cur
        adv = leave_one_out_advantages(rewards.view(-1, g)).view(-1).to(dev)
        x = LossInputs(None, logp_old, logp_rollout, mask, adv, logq=logq)  # type: ignore[arg-type]
        if routes is not None:
            routes.recording = fill_old          # the π_old forwards are done, but where the update makes them
        synchronize(dev)
        t2 = time.time()
        gen = torch.Generator().manual_seed(cfg.seed * 7_919 + self.step)
        order = torch.randperm(len(flat), generator=gen)
        self.stale.record(learner.master)          # θ_t, before the update (K = 0: nothing)
        losses, norms, loss_metrics, applied = [], [], {}, 0
        for chunk in order.chunk(cfg.updates_per_batch):
            loss, norm, m, ok = learner.update(x, chunk, batch, None if first is None else first[chunk.to(dev)],
                                               fill_old=fill_old)
            losses.append(loss)
            norms.append(norm)
            applied += ok
            for k, v in m.items():
                loss_metrics[k] = loss_metrics.get(k, 0.0) + v / cfg.updates_per_batch
        learner.routes = None
        synchronize(dev)
        t_trained = time.time()
        self.engine.update_weights(self.stale.rollout_weights(learner.master))   # θ_{t+1−K}; the master at K = 0
        sync = dict(getattr(self.engine, "sync_stats", None) or {})   # rollout_weights_moved, rollout_update_to_step
        synchronize(dev)
        t3 = time.time()
        mask_c, logp_old_c, logp_rollout_c = mask.cpu(), logp_old.cpu(), logp_rollout.cpu()
        lengths = mask_c.sum(-1)
        n_tok = lengths.sum().item()
        t_train = (t2 - tt) + (t_trained - t2)
        metrics = {
            "reward": rewards.mean().item(), "response_len": lengths.mean().item(),
            "response_len_max": lengths.max().item(),
            "truncated_frac": sum(s.finish_reason == "length" for s in flat) / len(flat),
            "loss": sum(losses) / len(losses), "grad_norm": max(norms, key=_norm_order) if norms else float("nan"),
            "loss_scale": learner.scaler.scale, "skipped_steps": learner.scaler.skipped,
            "updates_applied": applied, "updates_nonfinite": len(norms) - applied,
            **mismatch_metrics(logp_rollout_c, logp_old_c, mask_c), **sync, "staleness_k": k_eff,
            **(staleness_metrics(logp_old_c, logp_cur.cpu(), mask_c) if k_eff else NO_STALENESS),
            **(self._router_metrics(routes, flat, batch, logp_rollout_c, logp_old_c, mask_c) if routes else {}),
            **{f"loss/{k}": v for k, v in loss_metrics.items()},
            "time_rollout": t1 - t0, "time_scoring": t2 - t1, "time_update": t3 - t2,
            "tokens_per_s": n_tok / max(t1 - t0, 1e-9),
            "time_train": t_train, "train_tokens_per_s": batch.tokens / max(t_train, 1e-9),
            "micro_batches": learner.passes, "peak_memory_mb": peak_memory_mb(dev),
        }
        release_free_memory(dev)
        if not is_cuda(dev):
            metrics["rss_mb"] = resident_mb()        # after the trim: what the process keeps between steps
        return metrics

    def _train_routes(self, batch: Batch, flat) -> TrainRoutes | None:
        """The step's route session (bench/routes.py) on an MoE model whose rollout engine records
        routes: the trainer's choice at every position, and the rollout's to replay with
        --router-replay. None otherwise (dense model, vLLM, staleness)."""
        if not self.moe or not getattr(self.engine, "record_routes", False):
            return None
        n, w = batch.ids.shape
        session = TrainRoutes(self.learner.compute, n, w)
        if self.cfg.router_replay:
            session.replay = pad_routes([s.routes for s in flat], w, len(session.gates), session.k)
        return session

    @staticmethod
    def _router_metrics(routes: TrainRoutes, flat, batch: Batch, logp_mu, logp_pi, mask) -> dict[str, float]:
        """router_* and the mismatch split by flipped tokens (bench/router_metrics.py) at the
        positions scoring the response tokens."""
        n, w = batch.ids.shape
        rollout = pad_routes([s.routes for s in flat], w, len(routes.gates), routes.k)
        pos = batch.pos.cpu()
        return router_metrics(at_positions(rollout, pos), at_positions(routes.chosen, pos), logp_mu, logp_pi, mask)

    # ---------------------------------------------------------- the loop
    def fit(self) -> tuple[str, str]:
        """Train until a stop rule fires; returns (status, reason)."""
        cfg = self.cfg
        if self.step == 0:
            cal = self.calibrate()
            if not cal["ok"]:
                return statuses.MISCALIBRATED, cal["message"]
            self._progress({"gate/k3": cal["k3"]})       # a real model's step 0 takes minutes: say where it is
            acc = self.evaluate()
            stop_rules.after_eval(self.stop_state, cfg.stop, 0, acc["split"], len(self.split) * cfg.eval_split_m,
                                  max_steps=cfg.max_steps)
            self._record_decisions()
            self.record_digest()
            self._progress({f"eval/{k}": v for k, v in acc.items()})
        while True:
            if cfg.max_steps == 0:
                return statuses.EVALUATED, "max_steps=0: the step-0 calibration gate and evaluation only"
            if self.step >= cfg.max_steps:
                return statuses.MAX_STEPS, f"reached max_steps={cfg.max_steps}"
            t0 = time.time()
            metrics = self.train_step()
            self.step += 1
            in_a_row = self.learner.scaler.skipped_in_a_row
            if in_a_row:                  # the evidence a `diverged` end rests on (bench/verdicts.py)
                metrics["nonfinite_in_a_row"] = in_a_row
            if in_a_row >= cfg.max_nonfinite_in_a_row:
                self._record(metrics, time.time() - t0)
                return statuses.DIVERGED, (f"{in_a_row} optimizer steps in a row skipped for a "
                                             f"non-finite loss or gradient (loss {metrics['loss']:.4g}, grad norm "
                                             f"{metrics['grad_norm']:.4g} at step {self.step})")
            if any(not torch.isfinite(p).all() for p in self.learner.master.parameters()):
                metrics["nonfinite_weights"] = 1.0
                self._record(metrics, time.time() - t0)
                return statuses.DIVERGED, f"non-finite weights at step {self.step}"
            if stop_rules.after_step(self.stop_state, cfg.stop, self.step, metrics["kl_k3"]):
                metrics["kl_warning"] = 1.0
            verdict = None
            if self.step % cfg.eval_every == 0 or self.step >= cfg.max_steps:
                te = time.time()
                acc = self.evaluate()
                metrics.update({f"eval/{k}": v for k, v in acc.items()})
                metrics["time_eval"] = time.time() - te
                verdict = stop_rules.after_eval(self.stop_state, cfg.stop, self.step, acc["split"],
                                                len(self.split) * cfg.eval_split_m, max_steps=cfg.max_steps)
                self._record_decisions()
            self._record(metrics, time.time() - t0, converged=bool(verdict) and verdict[0] == statuses.CONVERGED)
            if "eval/split" in metrics:
                self.record_digest()
            if self.step % cfg.checkpoint_every == 0 or verdict or (cfg.keep_checkpoints
                                                                    and self.step % cfg.keep_checkpoints == 0):
                self.save_checkpoint()
            self._progress(metrics)
            if verdict:
                return verdict

    def _progress(self, metrics: dict) -> None:
        """`progress(step, max_steps, metrics)` where the run has a callback: after every step, and at
        step 0 after the calibration gate (`gate/k3`) and after the evaluation (`eval/<name>`)."""
        if self.progress:
            self.progress(self.step, self.cfg.max_steps, metrics)

    def calibrate(self) -> dict:
        """The step-0 gate (bench/calibration.py): one batch of B × G rollouts scored by both
        engines at the identical starting weights, stored as the run's `calibration`; scored
        also by the fp32 master (the reference, with its entropy) and, for a rollout format
        that is neither fp32 nor the training format, by a temporary twin copy in that format."""
        cfg = self.cfg
        sp = Sampling(cfg.temperature, cfg.top_p, cfg.max_tokens, seed=30_000_001 + cfg.seed)
        _, batch, logp_mu, _ = self._rollouts(self._step_prompts(0), sp, for_loss=False)
        self.learner.sync_compute()
        result = step0_gate(self.learner, self.engine, self.precision, batch, logp_mu)
        ledger.record_calibration(self.store, self.run_id, result)
        return result

    def replay_stop_rules(self) -> None:
        """The stop rules' state recomputed from the evaluations it holds, under this run's
        config (a larger max_steps: `bench runs extend`), the KL early warning's series kept;
        the stored shadow decisions replaced by the recomputed ones."""
        old = self.stop_state
        self.stop_state = stop_rules.StopState(kl=old.kl, kl_warning_step=old.kl_warning_step)
        for step, accuracy, n in old.evals:
            stop_rules.after_eval(self.stop_state, self.cfg.stop, step, accuracy, n, max_steps=self.cfg.max_steps)
        self._record_decisions(replace=True)

    def _record_decisions(self, replace: bool = False) -> None:
        """Store the stop rules' shadow decisions so far (bench/stop.py: every rule, on or off)."""
        ledger.record_decisions(self.store, self.run_id, self.stop_state.shadow, self.cfg.stop.on, replace)

    def _record(self, metrics: dict, dt: float, converged: bool = False) -> None:
        """Store the step; `converged`: the stop rule's verdict at this step sets steps to target."""
        self.wall += dt
        metrics["wall_s"] = self.wall
        ledger.record_step(self.store, self.run_id, self.step, metrics, self.wall, self.stop_state.kl_warning_step,
                           converged)
