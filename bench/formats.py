"""Number formats: one small object per format in one registry (`FORMATS`).

A format says how an engine stores and multiplies: `dtype` is the storage dtype of every
parameter it does not quantize (and of activations and linear outputs); `quant`, when set,
is the W8A8 (or W4A4) quantizer of every linear layer (lm_head included; embeddings and norms
stay in `dtype`); `head32` keeps lm_head and the logits in fp32. `cast` / `quantize` / `matmul`
are the three operations; bench/format_modules.py applies them to a model for either engine.

    fp32, fp16, bf16   parameters in that dtype (buffers such as RoPE's stay fp32)
    bf16+head32        bf16, except an fp32 lm_head and fp32 logits (vLLM's
                       hf_overrides={"head_dtype": "float32"}, SGLang's enable_fp32_lm_head,
                       TRL's cast_lm_head_to_fp32); rollout or training
    bf16+router32,     MoE models: bf16 / fp16, except every router (the gate's linear layer and
    fp16+router32      its softmax) in fp32 from the 16-bit hidden state, as prime-rl ships;
                       rollout or training; the built-in engine only. On a dense model the same
                       as bf16 / fp16. Not in `all` (bench/moe.py has the router's arithmetic)
    fp8                W8A8 e4m3 as vLLM's online `fp8_per_channel` (llm-compressor's
                       FP8_DYNAMIC): weight scale per output channel amax/448, activation scale
                       per token at run time amax/448, codes = torch's float8_e4m3fn rounding
                       (round-to-nearest-even) of the value clamped to ±448, products
                       accumulated in fp32, output bf16; rollout or training (Jet-RL's unified
                       cell: the same quantizers with a straight-through backward)
    int8               W8A8 symmetric int8: the same scales with 127, round-half-to-even,
                       clamped to ±127 (never -128: the grid stays symmetric, as amax/127
                       scaling implies; -128 is reachable only by a rounding overshoot),
                       fp32 accumulation, bf16 output; rollout only
    nvfp4              W4A4 NVFP4 (NVIDIA's Blackwell format; vLLM's `modelopt_fp4` checkpoints):
                       e2m1 values {0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6} in blocks of 16 along
                       the input dimension, each block with an e4m3 scale amax_b/6 relative to
                       an fp32 global scale amax/(448·6) — per tensor for weights, per token at
                       run time for activations (a checkpoint's calibrated static activation
                       scale does not exist for an online format). Round-to-nearest-even onto
                       e2m1, saturating at ±6; block products accumulated in fp32, bf16 output;
                       rollout only; the built-in engine only (vLLM has no online NVFP4)

The clamp comes before the cast on purpose: torch 2.13 on CPU saturates a float8 cast, but
the standard (and CUDA's) conversion of a value past 448 gives NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch

from bench.errors import BenchError


class PrecisionError(BenchError, ValueError):
    """A dtype or precision pair that cannot be parsed or run; the message says what to write."""


# ------------------------------------------------------------------ grids

def float_step(v: torch.Tensor, mantissa_bits: int, min_exp: int) -> torch.Tensor:
    """Spacing of a binary floating-point grid at |v|: 2^(max(⌊log2|v|⌋, min_exp) − mantissa_bits)
    (subnormals and 0 take the smallest normal binade's spacing). fp32: (23, −126), bf16:
    (7, −126), fp16: (10, −14), e4m3: (3, −6)."""
    _, e = torch.frexp(v.float().abs())              # |v| = m·2^e, m ∈ [0.5, 1): ⌊log2|v|⌋ = e − 1
    exp = torch.where(v == 0, torch.full_like(e, min_exp), (e - 1).clamp(min=min_exp))
    return torch.ldexp(torch.ones_like(v, dtype=torch.float32), exp - mantissa_bits)


def fp32_grid_step(v: torch.Tensor, mantissa_bits: int, min_exp: int) -> torch.Tensor:
    """float_step(v, mantissa_bits, min_exp) for finite fp32 `v` by bit arithmetic, in three
    elementwise ops: with E = v's exponent field (bits 23–30, 127 = 2^0), the step's own fp32 bits are
        max(E − mantissa_bits, 127 + min_exp − mantissa_bits) << 23,
    i.e. (bits(v) & 0x7F800000) − mantissa_bits·2^23, clamped below. Only for a grid whose
    smallest step is a normal fp32 number (e4m3, e2m1; not fp32's or bf16's own grids)."""
    lowest = 127 + min_exp - mantissa_bits
    if lowest < 1:
        raise ValueError(f"the grid's smallest step 2^{min_exp - mantissa_bits} is not a normal fp32 number")
    bits = v.view(torch.int32) & 0x7F800000
    return bits.sub_(mantissa_bits << 23).clamp_(min=lowest << 23).view(torch.float32)


FLOAT_GRIDS = {torch.float32: (23, -126), torch.bfloat16: (7, -126), torch.float16: (10, -14)}


# ------------------------------------------------------------------ quantizers

@dataclass(frozen=True)
class Quantizer:
    """Symmetric quantization with one scale per row (the last dimension): weights per
    output channel ([out, in]), activations per token ([..., in]). scale = amax/qmax
    (1 for an all-zero row), code = q(x/scale) on the format's grid."""

    name: str
    qmax: float
    code_dtype: torch.dtype

    def scales(self, x: torch.Tensor) -> torch.Tensor:
        amax = x.detach().float().abs().amax(dim=-1, keepdim=True)
        return torch.where(amax > 0, amax / self.qmax, torch.ones_like(amax))

    def codes(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes in `code_dtype`, fp32 scales [..., 1])."""
        s = self.scales(x)
        return self.codes(x, s), s

    def quantize_weight(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A weight's codes and scales (the same as an activation's for per-row scaling)."""
        return self.quantize(w)

    def code_values(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """codes(x, scale) as fp32 values (exact: every code is an fp32 number), which the fp32
        GEMMs multiply; a subclass makes them without the round trip through `code_dtype`."""
        return self.codes(x, scale).float()

    def quantize32(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """quantize(x) with the codes as fp32 values (code_values): (codes, fp32 scales [..., 1])."""
        s = self.scales(x)
        return self.code_values(x, s), s

    def dequantize(self, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return codes.float() * scale

    def fake(self, x: torch.Tensor) -> torch.Tensor:
        """quantize then dequantize, fp32."""
        return self.dequantize(*self.quantize(x))

    def step(self, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The grid spacing at each code, in the units of the value (× scale)."""
        raise NotImplementedError

    def same(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Elementwise: are two codes identical."""
        return a == b

    fused_global_scale = False    # members of a fused projection share the weight's global scale

    def gemm_weight(self, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The weight operand of `matmul`, which the engine keeps beside the codes and remakes at
        each sync (`w_gemm`) instead of converting it at every call: the codes as fp32."""
        return codes.float()

    def matmul(self, x: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor, bias=None,
               out_dtype: torch.dtype = torch.bfloat16, w_gemm: torch.Tensor | None = None,
               split_k: int = 1) -> torch.Tensor:
        """y = x Wᵀ + b with x quantized at run time (w8a8_matmul). `w_gemm`: gemm_weight(w_codes,
        w_scale), already made (the same values)."""
        return w8a8_matmul(self, x, w_codes, w_scale, bias, out_dtype, split_k, w_gemm)


E4M3_MAX = 448.0                # the largest finite float8_e4m3fn value
E4M3_MIN_SUBNORMAL = 2.0 ** -9  # its smallest positive value


class FP8E4M3(Quantizer):
    def __init__(self):
        super().__init__("e4m3", E4M3_MAX, torch.float8_e4m3fn)

    def codes(self, x, scale):
        return (x.float() / scale).clamp(-self.qmax, self.qmax).to(torch.float8_e4m3fn)

    def code_values(self, x, scale):
        """The e4m3 rounding of x/scale in fp32: v/step rounded half to even, times step, where
        step = 2^(max(⌊log2|v|⌋, −6) − 3) is e4m3's spacing at v (3 mantissa bits; subnormals
        below 2^−6 share 2^−9), made from v's fp32 exponent bits (fp32_grid_step). The same
        values as the conversion to float8_e4m3fn and back (round to nearest even; |v| ≤ 448
        after the clamp), in about half its time on a CPU (torch converts from float8 element by element)."""
        v = (x.float() / scale).clamp_(-self.qmax, self.qmax)
        step = fp32_grid_step(v, 3, -6)
        return v.div_(step).round_().mul_(step)

    def step(self, codes, scale):
        return float_step(codes.float(), 3, -6) * scale

    def same(self, a, b):          # bit patterns (a float8 NaN would never equal itself)
        return a.view(torch.uint8) == b.view(torch.uint8)


class Int8(Quantizer):
    def __init__(self):
        super().__init__("int8", 127.0, torch.int8)

    def codes(self, x, scale):
        return self.code_values(x, scale).to(torch.int8)

    def code_values(self, x, scale):
        # round: half to even; + 0 makes a rounded −0 the int8 code's +0
        return torch.round(x.float() / scale).clamp_(-127, 127).add_(0.0)

    def step(self, codes, scale):
        return scale.expand_as(codes).float()

    def matmul(self, x, w_codes, w_scale, bias=None, out_dtype=torch.bfloat16, w_gemm=None, split_k=1):
        """w8a8_matmul, with the code products summed in int32 on a CPU where that is exact:
        while K·127² < 2^24 (K ≤ 1,040) every partial sum of code products is an integer below
        2^24, which fp32 holds exactly, so the fp32 GEMM's sum is the same number in any order
        and split-K's too. There the int8 GEMM (torch._int_mm, VNNI on x86) gives the same bits
        at ~3.5× the fp32 GEMM's speed (tiny-math shapes on a CPU with VNNI; where torch's int8
        GEMM saturates, `int_mm_exact` says so and the fp32 GEMM runs). A zero sum is +0 on
        both paths (the fp32 GEMM starts its sums at +0, as int32 → fp32 gives). Larger K keeps
        the fp32 GEMM, whose rounding depends on its order; so do K = 1 (torch._int_mm misreads
        a one-column weight's transpose) and activations whose codes are not finite (NaN or
        inf in x: int8 has no NaN, and the fp32 path's NaN rows must stay NaN)."""
        k = x.shape[-1]
        integer = (x.device.type == "cpu" and 2 <= k and k * 127 ** 2 < INT_EXACT and w_codes.dtype == torch.int8
                   and int_mm_exact())
        xc, xs = self.quantize32(x)
        if not integer or not torch.isfinite(xc).all():          # w8a8_matmul's fp32 GEMM
            return scaled_mm(xc, xs, w_codes if w_gemm is None else w_gemm, w_scale, bias, out_dtype, split_k)
        y = torch._int_mm(xc.reshape(-1, k).to(torch.int8), w_codes.t()).float()
        return _scale_epilogue(y.reshape(*x.shape[:-1], w_codes.shape[0]), xs, w_scale, bias, out_dtype)


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


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """v (fp32) rounded to the nearest e2m1 value {0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6}, ties to
    the even code (0, 1, 2, 4: mantissa bit 0), saturating at ±6. e2m1 is a float with one
    mantissa bit and no binade below [1, 2), so its grid step at c = clamp(v, −6, 6) is
        step = 2^(max(⌊log2|c|⌋, 0) − 1)    (0.5 below 2, 1 in [2, 4), 2 from 4; 0 and
    subnormals 0.5), read off c's fp32 exponent field (fp32_grid_step). The code's mantissa bit
    is the parity of c/step, so torch.round (half to even, symmetric in the sign) of c/step,
    times step, is the IEEE rounding; step is a power of two, so the division and product are
    exact."""
    c = v.detach().float().clamp(-6.0, 6.0)
    step = fp32_grid_step(c, 1, 0)
    return c.div_(step).round_().mul_(step)


def block_amax(xb: torch.Tensor) -> torch.Tensor:
    """max |x| over the last dimension (a power of two long: NVFP4's blocks of 16), by halving:
    the elementwise maximum of the two halves until one is left. The same values as
    `xb.abs().amax(-1)` (a maximum is exact, NaN propagates), in a few wide elementwise ops where
    torch's reduction over a 16-long inner dimension is slow on a CPU."""
    a = xb.abs()
    n = a.shape[-1]
    if n & (n - 1):
        raise ValueError(f"block_amax needs a power-of-two last dimension, got {n}")
    while n > 1:
        n //= 2
        a = torch.maximum(a[..., :n], a[..., n:2 * n])
    return a.squeeze(-1)


class NVFP4(Quantizer):
    """Block-scaled e2m1 (formats docstring). codes: int8 holding 2 × the e2m1 value, the shape
    of x; scale: fp32 [..., in/16], each block's e4m3 scale times the global scale."""

    block = 16
    fused_global_scale = True     # fused projections (q/k/v, gate/up) share one weight global scale

    def __init__(self):
        super().__init__("nvfp4", 6.0, torch.int8)

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] % self.block:
            raise PrecisionError(f"nvfp4 needs an input dimension divisible by {self.block}, got {x.shape[-1]}")
        return x.float().reshape(*x.shape[:-1], x.shape[-1] // self.block, self.block)

    def scales(self, x: torch.Tensor, per_tensor: bool = False,
               top: torch.Tensor | float | None = None) -> torch.Tensor:
        """Block scales: e4m3(clamp(amax_b / 6 / g, 2^-9, 448)) · g, g = amax / (448·6) over the
        tensor (weights; `top` gives the amax instead, e.g. one shared by the members of a fused
        projection) or over each row (activations: per token). The lower clamp at 2^-9, the
        smallest e4m3 subnormal, is Model-Optimizer's: a block far below the tensor's amax keeps
        the smallest scale instead of rounding to a zero scale (and a zeroed block); an all-zero
        tensor takes g = 1."""
        return self._block_scales(self._blocks(x.detach()), per_tensor, top)

    def _block_scales(self, xb: torch.Tensor, per_tensor: bool = False,
                      top: torch.Tensor | float | None = None) -> torch.Tensor:
        """`scales` of x already in blocks ([..., nb, 16], fp32)."""
        amax = block_amax(xb)                                                   # [..., nb]
        if top is None:
            top = amax.amax() if per_tensor else amax.amax(-1, keepdim=True)
        top = torch.as_tensor(top, dtype=torch.float32, device=amax.device)
        g = torch.where(top > 0, top / (E4M3_MAX * self.qmax), torch.ones_like(top))
        return (amax / self.qmax / g).clamp(E4M3_MIN_SUBNORMAL, E4M3_MAX).to(torch.float8_e4m3fn).float() * g

    def quantize_weight(self, w: torch.Tensor,
                        top: torch.Tensor | float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-tensor global scale from the weight's amax, or from `top` (a fused group's)."""
        s = self.scales(w, per_tensor=True, top=top)
        return self.codes(w, s), s

    def codes(self, x, scale):
        return (2 * e2m1_round(self._blocks(x) / scale.unsqueeze(-1))).reshape(x.shape).to(torch.int8)

    def dequantize(self, codes, scale):
        return (self._blocks(codes) / 2 * scale.unsqueeze(-1)).reshape(codes.shape)

    def fake(self, x):
        """dequantize(quantize(x)) without the int8 codes in between: e2m1(x_b / s_b) · s_b per
        block, the same fp32 values (a zero is +0, as the codes make it)."""
        xb = self._blocks(x.detach())
        s = self._block_scales(xb).unsqueeze(-1)
        return e2m1_round(xb / s).add_(0.0).mul_(s).reshape(x.shape)

    def step(self, codes, scale):
        return (self._blocks(float_step(codes.float() / 2, 1, 0)) * scale.unsqueeze(-1)).reshape(codes.shape)

    def gemm_weight(self, codes, scale):
        """The weight dequantized (fp32): what `matmul` multiplies."""
        return self.dequantize(codes, scale)

    def matmul(self, x, w_codes, w_scale, bias=None, out_dtype=torch.bfloat16, w_gemm=None, split_k=1):
        """Both operands dequantized exactly to fp32, one fp32 GEMM (a block-scaled MMA sums the
        block products in fp32 the same way, up to the order of the sum: `split_k`), one
        rounding. `w_gemm`: the weight already dequantized (gemm_weight: the same values)."""
        w = self.gemm_weight(w_codes, w_scale) if w_gemm is None else w_gemm
        y = split_k_matmul(self.fake(x), w, split_k)
        return (y if bias is None else y + bias.float()).to(out_dtype)


def w8a8_matmul(q: Quantizer, x: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor,
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
    # added left to right in place: the order by construction (tests/test_rollout_kernels.py has
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
    return _scale_epilogue(split_k_matmul(x_codes.float(), w_codes.float(), split_k), x_scale, w_scale, bias,
                           out_dtype)


def _scale_epilogue(y: torch.Tensor, x_scale, w_scale, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """y (a new fp32 tensor of code-product sums, scaled in place) · s_x · s_w + b, rounded once
    to `out_dtype`."""
    y.mul_(x_scale).mul_(w_scale.float().reshape(1, -1))
    if bias is not None:
        y.add_(bias.float())
    return y.to(out_dtype)


class W8A8STE(torch.autograd.Function):
    """The training side of a W8A8 format (bench/format_modules.py's compute copy, bench/moe.py's
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


# ------------------------------------------------------------------ formats

@dataclass(frozen=True)
class Format:
    name: str
    dtype: torch.dtype                       # storage of what is not quantized; activations
    quant: Quantizer | None = None           # W8A8 on every linear layer, lm_head included
    head32: bool = False                     # lm_head weight and logits in fp32
    router32: bool = False                   # MoE routers (linear + softmax) in fp32 (bench/moe.py)
    train: bool = True                       # usable as the training format
    vllm: dict | None = None                 # vLLM LLM(...) kwargs; None: vLLM cannot run it
    vllm_refusal: str = ""
    aliases: tuple[str, ...] = field(default=())

    @property
    def plain(self) -> bool:
        """Nothing but a parameter dtype for every dense layer (`router32` changes MoE routers only)."""
        return self.quant is None and not self.head32

    @property
    def dtype_name(self) -> str:
        return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[self.dtype]

    def cast(self, model, keep=()):
        """Parameters (not buffers) to `dtype`, except those in `keep` (ids)."""
        for p in model.parameters():
            if p.is_floating_point() and p.dtype != self.dtype and id(p) not in keep:
                p.data = p.data.to(self.dtype)
        return model

    def quantize(self, w: torch.Tensor, top: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A weight's codes and scales; `top`: the amax a fused group shares (nvfp4's global scale)."""
        if self.quant is None:
            raise PrecisionError(f"{self.name} does not quantize")
        return self.quant.quantize_weight(w) if top is None else self.quant.quantize_weight(w, top=top)

    def matmul(self, x: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor, bias=None,
               w_gemm: torch.Tensor | None = None, split_k: int = 1) -> torch.Tensor:
        return self.quant.matmul(x, w_codes, w_scale, bias, self.dtype, w_gemm, split_k)

    def step(self, stored: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """Grid spacing at each stored weight (codes and scales for quantized formats)."""
        if self.quant is not None:
            return self.quant.step(stored, scale)
        return float_step(stored, *FLOAT_GRIDS[stored.dtype])


_VLLM_NO_ROUTER32 = ("vLLM 0.32 has no switch for an fp32 router in a bf16/fp16 model; run +router32 rollouts with "
                     "--engine torch")
_VLLM_NO_INT8 = ("vLLM 0.32 has no W8A8 int8 for a bf16/fp16 checkpoint (its online `int8_per_channel_weight_only` "
                 "is weight-only and MoE-only); run int8 rollouts with --engine torch")
_VLLM_NO_NVFP4 = ("vLLM 0.32 runs NVFP4 only from a pre-quantized checkpoint (`modelopt_fp4`, Blackwell GPUs): it has "
                  "no online NVFP4 quantization of a bf16/fp16 checkpoint; run nvfp4 rollouts with --engine torch")
FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("fp32", torch.float32, vllm={"dtype": "float32"}, aliases=("float32", "float")),
    Format("bf16", torch.bfloat16, vllm={"dtype": "bfloat16"}, aliases=("bfloat16",)),
    Format("bf16+head32", torch.bfloat16, head32=True,
           vllm={"dtype": "bfloat16", "hf_overrides": {"head_dtype": "float32"}}, aliases=("bf16-head32",)),
    Format("fp16", torch.float16, vllm={"dtype": "float16"}, aliases=("float16", "half")),
    Format("fp8", torch.bfloat16, quant=FP8E4M3(),
           vllm={"dtype": "bfloat16", "quantization": "fp8_per_channel"}, aliases=("e4m3", "fp8-e4m3")),
    Format("int8", torch.bfloat16, quant=Int8(), train=False, vllm_refusal=_VLLM_NO_INT8, aliases=("w8a8-int8",)),
    Format("nvfp4", torch.bfloat16, quant=NVFP4(), train=False, vllm_refusal=_VLLM_NO_NVFP4,
           aliases=("fp4", "w4a4-nvfp4")),
    Format("bf16+router32", torch.bfloat16, router32=True, vllm_refusal=_VLLM_NO_ROUTER32,
           aliases=("bf16-router32",)),
    Format("fp16+router32", torch.float16, router32=True, vllm_refusal=_VLLM_NO_ROUTER32,
           aliases=("fp16-router32",)),
)}
MOE_FORMATS = tuple(n for n, f in FORMATS.items() if f.router32)          # named, never in `all`
ROLLOUT_FORMATS = tuple(n for n in FORMATS if n not in MOE_FORMATS)
TRAIN_FORMATS = tuple(n for n, f in FORMATS.items() if f.train and n not in MOE_FORMATS)
_ALIASES = {a: f.name for f in FORMATS.values() for a in (f.name, *f.aliases)}


def canonical(name: str) -> str:
    try:
        return _ALIASES[name.strip().lower()]
    except KeyError:
        raise PrecisionError(f"unknown dtype {name!r}; choose one of "
                             f"{', '.join(ROLLOUT_FORMATS + MOE_FORMATS)}") from None


def get(name: str) -> Format:
    return FORMATS[canonical(name)]
