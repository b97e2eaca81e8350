"""The algorithms of docs/algorithms.md (bench/algorithms.py SPECS) as registered pure loss functions.

Notation, per response y of length T (mask m_t), with sg = stop-gradient:
    w   = exp(Σ_t (logp_t − logp_rollout_t))        current π_θ over the rollout μ_θ' (sequence)
    ρ   = exp(Σ_t (logp_old_t − logp_rollout_t))    training vs rollout engine at θ' (sequence)
    ρ_t = exp(logp_old_t − logp_rollout_t)          the same, per token
    r_t = exp(logp_t − logp_old_t)                  PPO ratio
    s   = exp(mean_t (logp_t − logp_old_t))         GSPO's sequence ratio (geometric mean)
    ℓ_t = logp_old_t − logp_rollout_t               (clamped ±20) the log of ρ_t
    p_t = exp(logp_t), q_t = exp(logp_rollout_t)    token probabilities under π_θ (detached) and μ
    A   = R − mean of the other G−1 rewards of the same prompt (leave-one-out)
θ' is the sampling parameters: θ at the start of the step on-policy, θ_{t−K} under staleness K
(`--staleness`, runners/staleness.py). So ρ (π_old over μ, both at θ') is precision mismatch
only, r = π_θ/π_old carries the staleness, and w = r·ρ both.

Every loss but GSPO is the mean over sequences of a per-sequence surrogate whose token sum is
divided by the fixed max response length L (Dr.GRPO's "seq-mean-token-sum-norm"); GSPO keeps
its plain mean over sequences. A masked token or sequence therefore contributes zero and the
divisor does not move; a framework that renormalises over the kept tokens (verl's rejection path
under token-mean) weighs the kept ones up instead (docs/algorithms.md).
Sequence log-ratios are clamped to ±20 before exp (bench.mismatch.SAFETY_BOUND, as verl's): a
weight of e^20 is already a diverged run, and inf would poison the batch.
"""

from __future__ import annotations

import math
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
    # Score Centering only (SPECS[...].needs_distribution): μ's whole log-distribution at every response
    # position [B, T, V] (the built-in engine's record) and, from the training forward,
    # center_t = Σ_v sg(μ_v · w_v) · log π_θ(v) [B, T] with grad (runners/logprobs.py)
    logq: torch.Tensor | None = None
    center: torch.Tensor | None = None


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
    lrho = _token_log_rho(x)
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


# ------------------------------------------------------------------ the field's corrections (docs/algorithms.md)

def _token_log_rho(x: LossInputs) -> torch.Tensor:
    """ℓ_t = log π_old − log μ per token, clamped ±20, detached."""
    return (x.logp_old - x.logp_rollout).clamp(-SAFETY_BOUND, SAFETY_BOUND).detach()


def _masked_ppo(x: LossInputs, cfg: AlgoConfig, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, clipped) of the clipped GRPO surrogate with each sequence kept or dropped by `keep` [B]:
    L = mean_i [ −keep_i · Σ_t min(r_t A_i, clip(r_t, 1−ε_lo, 1+ε_hi) A_i) ] / L_max."""
    obj, clipped = _ppo_token_objective(x, cfg)
    return -(keep.to(obj.dtype) * _seq_sum(obj, x.mask)).mean() / cfg.max_len, clipped


def _seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """mean_t x_t over each sequence's tokens (0 for an empty sequence)."""
    return _seq_sum(x, mask) / mask.sum(-1).clamp(min=1)


@register_loss("icepop")
def icepop(x: LossInputs, cfg: AlgoConfig):
    """verl's token IcePop (rollout_is=token, threshold "lo_hi"):
    L = mean_i [ −Σ_t sg(ρ_t · 1{lo ≤ ρ_t ≤ hi}) · min(r_t A_i, clip(r_t, …) A_i) ] / L_max,
    ρ_t = π_old/μ; the bounds inclusive; a zeroed token stays in the divisor (it is L_max)."""
    obj, clipped = _ppo_token_objective(x, cfg)
    lrho = _token_log_rho(x)
    rho = lrho.exp()
    keep = (rho >= cfg.icepop_lo) & (rho <= cfg.icepop_hi)
    loss = -_seq_sum(rho * keep * obj, x.mask).mean() / cfg.max_len
    return loss, {"clip_frac": _frac(clipped, x.mask), "masked_frac": _frac(~keep, x.mask),
                  **ratio_stats(lrho[x.mask.bool()], "is_weight")}


