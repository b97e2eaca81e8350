"""Training–inference mismatch metrics as pure tensor functions.

Inputs are per-token log-probabilities of the *sampled* tokens, [B, T], from the rollout
engine (log μ) and the training engine (log π) at the same parameters, and the response
mask [B, T]. Sign conventions are the paper's: Δp = π − μ; KL[μ‖π] = E_μ[log μ − log π].
"""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[mask.bool()]


def kl_k1(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> float:
    """KL[μ‖π] ≈ mean over sequences of Σ_t (log μ_t − log π_t)  (nats; k1, unbiased, noisy)."""
    per_seq = ((logp_mu - logp_pi) * mask).sum(-1)
    return per_seq.mean().item() if per_seq.numel() else 0.0


def kl_k1_stderr(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> float:
    """Standard error of `kl_k1` over sequences (at fp16 the estimate sits at its noise floor)."""
    per_seq = ((logp_mu - logp_pi) * mask).sum(-1)
    n = per_seq.numel()
    return (per_seq.std(unbiased=True) / math.sqrt(n)).item() if n > 1 else 0.0


def kl_k2(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> float:
    """Per-token ½·E_μ[(log π − log μ)²] (k2)."""
    d = _masked(logp_pi - logp_mu, mask)
    return (0.5 * d.pow(2)).mean().item() if d.numel() else 0.0


def kl_k3(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> float:
    """Per-token k3 = E_μ[(π/μ − 1) − log(π/μ)] ≥ 0, an unbiased low-variance KL[μ‖π] estimate."""
    d = _masked(logp_pi - logp_mu, mask).double()
    return (torch.expm1(d) - d).mean().item() if d.numel() else 0.0


def prob_diff_stats(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """max, min and mean |·| of Δp = π − μ over the sampled tokens, in probability."""
    d = _masked(logp_pi.double().exp() - logp_mu.double().exp(), mask)
    if not d.numel():
        return {"prob_diff_max": 0.0, "prob_diff_min": 0.0, "prob_abs_diff_mean": 0.0}
    return {"prob_diff_max": d.max().item(), "prob_diff_min": d.min().item(),
            "prob_abs_diff_mean": d.abs().mean().item()}


def log_ratio_slope(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Least-squares slope of log(π(y)/μ(y)) = Σ_t(log π_t − log μ_t) against response length,
    per 1,000 tokens, with its standard error. (0, 0) when lengths do not vary."""
    y = ((logp_pi - logp_mu) * mask).sum(-1).double()
    x = mask.sum(-1).double()
    n = x.numel()
    if n < 3 or x.var() == 0:
        return 0.0, 0.0
    xc, yc = x - x.mean(), y - y.mean()
    sxx = (xc * xc).sum()
    slope = (xc * yc).sum() / sxx
    resid = yc - slope * xc
    se = torch.sqrt((resid * resid).sum() / (n - 2) / sxx)
    return slope.item() * 1000, se.item() * 1000


def ratio_stats(log_ratio: torch.Tensor, prefix: str) -> dict[str, float]:
    """min / mean / max of exp(log_ratio) and its normalised effective sample size
    ESS = (Σw)² / (N·Σw²) ∈ (0, 1]."""
    if not log_ratio.numel():
        return {f"{prefix}_min": 1.0, f"{prefix}_mean": 1.0, f"{prefix}_max": 1.0, f"{prefix}_ess": 1.0}
    w = log_ratio.double().clamp(-20, 20).exp()
    return {f"{prefix}_min": w.min().item(), f"{prefix}_mean": w.mean().item(), f"{prefix}_max": w.max().item(),
            f"{prefix}_ess": (w.sum() ** 2 / (w.numel() * (w * w).sum())).item()}


def mismatch_metrics(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Every mismatch metric of DESIGN.md for one batch of sampled tokens."""
    logp_mu, logp_pi, mask = logp_mu.detach().float(), logp_pi.detach().float(), mask.float()
    k1 = kl_k1(logp_mu, logp_pi, mask)
    slope, slope_se = log_ratio_slope(logp_mu, logp_pi, mask)
    seq_lr = ((logp_pi - logp_mu) * mask).sum(-1)
    out = {"kl_k1": k1, "kl_k1_bits": k1 / LN2, "kl_k1_stderr": kl_k1_stderr(logp_mu, logp_pi, mask),
           "kl_k2": kl_k2(logp_mu, logp_pi, mask), "kl_k3": kl_k3(logp_mu, logp_pi, mask),
           **prob_diff_stats(logp_mu, logp_pi, mask),
           "log_ratio_slope": slope, "log_ratio_slope_se": slope_se}
    out.update(ratio_stats(seq_lr, "is_ratio_seq"))
    out.update(ratio_stats(_masked(logp_pi - logp_mu, mask), "is_ratio_token"))
    return out
