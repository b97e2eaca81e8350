"""Training–inference mismatch metrics as pure tensor functions.

Inputs are per-token log-probabilities of the *sampled* tokens, [B, T], from the rollout
engine (log μ) and the training engine (log π) at the same parameters, and the response
mask [B, T]. Sign conventions are the paper's: Δp = π − μ; KL[μ‖π] = E_μ[log μ − log π].

Besides bench's own metrics, the ones verl 0.9.1 logs as `rollout_corr/*`
(`rollout_corr_helper.compute_offpolicy_metrics`) and `training/rollout_probs_diff_*`
(`utils/debug/metrics.py`) are computed here exactly as verl computes them, so that native
and verl runs fill the same columns (tests/runners/test_verl_metrics.py checks them against verl):
`kl_k1_token`, `chi2_token`, `chi2_seq`, `ppl_*`, `log_ppl_*`, `prob_abs_diff_max`/`_std`.
Where verl averages a per-sequence quantity, a sequence without response tokens counts with
its per-token mean taken as 0 (verl's `masked_mean` of an empty row), as below.
"""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)
SAFETY_BOUND = 20.0          # |log ratio| clamp before exp, as verl's rollout_corr_helper


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


def kl_k1_token(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> float:
    """Per-token mean of the log ratio, Σ_it m_it (log μ_it − log π_it) / Σ_it m_it (nats per token;
    verl's `rollout_corr/kl`). Not `kl_k1`, which sums over each sequence's tokens first."""
    d = _masked(logp_mu.double() - logp_pi.double(), mask)
    return d.mean().item() if d.numel() else 0.0


def kl_k2(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> float:
    """Per-token ½·E_μ[(log π − log μ)²] (k2)."""
    d = _masked(logp_pi - logp_mu, mask)
    return (0.5 * d.pow(2)).mean().item() if d.numel() else 0.0


def kl_k3(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> float:
    """Per-token k3 = E_μ[(π/μ − 1) − log(π/μ)] ≥ 0, an unbiased low-variance KL[μ‖π] estimate."""
    d = _masked(logp_pi - logp_mu, mask).double()
    return (torch.expm1(d) - d).mean().item() if d.numel() else 0.0


def chi2_token(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> float:
    """Token-level χ²(π‖μ) = E_tokens[ρ_t²] − 1, ρ_t = exp(clamp(log π_t − log μ_t, ±20))
    (verl's `rollout_corr/chi2_token`: the variance of the per-token IS weight)."""
    d = _masked(logp_pi.double() - logp_mu.double(), mask)
    return (d.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().pow(2).mean() - 1.0).item() if d.numel() else 0.0


def chi2_seq(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> float:
    """Sequence-level χ²(π‖μ) = mean_i exp(2·clamp(Σ_t(log π_it − log μ_it), ±20)) − 1 over every
    sequence (verl's `rollout_corr/chi2_seq`: the variance of the sequence IS weight ρ_i = Π_t ρ_it)."""
    s = torch.where(mask.bool(), logp_pi.double() - logp_mu.double(), 0.0).sum(-1)
    return ((2.0 * s.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp().mean() - 1.0).item() if s.numel() else 0.0


def _seq_token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean over response tokens, [B]; 0 for a sequence without any."""
    return torch.where(mask.bool(), x.double(), 0.0).sum(-1) / mask.double().sum(-1).clamp(min=1.0)


def perplexity_stats(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Perplexities of the training engine (π) and the rollout engine (μ) on the sampled tokens,
    as verl's `rollout_corr/*_ppl` (each a mean over sequences of a per-sequence quantity).
    With ℓπ_i = mean_t log π_it and ℓμ_i = mean_t log μ_it, d_i = ℓμ_i − ℓπ_i = log(pplπ_i / pplμ_i):
      ppl_training = mean_i exp(−ℓπ_i),   log_ppl_training = mean_i(−ℓπ_i)      (training_ppl, training_log_ppl)
      ppl_rollout  = mean_i exp(−ℓμ_i),   log_ppl_rollout  = mean_i(−ℓμ_i)      (rollout_ppl, rollout_log_ppl)
      log_ppl_diff = mean_i d_i,  log_ppl_abs_diff = mean_i |d_i|,  log_ppl_diff_max / _min = max_i / min_i d_i
      ppl_ratio    = mean_i exp(d_i) = mean_i pplπ_i / pplμ_i   (> 1: the trainer finds the samples less likely)."""
    if not mask.shape[0]:
        return {"ppl_training": 1.0, "log_ppl_training": 0.0, "ppl_rollout": 1.0, "log_ppl_rollout": 0.0,
                "log_ppl_diff": 0.0, "log_ppl_abs_diff": 0.0, "log_ppl_diff_max": 0.0, "log_ppl_diff_min": 0.0,
                "ppl_ratio": 1.0}
    lp, lm = _seq_token_mean(logp_pi, mask), _seq_token_mean(logp_mu, mask)
    d = lm - lp
    return {"ppl_training": (-lp).exp().mean().item(), "log_ppl_training": (-lp).mean().item(),
            "ppl_rollout": (-lm).exp().mean().item(), "log_ppl_rollout": (-lm).mean().item(),
            "log_ppl_diff": d.mean().item(), "log_ppl_abs_diff": d.abs().mean().item(),
            "log_ppl_diff_max": d.max().item(), "log_ppl_diff_min": d.min().item(),
            "ppl_ratio": d.exp().mean().item()}


def prob_diff_stats(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """max and min of Δp = π − μ (signed) over the sampled tokens, in probability, and the mean,
    max and standard deviation (unbiased) of |Δp| (verl's `training/rollout_probs_diff_{mean,max,std}`)."""
    d = _masked(logp_pi.double().exp() - logp_mu.double().exp(), mask)
    if not d.numel():
        return {"prob_diff_max": 0.0, "prob_diff_min": 0.0, "prob_abs_diff_mean": 0.0, "prob_abs_diff_max": 0.0,
                "prob_abs_diff_std": 0.0}
    a = d.abs()
    return {"prob_diff_max": d.max().item(), "prob_diff_min": d.min().item(),
            "prob_abs_diff_mean": a.mean().item(), "prob_abs_diff_max": a.max().item(),
            "prob_abs_diff_std": a.std().item() if a.numel() > 1 else 0.0}


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
    """Every mismatch metric of docs/metrics.md for one batch of sampled tokens."""
    logp_mu, logp_pi, mask = logp_mu.detach().float(), logp_pi.detach().float(), mask.float()
    k1 = kl_k1(logp_mu, logp_pi, mask)
    slope, slope_se = log_ratio_slope(logp_mu, logp_pi, mask)
    seq_lr = ((logp_pi - logp_mu) * mask).sum(-1)
    out = {"kl_k1": k1, "kl_k1_bits": k1 / LN2, "kl_k1_stderr": kl_k1_stderr(logp_mu, logp_pi, mask),
           "kl_k1_token": kl_k1_token(logp_mu, logp_pi, mask),
           "kl_k2": kl_k2(logp_mu, logp_pi, mask), "kl_k3": kl_k3(logp_mu, logp_pi, mask),
           "chi2_token": chi2_token(logp_mu, logp_pi, mask), "chi2_seq": chi2_seq(logp_mu, logp_pi, mask),
           **perplexity_stats(logp_mu, logp_pi, mask),
           **prob_diff_stats(logp_mu, logp_pi, mask),
           "log_ratio_slope": slope, "log_ratio_slope_se": slope_se}
    out.update(ratio_stats(seq_lr, "is_ratio_seq"))
    out.update(ratio_stats(_masked(logp_pi - logp_mu, mask), "is_ratio_token"))
    return out


LENGTH_EDGES = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def length_buckets(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor,
                   edges: tuple[int, ...] = LENGTH_EDGES) -> list[dict]:
    """How the mismatch grows with the response length |y| (the paper's argument: it accumulates
    over tokens). Sequences are bucketed by |y| = Σ_t mask_t into [edges_j, edges_j+1) (the last
    bucket open above); for each non-empty bucket:

        sequences, tokens
        k3        = mean over its tokens of (ρ_t − 1) − log ρ_t,  log ρ_t = log π_t − log μ_t
        seq_log_ratio_mean / _var = mean / population variance over its sequences of
                    ℓ = Σ_t log ρ_t  (Var ℓ sets the variance of a sequence IS weight w = e^ℓ)
        abs_log_w = mean over its sequences of |ℓ|
    """
    logp_mu, logp_pi, mask = logp_mu.detach().double(), logp_pi.detach().double(), mask.double()
    d = (logp_pi - logp_mu) * mask
    lengths = mask.sum(-1)
    seq = d.sum(-1)
    out = []
    for j, lo in enumerate(edges):
        hi = edges[j + 1] if j + 1 < len(edges) else None
        rows = (lengths >= lo) & ((lengths < hi) if hi is not None else torch.ones_like(lengths, dtype=torch.bool))
        rows &= lengths > 0
        n = int(rows.sum())
        if not n:
            continue
        tok = d[rows][mask[rows].bool()]
        ell = seq[rows]
        out.append({"min_len": lo, "max_len": hi, "sequences": n, "tokens": int(mask[rows].sum()),
                    "k3": (torch.expm1(tok) - tok).mean().item(),
                    "seq_log_ratio_mean": ell.mean().item(),
                    "seq_log_ratio_var": ell.var(unbiased=False).item(),
                    "abs_log_w": ell.abs().mean().item()})
    return out
