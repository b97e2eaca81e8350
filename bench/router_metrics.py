"""Router agreement between the rollout and the training engine, as pure tensor functions.

Inputs: the routes (bench/routes.py) of the positions that score the sampled tokens — the
position that predicts response token t, as its log-probability is computed there — from the
rollout engine `a` and the training engine `b`, int [B, T, L, k] (UNKNOWN = −1 where not
recorded), and the response mask [B, T]. A (token, layer) pair *flips* when the two top-k
expert sets differ as sets (order within the top-k does not count); a token flips when any of
its layers does. Only tokens whose routes both engines recorded count.

    router_flip_frac        flipped (token, layer) pairs / (token, layer) pairs
    router_token_flip_frac  flipped tokens / tokens
    router_tokens           tokens compared

and the mismatch of the sampled tokens split by whether they flipped (d_t = log π_t − log μ_t):

    kl_k3_router_flipped / _unflipped               mean of e^{d_t} − 1 − d_t over those tokens
    abs_logp_diff_mean_router_flipped / _unflipped  mean |d_t| over those tokens

(NaN for an empty group: the trainer stores it as null.)
"""

from __future__ import annotations

import math

import torch


def flips(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, T, L] bool: the top-k sets of `a` and `b` ([B, T, L, k]) differ at that (token, layer)."""
    return (a.sort(dim=-1).values != b.sort(dim=-1).values).any(dim=-1)


def known(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: response tokens (mask) whose routes both engines recorded in every layer."""
    return mask.bool() & (a >= 0).all(-1).all(-1) & (b >= 0).all(-1).all(-1)


def router_flip_frac(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of the compared (token, layer) pairs whose top-k sets differ."""
    sel = known(a, b, mask)
    f = flips(a, b)[sel]
    return f.float().mean().item() if f.numel() else math.nan


def router_token_flip_frac(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of the compared tokens with at least one layer whose top-k sets differ."""
    sel = known(a, b, mask)
    f = flips(a, b).any(-1)[sel]
    return f.float().mean().item() if f.numel() else math.nan


def _k3(d: torch.Tensor) -> float:
    return (torch.expm1(d) - d).mean().item() if d.numel() else math.nan


def _abs(d: torch.Tensor) -> float:
    return d.abs().mean().item() if d.numel() else math.nan


def split_mismatch(logp_mu: torch.Tensor, logp_pi: torch.Tensor, sel: torch.Tensor,
                   flipped: torch.Tensor) -> dict[str, float]:
    """k3 and mean |Δlog p| of the tokens in `sel` [B, T], split by `flipped` [B, T]."""
    d = logp_pi.double() - logp_mu.double()
    out = {}
    for name, group in (("flipped", sel & flipped), ("unflipped", sel & ~flipped)):
        out[f"kl_k3_router_{name}"] = _k3(d[group])
        out[f"abs_logp_diff_mean_router_{name}"] = _abs(d[group])
    return out


def router_metrics(a: torch.Tensor, b: torch.Tensor, logp_mu: torch.Tensor, logp_pi: torch.Tensor,
                   mask: torch.Tensor) -> dict[str, float]:
    """Every router metric of the module docstring for one batch: `a` the rollout's routes,
    `b` the trainer's, both [B, T, L, k] at the positions scoring the response tokens."""
    sel = known(a, b, mask)
    return {"router_flip_frac": router_flip_frac(a, b, mask),
            "router_token_flip_frac": router_token_flip_frac(a, b, mask),
            "router_tokens": float(sel.sum()),
            **split_mismatch(logp_mu, logp_pi, sel, flips(a, b).any(-1))}


def at_positions(routes: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The routes [N, W, L, k] at the positions `pos` [N, T] (runners/logprobs.pack's: the
    position scoring each response token): [N, T, L, k]."""
    idx = pos.long().cpu().view(*pos.shape, 1, 1).expand(-1, -1, *routes.shape[2:])
    return routes.gather(1, idx)
