"""The seven algorithms of docs/algorithms.md as registered pure loss functions.

Notation, per response y of length T (mask m_t), with sg = stop-gradient:
    w   = exp(Σ_t (logp_t − logp_rollout_t))        current π_θ over the rollout μ_θ' (sequence)
    ρ   = exp(Σ_t (logp_old_t − logp_rollout_t))    training vs rollout engine at θ' (sequence)
    ρ_t = exp(logp_old_t − logp_rollout_t)          the same, per token
    r_t = exp(logp_t − logp_old_t)                  PPO ratio
    s   = exp(mean_t (logp_t − logp_old_t))         GSPO's sequence ratio (geometric mean)
    A   = R − mean of the other G−1 rewards of the same prompt (leave-one-out)
θ' is the sampling parameters: θ at the start of the step on-policy, θ_{t−K} under staleness K
(`--staleness`, runners/staleness.py). So ρ (π_old over μ, both at θ') is precision mismatch
only, r = π_θ/π_old carries the staleness, and w = r·ρ both.

Every loss but GSPO is the mean over sequences of a per-sequence surrogate whose token sum is
divided by the fixed max response length L (Dr.GRPO's "seq-mean-token-sum-norm"); GSPO keeps
its plain mean over sequences. Sequence log-ratios are clamped to ±20 before exp (bench.mismatch.SAFETY_BOUND,
as verl's): a weight of e^20 is already a diverged run, and inf would poison the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from bench.algorithms import SPECS, AlgoConfig  # noqa: F401 (AlgoConfig: read from here too)
from bench.errors import ConfigError, did_you_mean
from bench.mismatch import SAFETY_BOUND, ratio_stats


@dataclass
class LossInputs:
    """All [B, T] except advantages [B]."""

    logp: torch.Tensor           # log π_θ(y_t), current params, training engine, requires grad
    logp_old: torch.Tensor       # log π_θ'(y_t), sampling params, training engine, detached
    logp_rollout: torch.Tensor   # log μ_θ'(y_t), sampling params, rollout engine, detached
    mask: torch.Tensor           # 1 on response tokens
    advantages: torch.Tensor


LossFn = Callable[[LossInputs, AlgoConfig], tuple[torch.Tensor, dict[str, float]]]
REGISTRY: dict[str, LossFn] = {}     # name → loss; the names, descriptions and mean-over: bench/algorithms.py


def register_loss(name: str):
    """Register the loss of the algorithm `name`, which bench.algorithms.SPECS must declare."""
    if name not in SPECS:
        raise KeyError(f"{name!r} is not in bench.algorithms.SPECS; declare it there first")

    def deco(fn: LossFn) -> LossFn:
        REGISTRY[name] = fn
        return fn
    return deco


def sequences_in_mean(name: str, mask: torch.Tensor) -> int:
    """How many of the sequences of `mask` [B, T] the loss `name` averages over: all B, or for
    GSPO those with at least one token. A loss over a batch split in parts equals the sum of
    the parts' losses each weighted by its share of this count (the trainer's micro-batches)."""
    spec = SPECS.get(name)
    if spec is not None and spec.mean_over == "nonempty":
        return int((mask.sum(-1) > 0).sum().item())
    return int(mask.shape[0])


def check_algo(name: str, where: str = "") -> str:
    """`name` when it is a registered algorithm, else ConfigError naming the choices and the
    nearest ("did you mean"); `where`: the text it came from, for the message."""
    if name not in REGISTRY:
        raise ConfigError(f"unknown algorithm {name!r}{where}{did_you_mean(name, REGISTRY)}; choose one of "
                          f"{', '.join(REGISTRY)}")
    return name


def get_loss(name: str) -> LossFn:
    return REGISTRY[check_algo(name)]


# ------------------------------------------------------------------ shared pieces

def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_i = R_i − (Σ_{j≠i} R_j)/(G−1) within each group; rewards [P, G] → advantages [P, G].
    All-equal rewards give A = 0."""
    g = rewards.shape[-1]
    if g < 2:
        raise ValueError("leave-one-out advantages need at least 2 samples per prompt")
    return rewards - (rewards.sum(-1, keepdim=True) - rewards) / (g - 1)


def _seq_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum(-1)