@register_loss("pg-icepop")
def pg_icepop(x: LossInputs, cfg: AlgoConfig):
    """prime-rl's IcePop loss: r_t = π_θ/μ, not detached, no PPO clip, the mask decided in log space:
    L = mean_i [ −Σ_t 1{log lo ≤ log r_t ≤ log hi} · r_t · A_i ] / L_max."""
    lr = (x.logp - x.logp_rollout).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    d = lr.detach()
    keep = (d >= math.log(cfg.pg_icepop_lo) if cfg.pg_icepop_lo > 0 else torch.ones_like(d, dtype=torch.bool)) \
        & (d <= math.log(cfg.pg_icepop_hi))
    loss = -_seq_sum(keep * lr.exp() * x.advantages.unsqueeze(-1), x.mask).mean() / cfg.max_len
    return loss, {"masked_frac": _frac(~keep, x.mask), **ratio_stats(d[x.mask.bool()], "is_weight")}


@register_loss("trm")
def trm(x: LossInputs, cfg: AlgoConfig):
    """Trust-region masking (verl's rollout_rs=seq_max_k2): a sequence is rejected when any token's
    k2_t = ½ ℓ_t² exceeds τ; L = the clipped GRPO surrogate over the kept sequences:
    L = mean_i [ −1{max_t k2_t ≤ τ} · Σ_t min(r_t A_i, clip(r_t, …) A_i) ] / L_max."""
    k2 = 0.5 * _token_log_rho(x) ** 2
    worst = (k2 * x.mask).amax(-1) if k2.shape[-1] else torch.zeros(k2.shape[0], dtype=k2.dtype, device=k2.device)
    keep = worst <= cfg.trm_k2
    loss, clipped = _masked_ppo(x, cfg, keep)
    return loss, {"clip_frac": _frac(clipped, x.mask), "masked_frac": _frac(~keep)}


@register_loss("grpo-geo-mask")
def grpo_geo_mask(x: LossInputs, cfg: AlgoConfig):
    """Geometric-mean sequence mask (verl's rollout_rs=seq_mean_k1, the *_geo_rs presets): with
    k1_t = log μ − log π_old = −ℓ_t, a sequence is kept when log lo ≤ mean_t k1_t ≤ log hi;
    L = mean_i [ −keep_i · Σ_t min(r_t A_i, clip(r_t, …) A_i) ] / L_max."""
    k1 = _seq_mean(-_token_log_rho(x), x.mask)
    keep = (k1 >= math.log(cfg.geo_lo)) & (k1 <= math.log(cfg.geo_hi))
    loss, clipped = _masked_ppo(x, cfg, keep)
    return loss, {"clip_frac": _frac(clipped, x.mask), "masked_frac": _frac(~keep),
                  **ratio_stats(-k1, "is_weight")}


def _pg_token(x: LossInputs, cfg: AlgoConfig, weight: torch.Tensor) -> torch.Tensor:
    """mean over sequences of −A · Σ_t sg(weight_t) · logp_t / L (a weight per token; _pg_seq's per sequence)."""
    return -_seq_sum(weight.detach() * x.advantages.unsqueeze(-1) * x.logp, x.mask).mean() / cfg.max_len


def _dppo(x: LossInputs, cfg: AlgoConfig, invalid: torch.Tensor):
    """DPPO's loss given the trust region's invalid tokens M̄_t:
    L = mean_i [ −A_i · Σ_t sg(min(π_θ/μ, C)) · (1 − M̄_t) · log π_θ(y_t) ] / L_max."""
    lw = (x.logp - x.logp_rollout).clamp(-SAFETY_BOUND, SAFETY_BOUND).detach()
    w = lw.exp().clamp(max=cfg.dppo_c)
    loss = _pg_token(x, cfg, w * (~invalid))
    return loss, {"masked_frac": _frac(invalid, x.mask), "truncated_frac": _frac(lw.exp() > cfg.dppo_c, x.mask),
                  **ratio_stats(lw[x.mask.bool()], "is_weight")}


