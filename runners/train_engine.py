"""The training engine of the native trainer: fp32 master weights and AdamW state, a compute
copy in the train format, dynamic loss scaling, all on one device; π log-probs and optimizer
steps over a packed batch, in micro-batches.

Micro-batches: the rows of a mini-batch are cut into parts (runners/microbatches.py): by
default sorted by length and grouped where a part's padding would cost more than a pass
(`RunConfig.group_by_length`), within `max_tokens_per_microbatch` padded tokens (rows ×
longest prompt+response) when set; each part is trimmed to its own widths, run forward and
backward, and its loss weighted by its share of the sequences the loss averages over (every
loss is a mean over sequences; GSPO's over those with at least one token: runners/algos.py
`sequences_in_mean`), so the summed gradient is the whole mini-batch's up to float rounding.
Gradients of a 16/8-bit compute copy are summed in fp32 into the master's. The logged loss and
loss metrics are those of the whole mini-batch (the loss function once more on the detached
log-probs: no model forward). When the cut is one part, the mini-batch is one forward/backward
in its own order, exactly as with neither knob.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from bench.model_formats import prepare_compute_model
from bench.routes import routed

from . import microbatches
from .algos import LossInputs, sequences_in_mean
from .logprobs import pack, response_logprobs, response_logprobs_centered, response_logprobs_entropy
from .loss_scaler import LossScaler
from .presets import RunConfig


@dataclass
class Batch:
    """Prompt + response ids packed by `pack`, on the training device, with each row's token
    counts on the host (for cutting micro-batches without a device sync)."""

    ids: torch.Tensor        # [N, W]
    attn: torch.Tensor       # [N, W]
    tok: torch.Tensor        # [N, T]
    pos: torch.Tensor        # [N, T]
    mask: torch.Tensor       # [N, T]
    lengths: list[int]       # prompt + response tokens per row
    response_lengths: list[int]
    trim: bool = True        # micro-batches drop the padding beyond their longest row

    @classmethod
    def pack(cls, prompt_ids: list[list[int]], responses: list[list[int]], pad: int, device="cpu") -> "Batch":
        ids, attn, tok, pos, mask = (t.to(device) for t in pack(prompt_ids, responses, pad))
        return cls(ids, attn, tok, pos, mask, [len(p) + len(r) for p, r in zip(prompt_ids, responses)],
                   [len(r) for r in responses])

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.ids, self.attn, self.tok, self.pos

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def rows(self, part: list[int]) -> tuple[torch.Tensor, ...]:
        """ids, attn, tok, pos, mask of rows `part`, trimmed to their longest row (`trim`; the
        arithmetic of attention over fewer padded keys rounds differently in fp32, by about
        2e-6 of a gradient's norm, below the ~1e-5 by which fp32 itself misses float64's)."""
        idx = torch.tensor(part, device=self.ids.device)
        if not self.trim:
            return self.ids[idx], self.attn[idx], self.tok[idx], self.pos[idx], self.mask[idx]
        w = max(self.lengths[i] for i in part)
        t = max(1, max(self.response_lengths[i] for i in part))
        return (self.ids[idx, :w], self.attn[idx, :w], self.tok[idx, :t], self.pos[idx, :t], self.mask[idx, :t])


class TrainingEngine:
    def __init__(self, master: torch.nn.Module, train_format: str, cfg: RunConfig, loss_fn, algo: str,
                 device="cpu"):
        """`master`: the fp32 model (moved to `device`, put in train mode). `loss_fn`: the
        registered loss of `algo` (the name says what the loss averages over)."""
        self.cfg, self.loss_fn, self.algo, self.device = cfg, loss_fn, algo, torch.device(device)
        self.master = master.to(self.device)
        self.master.train()
        self.compute = (self.master if train_format == "fp32"
                        else prepare_compute_model(copy.deepcopy(self.master), train_format, str(self.device)))
        if cfg.gradient_checkpointing:
            self.compute.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.opt = torch.optim.AdamW(self.master.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.scaler = LossScaler(train_format == "fp16", cfg.loss_scale_init, cfg.loss_scale_growth_interval,
                                 cfg.loss_scale_backoff)
        self.passes = 0          # forward passes of the compute model (micro-batches), for the step's metrics
        self.routes = None       # MoE: a bench.routes.TrainRoutes over the step's batch (records, replays)

    # ---------------------------------------------------------- pieces
    def sync_compute(self) -> None:
        if self.compute is not self.master:
            with torch.no_grad():
                for pc, pm in zip(self.compute.parameters(), self.master.parameters()):
                    pc.copy_(pm)

    def parts(self, rows: list[int], batch: Batch) -> list[list[int]]:
        """`rows` cut into micro-batches (runners/microbatches.py): grouped by length
        (`group_by_length`, within max_tokens_per_microbatch padded tokens when set), else in
        order within that budget (one part when no budget is set)."""
        budget = self.cfg.max_tokens_per_microbatch
        if not batch.trim:
            return microbatches.in_order([batch.ids.shape[1]] * len(batch.lengths), rows, budget)
        if self.cfg.group_by_length:
            return microbatches.by_length(batch.lengths, rows, budget)
        return microbatches.in_order(batch.lengths, rows, budget)

    def microbatched(self, batch: Batch) -> bool:
        """Whether a forward over the whole of `batch` runs in more than one part."""
        return len(self.parts(list(range(len(batch.lengths))), batch)) > 1

    @torch.no_grad()
    def logprobs(self, batch: Batch, model: torch.nn.Module | None = None) -> torch.Tensor:
        """log π of every response token of `batch` [N, T] (0 off the mask), no grad, in
        micro-batches; the caller syncs the compute copy. `model`: another train-format model
        in its place (π_old at stale weights: runners/staleness.py)."""
        model = self.compute if model is None else model
        rows = list(range(len(batch.lengths)))
        parts = self.parts(rows, batch)
        session = self.routes if model is self.compute else None
        if len(parts) == 1:
            self.passes += 1
            with routed(session):
                return response_logprobs(model, *batch.tensors) * batch.mask
        out = torch.zeros_like(batch.mask)
        for part in parts:
            ids, attn, tok, pos, m = batch.rows(part)
            self.passes += 1
            with routed(session, part, ids.shape[1]):
                out[torch.tensor(part, device=out.device), :m.shape[1]] = response_logprobs(model, ids, attn, tok,
                                                                                            pos) * m
        return out

    @torch.no_grad()
    def reference_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The fp32 reference of the calibration gate (bench/calibration.py): log π and the
        entropy H of every response position of `batch` [N, T] (0 off the mask) from the fp32
        master, in the micro-batches of `logprobs`. For an fp32 training format the compute
        copy is the master, and log π is the same bits as `logprobs(batch)`."""
        rows = list(range(len(batch.lengths)))
        parts = self.parts(rows, batch)
        if len(parts) == 1:
            self.passes += 1
            lp, ent = response_logprobs_entropy(self.master, *batch.tensors)
            return lp * batch.mask, ent * batch.mask
        lp, ent = torch.zeros_like(batch.mask), torch.zeros_like(batch.mask)
        for part in parts:
            ids, attn, tok, pos, m = batch.rows(part)
            self.passes += 1
            a, h = response_logprobs_entropy(self.master, ids, attn, tok, pos)
            idx = torch.tensor(part, device=lp.device)
            lp[idx, :m.shape[1]], ent[idx, :m.shape[1]] = a * m, h * m
        return lp, ent

    # ---------------------------------------------------------- one optimizer step
    def accumulate(self, x: LossInputs, idx: torch.Tensor, batch: Batch, logp: torch.Tensor | None = None,
                   fill_old: bool = False) -> tuple[float, dict, bool]:
        """The gradient of the mini-batch `idx` (rows of `batch` and `x`) into the master's
        `.grad` (unscaled), in micro-batches. `logp`: the mini-batch's log-probs with grad when
        the caller has them (one part only). `fill_old`: π_old is π_θ here (one update per
        rollout batch): each part writes its detached log-probs into `x.logp_old` before its
        loss. Returns the whole mini-batch's loss, its loss metrics, and whether the loss was
        finite."""
        self.compute.zero_grad(set_to_none=True)
        self.opt.zero_grad(set_to_none=True)
        parts = self.parts(idx.tolist(), batch) if logp is None else [idx.tolist()]
        if logp is None:
            self.sync_compute()
        scale = self.scaler.scale
        centered = x.logq is not None            # Score Centering: the forward also gives its centering term
        if len(parts) == 1 and not fill_old:
            didx = idx.to(self.device)
            center = None
            if logp is None or centered:
                self.passes += 1
                with routed(self.routes, idx, batch.ids.shape[1]):
                    logp, center = self._forward(batch.tensors, didx, x.logq)
            mb = LossInputs(logp, x.logp_old[didx], x.logp_rollout[didx], x.mask[didx], x.advantages[didx],
                            center=center)
            loss, metrics = self.loss_fn(mb, self.cfg.algo)
            finite = bool(torch.isfinite(loss))
            if finite:
                (loss * scale).backward()
            self._collect_grads(first=True)
            self._unscale()
            return loss.item(), metrics, finite
        n_seq = sequences_in_mean(self.algo, x.mask[idx.to(self.device)])
        pieces, total, finite = [], 0.0, True
        for part in parts:
            ids, attn, tok, pos, m = batch.rows(part)
            didx = torch.tensor(part, device=self.device)
            t = m.shape[1]
            self.passes += 1
            with torch.set_grad_enabled(finite), routed(self.routes, part, ids.shape[1]):
                lp, center = self._forward((ids, attn, tok, pos), None, None if x.logq is None else
                                           x.logq[didx.to(x.logq.device), :t])
            if fill_old:
                x.logp_old[didx, :t] = lp.detach() * m
            if not finite:              # the step is skipped; the rest only completes π_old for the metrics
                continue
            mb = LossInputs(lp, x.logp_old[didx, :t], x.logp_rollout[didx, :t], m, x.advantages[didx],
                            center=center)
            share = sequences_in_mean(self.algo, m) / n_seq if n_seq else 0.0
            loss, _ = self.loss_fn(mb, self.cfg.algo)
            total += loss.item() * share
            if not torch.isfinite(loss):
                finite = False
                if not fill_old:
                    break
                continue
            (loss * (share * scale)).backward()
            self._collect_grads(first=not pieces)
            pieces.append((part, lp.detach(), None if center is None else center.detach()))
        if not finite:
            for p in self.master.parameters():
                p.grad = None
            self.compute.zero_grad(set_to_none=True)
            return total, {}, False
        self._unscale()
        loss, metrics = self._whole_loss(x, idx, pieces)
        return loss, metrics, True

    @torch.no_grad()
    def _whole_loss(self, x: LossInputs, idx: torch.Tensor, pieces: list) -> tuple[float, dict]:
        """The whole mini-batch's loss and metrics, from its parts' detached log-probs (and Score
        Centering's terms): `pieces` [(rows of the part, log-probs, center or None)]."""
        where = {r: k for k, r in enumerate(idx.tolist())}
        didx = idx.to(self.device)
        full = torch.zeros(x.mask[didx].shape, dtype=pieces[0][1].dtype, device=self.device)
        full_center = torch.zeros_like(full) if pieces[0][2] is not None else None
        for part, lp, center in pieces:
            at = torch.tensor([where[r] for r in part], device=self.device)
            full[at, :lp.shape[1]] = lp
            if full_center is not None:
                full_center[at, :lp.shape[1]] = center
        loss, metrics = self.loss_fn(LossInputs(full, x.logp_old[didx], x.logp_rollout[didx], x.mask[didx],
                                                x.advantages[didx], center=full_center), self.cfg.algo)
        return loss.item(), metrics

    def _forward(self, tensors, rows: torch.Tensor | None, logq: torch.Tensor | None):
        """(log π of the response tokens, Score Centering's term or None) of `tensors` (ids, attn, tok,
        pos; their `rows` when given) by the compute copy; `logq` [n, T, V]: μ's recorded
        log-distribution of those rows (Score Centering), else the plain forward."""
        ids, attn, tok, pos = (t if rows is None else t[rows] for t in tensors)
        if logq is None:
            return response_logprobs(self.compute, ids, attn, tok, pos), None
        q = (logq if rows is None else logq[rows.to(logq.device)]).to(self.device)
        return response_logprobs_centered(self.compute, ids, attn, tok, pos, q, self.cfg.algo.sc_tis_hi)

    def _collect_grads(self, first: bool) -> None:
        """Move the compute copy's gradients into the master's, summed in fp32 (still scaled)."""
        if self.compute is self.master:
            return
        for pc, pm in zip(self.compute.parameters(), self.master.parameters()):
            if first:
                pm.grad = None if pc.grad is None else pc.grad.float()
            elif pc.grad is not None:
                pm.grad = pc.grad.float() if pm.grad is None else pm.grad.add_(pc.grad)   # fp32 += 16-bit, exact
            pc.grad = None

    def _unscale(self) -> None:
        scale = self.scaler.scale
        if self.compute is not self.master:
            for p in self.master.parameters():
                if p.grad is not None:
                    p.grad = p.grad / scale
        elif scale != 1.0:
            for p in self.master.parameters():
                if p.grad is not None:
                    p.grad /= scale

    def step(self, finite_loss: bool) -> tuple[float, bool]:
        """Clip and apply the master's gradients (skipped when the loss or the gradient norm is
        not finite; counted by the loss scaler for every dtype). Returns (grad norm, applied)."""
        grads = [p.grad for p in self.master.parameters() if p.grad is not None]
        # the norm is computed (and logged) even when it is inf/nan: that is the divergence signal
        grad_norm = torch.nn.utils.get_total_norm(grads).item() if grads else float("nan")
        finite = finite_loss and math.isfinite(grad_norm)
        if finite:
            torch.nn.utils.clip_grads_with_norm_(self.master.parameters(), self.cfg.grad_clip, torch.tensor(grad_norm))
            self.opt.step()
        self.scaler.update(finite)      # a skipped step is counted for every dtype
        return grad_norm, finite

    def update(self, x: LossInputs, idx: torch.Tensor, batch: Batch, logp: torch.Tensor | None = None,
               fill_old: bool = False) -> tuple[float, float, dict, bool]:
        """One mini-batch optimizer step; returns loss, grad norm, loss metrics, whether applied."""
        loss, metrics, finite = self.accumulate(x, idx, batch, logp, fill_old)
        grad_norm, applied = self.step(finite)
        return loss, grad_norm, metrics, applied