def _seq_log_ratio(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return _seq_sum(a - b, mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)


def _ppo_token_objective(x: LossInputs, cfg: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token min(r_t A, clip(r_t, 1−ε_lo, 1+ε_hi) A) and where clipping is active."""
    r = torch.exp(x.logp - x.logp_old)
    a = x.advantages.unsqueeze(-1)
    unclipped = r * a
    clipped = r.clamp(1 - cfg.eps_lo, 1 + cfg.eps_hi) * a
    return torch.minimum(unclipped, clipped), (clipped < unclipped)


def _frac(flags: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    if mask is None:
        return flags.float().mean().item() if flags.numel() else 0.0
    n = mask.sum()
    return ((flags.float() * mask).sum() / n).item() if n > 0 else 0.0


def _pg_seq(x: LossInputs, cfg: AlgoConfig, weight: torch.Tensor) -> torch.Tensor:
    """mean over sequences of −sg(weight) · A · Σ_t logp_t / L."""
    return -(weight.detach() * x.advantages * _seq_sum(x.logp, x.mask)).mean() / cfg.max_len


# ------------------------------------------------------------------ the seven losses

@register_loss("pg-seq-is")
def pg_seq_is(x: LossInputs, cfg: AlgoConfig):
    """L = mean_i [ −sg(w_i) · A_i · Σ_t logp_it ] / L_max."""
    lw = _seq_log_ratio(x.logp, x.logp_rollout, x.mask)
    return _pg_seq(x, cfg, lw.exp()), ratio_stats(lw.detach(), "is_weight")


@register_loss("pg-seq-tis")
def pg_seq_tis(x: LossInputs, cfg: AlgoConfig):
    """L = mean_i [ −sg(min(w_i, C)) · A_i · Σ_t logp_it ] / L_max."""
    lw = _seq_log_ratio(x.logp, x.logp_rollout, x.mask)
    w = lw.exp()
    return _pg_seq(x, cfg, w.clamp(max=cfg.C)), {**ratio_stats(lw.detach(), "is_weight"),
                                                 "truncated_frac": _frac(w > cfg.C)}


@register_loss("pg-seq-mis")
def pg_seq_mis(x: LossInputs, cfg: AlgoConfig):
    """L = mean_i [ −sg(w_i · 1{w_i ≤ C}) · A_i · Σ_t logp_it ] / L_max  (masking, not clamping)."""
    lw = _seq_log_ratio(x.logp, x.logp_rollout, x.mask)
    w = lw.exp()
    keep = w <= cfg.C
    return _pg_seq(x, cfg, w * keep), {**ratio_stats(lw.detach(), "is_weight"), "masked_frac": _frac(~keep)}


@register_loss("grpo")
def grpo(x: LossInputs, cfg: AlgoConfig):
    """L = mean_i [ −Σ_t min(r_t A_i, clip(r_t, 1−ε_lo, 1+ε_hi) A_i) ] / L_max."""
    obj, clipped = _ppo_token_objective(x, cfg)
    loss = -_seq_sum(obj, x.mask).mean() / cfg.max_len
    return loss, {"clip_frac": _frac(clipped, x.mask)}


@register_loss("grpo-token-tis")
def grpo_token_tis(x: LossInputs, cfg: AlgoConfig):
    """L = mean_i [ −Σ_t sg(min(ρ_t, C)) · min(r_t A_i, clip(r_t, …) A_i) ] / L_max."""
    obj, clipped = _ppo_token_objective(x, cfg)
    lrho = (x.logp_old - x.logp_rollout).clamp(-SAFETY_BOUND, SAFETY_BOUND).detach()
    rho = lrho.exp()
    loss = -_seq_sum(rho.clamp(max=cfg.C) * obj, x.mask).mean() / cfg.max_len
    return loss, {"clip_frac": _frac(clipped, x.mask), "truncated_frac": _frac(rho > cfg.C, x.mask),
                  **ratio_stats(lrho[x.mask.bool()], "is_weight")}


@register_loss("grpo-seq-mis")
def grpo_seq_mis(x: LossInputs, cfg: AlgoConfig):
    """L = mean_i [ −sg(ρ_i · 1{ρ_i ≤ C}) · Σ_t min(r_t A_i, clip(r_t, …) A_i) ] / L_max."""
    obj, clipped = _ppo_token_objective(x, cfg)
    lrho = _seq_log_ratio(x.logp_old, x.logp_rollout, x.mask).detach()
    rho = lrho.exp()
    keep = rho <= cfg.C
    loss = -((rho * keep) * _seq_sum(obj, x.mask)).mean() / cfg.max_len
    return loss, {"clip_frac": _frac(clipped, x.mask), "masked_frac": _frac(~keep),
                  **ratio_stats(lrho, "is_weight")}


@register_loss("gspo")
def gspo(x: LossInputs, cfg: AlgoConfig):
    """L = mean_i [ −min(s_i A_i, clip(s_i, 1−lo, 1+hi) A_i) ] over sequences with ≥ 1 token,
    s_i = exp(mean_t (logp_t − logp_old_t))."""
    n = x.mask.sum(-1)
    valid = n > 0
    if not valid.any():
        return (x.logp * 0).sum(), {"clip_frac": 0.0}
    ls = _seq_sum(x.logp - x.logp_old, x.mask)[valid] / n[valid]
    s = ls.exp()
    a = x.advantages[valid]
    unclipped = s * a
    clipped = s.clamp(1 - cfg.gspo_lo, 1 + cfg.gspo_hi) * a
    loss = -torch.minimum(unclipped, clipped).mean()
    return loss, {"clip_frac": _frac(clipped < unclipped), **ratio_stats(ls.detach(), "seq_ratio")}
