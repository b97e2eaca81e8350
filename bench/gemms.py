"""The GEMMs of the quantized formats and the training side's straight-through estimator.

    split_k_matmul   x Wᵀ in fp32 with K split in slices, summed in a stated order (GPU decode GEMMs)
    scaled_mm        fp32 sum of code products, then per-token × per-channel scales, one rounding
    w8a8_matmul      the activation quantized at run time, then scaled_mm (vLLM's W8A8 GEMM)
    int_mm_exact     whether torch._int_mm sums int8 products exactly on this CPU (probed once)
    W8A8STE          the training copy's W8A8 linear: the rollout's forward, a straight-through backward

A quantizer (bench/quantizers.py) says how codes and scales are made; these say how they are
multiplied.
"""

from __future__ import annotations

from functools import lru_cache

import torch


def w8a8_matmul(q, x: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                split_k: int = 1, w_gemm: torch.Tensor | None = None) -> torch.Tensor:
    """y = (Σ_k xq_k · wq_k) · s_x · s_w + b, rounded once to `out_dtype`: activations quantized
    per token at run time, the products of codes accumulated in fp32, the scales applied after
    the sum as a scaled-GEMM epilogue does. The sum is exact for int8 while K·127² < 2^24 (K ≤
    1040); an e4m3 product spans 2^-18 … 2^17.6, wider than fp32's 24 bits, so its fp32 sum
    rounds and depends on the order of summation (`split_k`). w_codes [out, in], w_scale [out, 1];
    w_gemm: w_codes as fp32, already made."""
    xc, xs = q.quantize32(x)
    return scaled_mm(xc, xs, w_codes if w_gemm is None else w_gemm, w_scale, bias, out_dtype, split_k)


def split_k_matmul(x: torch.Tensor, w: torch.Tensor, splits: int = 1) -> torch.Tensor:
    """x Wᵀ in fp32 with the reduction dimension split in `splits` equal slices (split-K, as GPU
    decode GEMMs reduce): P_s = x[:, K_s] W[:, K_s]ᵀ, each an fp32 GEMM, then
        y = ((P_0 + P_1) + P_2) + … + P_{S−1}   (fp32, in that order).
    The same real sum as one GEMM, another fp32 rounding order. splits = 1, or a K not divisible
    by `splits`: one GEMM. x [..., K], w [N, K], both fp32."""
    k = x.shape[-1]
    if splits <= 1 or k % splits:
        return torch.matmul(x, w.t())
    xs = x.reshape(-1, splits, k // splits).transpose(0, 1)                 # [S, M, K/S]
    ws = w.reshape(w.shape[0], splits, k // splits).permute(1, 2, 0)        # [S, K/S, N]
    p = torch.bmm(xs, ws)                                                   # the S partials
    # added left to right in place: the order by construction (tests/bench/test_rollout_kernels.py has
    # the hand test), and at decode sizes ~1.8× faster on a CPU than torch's sum over dim 0
    y = p[0] + p[1]
    for s in range(2, splits):
        y.add_(p[s])
    return y.reshape(*x.shape[:-1], w.shape[0])


def scaled_mm(x_codes, x_scale, w_codes, w_scale, bias=None, out_dtype: torch.dtype = torch.bfloat16,
              split_k: int = 1) -> torch.Tensor:
    """The GEMM of w8a8_matmul on codes already made: fp32 sum of code products (`split_k`
    slices, split_k_matmul), then the per-token and per-channel scales, the bias, one rounding
    to `out_dtype`."""
    return scale_epilogue(split_k_matmul(x_codes.float(), w_codes.float(), split_k), x_scale, w_scale, bias,
                           out_dtype)


def scale_epilogue(y: torch.Tensor, x_scale, w_scale, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """y (a new fp32 tensor of code-product sums, scaled in place) · s_x · s_w + b, rounded once
    to `out_dtype`."""
    y.mul_(x_scale).mul_(w_scale.float().reshape(1, -1))
    if bias is not None:
        y.add_(bias.float())
    return y.to(out_dtype)


class W8A8STE(torch.autograd.Function):
    """The training side of a W8A8 format (bench/model_formats.py's compute copy, bench/moe.py's
    experts). Forward: the rollout engine's W8A8 arithmetic (same codes, same fp32 sum, same
    rounding). Backward: straight through the quantizers, i.e. the gradient of
    y = x̂ ŵᵀ + b at the dequantized operands x̂, ŵ: ∂x = g ŵ, ∂w = gᵀ x̂, ∂b = Σ g (fp32)."""

    @staticmethod
    def forward(ctx, x, w, bias, fmt):
        q = fmt.quant
        xc, xs = q.quantize32(x)
        wc, ws = q.quantize32(w)                 # a W8A8 weight's codes and scales are per row, as x's
        ctx.save_for_backward(q.dequantize(xc, xs), q.dequantize(wc, ws))
        ctx.dtypes = (x.dtype, w.dtype, None if bias is None else bias.dtype)
        return scaled_mm(xc, xs, wc, ws, bias, fmt.dtype)

    @staticmethod
    def backward(ctx, gy):
        xd, wd = ctx.saved_tensors
        x_dt, w_dt, b_dt = ctx.dtypes
        g = gy.float()
        g2 = g.reshape(-1, g.shape[-1])
        gx = (g @ wd).to(x_dt) if ctx.needs_input_grad[0] else None
        gw = (g2.t() @ xd.reshape(-1, xd.shape[-1])).to(w_dt) if ctx.needs_input_grad[1] else None
        gb = g2.sum(0).to(b_dt) if b_dt is not None and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None


INT_EXACT = 2 ** 24            # integers up to here are exact in fp32


@lru_cache(maxsize=1)
def int_mm_exact() -> bool:
    """Whether torch._int_mm sums int8 products exactly in int32 on this CPU, probed once a
    process. Which path oneDNN takes is the CPU's own: on an AVX512-VNNI CPU held to AVX2
    (ONEDNN_MAX_CPU_ISA) its int8 GEMM adds pairs of u8·s8 products in int16 with saturation
    (128 products of 127·127 come out 16,320, not 2,064,512), while a real AVX2-only CPU was
    seen to sum them exactly. So nothing is assumed from the ISA; the probe: codes at ±127
    (where pairs saturate) and random codes, at three shapes, against float64 sums (exact
    here)."""
    g = torch.Generator().manual_seed(0)
    for m, k, n in ((1, 128, 8), (4, 384, 85), (64, 128, 96)):
        a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
        a[0], w[0] = 127, 127
        w[1] = -127
        try:
            got = torch._int_mm(a, w.t())
        except RuntimeError:
            return False
        if not torch.equal(got.double(), a.double() @ w.double().t()):
            return False
    return True