def _probs(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(p_t = π_θ(y_t) detached, q_t = μ(y_t), A broadcast to [B, T])."""
    return x.logp.detach().exp(), x.logp_rollout.exp(), x.advantages.unsqueeze(-1).expand_as(x.logp)


@register_loss("dppo-tv")
def dppo_tv(x: LossInputs, cfg: AlgoConfig):
    """DPPO with the binary total-variation trust region (anchored on μ): a token is invalid when
    A > 0 and p_t − q_t > δ, or A < 0 and p_t − q_t < −δ; the loss is _dppo's."""
    p, q, a = _probs(x)
    d = cfg.dppo_tv_delta
    return _dppo(x, cfg, ((a > 0) & (p - q > d)) | ((a < 0) & (p - q < -d)))


def bernoulli_kl(log_q: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """KL_b(q‖p) = q (log q − log p) + (1−q) log((1−q+1e-8)/(1−p+1e-8)): the KL between Bernoulli(q) and
    Bernoulli(p) from log-probabilities, in float64, with Stable-RL's 1e-8 keeping a probability of 1 finite."""
    log_q, log_p = log_q.double(), log_p.double()
    q, p = log_q.exp(), log_p.exp()
    return q * (log_q - log_p) + (1 - q) * ((1 - q + 1e-8) / (1 - p + 1e-8)).log()


@register_loss("dppo-kl")
def dppo_kl(x: LossInputs, cfg: AlgoConfig):
    """DPPO with the binary-KL trust region (anchored on μ): a token is invalid when
    KL_b(q_t‖p_t) > δ and p_t > q_t with A > 0, or p_t < q_t with A < 0; the loss is _dppo's."""
    p, q, a = _probs(x)
    far = bernoulli_kl(x.logp_rollout.detach(), x.logp.detach()) > cfg.dppo_kl_delta
    return _dppo(x, cfg, far & (((a > 0) & (p > q)) | ((a < 0) & (p < q))))


def _cispo(x: LossInputs, cfg: AlgoConfig, lo: float | None, hi: float):
    """L = mean_i [ −A_i · Σ_t sg(clamp(r_t, lo, hi)) · log π_θ(y_t) ] / L_max, r_t = π_θ/π_old."""
    r = (x.logp - x.logp_old).clamp(-SAFETY_BOUND, SAFETY_BOUND).detach().exp()
    w = r.clamp(min=lo, max=hi)
    return _pg_token(x, cfg, w), {"clip_frac": _frac(w != r, x.mask)}


@register_loss("cispo")
def cispo(x: LossInputs, cfg: AlgoConfig):
    """TRL's CISPO: the IS weight truncated above only,
    L = mean_i [ −A_i · Σ_t sg(min(r_t, ε_high)) · log π_θ(y_t) ] / L_max."""
    return _cispo(x, cfg, None, cfg.cispo_eps_hi)


@register_loss("cispo-two-sided")
def cispo_two_sided(x: LossInputs, cfg: AlgoConfig):
    """verl's CISPO: the IS weight clamped on both sides,
    L = mean_i [ −A_i · Σ_t sg(clamp(r_t, 1−ε_lo, 1+ε_hi)) · log π_θ(y_t) ] / L_max."""
    return _cispo(x, cfg, 1 - cfg.eps_lo, 1 + cfg.eps_hi)


@register_loss("ipo")
def ipo(x: LossInputs, cfg: AlgoConfig):
    """prime-rl's IPO: r_t = π_θ/μ not detached, a token masked when |p_t − q_t| > ε (probabilities),
    L = mean_i [ Σ_t ( −1{|p_t − q_t| ≤ ε} · r_t · A_i + β · (log r_t)² ) ] / L_max."""
    lr = (x.logp - x.logp_rollout).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    p, q, a = _probs(x)
    keep = (p - q).abs() <= cfg.ipo_eps
    per_token = -(keep * lr.exp() * a) + cfg.ipo_kl_coef * lr ** 2
    loss = _seq_sum(per_token, x.mask).mean() / cfg.max_len
    return loss, {"masked_frac": _frac(~keep, x.mask), **ratio_stats(lr.detach()[x.mask.bool()], "is_weight")}


def _opsm(x: LossInputs, cfg: AlgoConfig, anchor: torch.Tensor, delta: float):
    """Off-policy sequence masking: drop sequence i when A_i < 0 and mean_t (anchor_t − log π_θ(y_t)) > δ
    (π_θ detached), on the clipped GRPO surrogate."""
    drift = _seq_mean(anchor - x.logp.detach(), x.mask)
    keep = ~((x.advantages < 0) & (drift > delta))
    loss, clipped = _masked_ppo(x, cfg, keep)
    return loss, {"clip_frac": _frac(clipped, x.mask), "masked_frac": _frac(~keep)}


@register_loss("opsm")
def opsm(x: LossInputs, cfg: AlgoConfig):
    """TRL's OPSM (DeepSeek-V3.2), anchored on μ: drop i when A_i < 0 and mean_t log(μ/π_θ) > δ;
    L = mean_i [ −keep_i · Σ_t min(r_t A_i, clip(r_t, …) A_i) ] / L_max."""
    return _opsm(x, cfg, x.logp_rollout, cfg.opsm_delta)


@register_loss("opsm-old")
def opsm_old(x: LossInputs, cfg: AlgoConfig):
    """slime's OPSM, anchored on π_old: drop i when A_i < 0 and mean_t log(π_old/π_θ) > δ; with one
    update per batch π_θ = π_old at the update and nothing is dropped (the rule bites from the second)."""
    return _opsm(x, cfg, x.logp_old, cfg.opsm_old_delta)


# ------------------------------------------------------------------ Score Centering

def sc_weights(logp: torch.Tensor, logq: torch.Tensor, hi: float) -> torch.Tensor:
    """w = min(p/q, hi) from log-probabilities (p = π_θ, q = μ; detached), 0/0-safe: where q = 0 the
    weight is hi (it multiplies q = 0 in the centering sum, and μ never sampled such a token)."""
    lw = (logp.detach() - logq).clamp(max=math.log(hi))
    return torch.where(torch.isfinite(logq), lw.exp(), torch.full_like(lw, hi))


@register_loss("sc")
def score_centering(x: LossInputs, cfg: AlgoConfig):
    """Score Centering (arXiv 2609.20807; vime's score_centering_correction with its TIS weights):
    L = mean_i [ −A_i · Σ_t ( sg(w_t) · log π_θ(y_t) − center_t ) ] / L_max,
    w_t = min(π_θ(y_t)/μ(y_t), hi), center_t = Σ_v sg(μ_v · min(π_θ(v)/μ(v), hi)) · log π_θ(v): the
    gradient is A · (w_a ∇log π_θ(a) − Σ_v μ_v w_v ∇log π_θ(v)), the score centred by its expectation
    under μ, exact over μ's whole vocabulary (the built-in engine records it)."""
    if x.center is None:
        raise ConfigError("sc needs μ's whole distribution at every position: the built-in rollout engine "
                          "records it (--engine torch); vLLM returns the sampled token's log-prob only")
    w = sc_weights(x.logp, x.logp_rollout, cfg.sc_tis_hi)
    per_token = w * x.logp - x.center
    loss = -(x.advantages * _seq_sum(per_token, x.mask)).mean() / cfg.max_len
    return loss, {"truncated_frac": _frac(x.logp.detach() - x.logp_rollout > math.log(cfg.sc_tis_hi), x.mask),
                  **ratio_stats((x.logp.detach() - x.logp_rollout)[x.mask.bool()], "is_weight")}
