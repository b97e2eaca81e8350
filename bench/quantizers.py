"""Quantizers: how a format turns a tensor into codes and scales (bench/formats.py names the
formats; bench/gemms.py multiplies what these make; bench/grids.py rounds).

    Quantizer   symmetric, one scale per row (per output channel / per token): amax/qmax
    FP8E4M3     e4m3 codes, qmax 448 (vLLM's fp8_per_channel)
    Int8        int8 codes, qmax 127, the int32 GEMM where it is exact
    NVFP4       e2m1 codes in blocks of 16, an e4m3 scale per block under an fp32 global scale
    MXFP4       e2m1 codes in blocks of 32, an E8M0 power-of-two scale per block (OCP MX)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.errors import PrecisionError
from bench.gemms import INT_EXACT, scale_epilogue, int_mm_exact, scaled_mm, split_k_matmul, w8a8_matmul
from bench.grids import E4M3_MAX, E4M3_MIN_SUBNORMAL, block_amax, e2m1_round, float_step, fp32_grid_step


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
        return scale_epilogue(y.reshape(*x.shape[:-1], w_codes.shape[0]), xs, w_scale, bias, out_dtype)


class BlockFP4(Quantizer):
    """e2m1 codes in blocks of `block` along the input dimension, one scale per block (NVFP4,
    MXFP4). codes: int8 holding 2 × the e2m1 value, the shape of x; scale: fp32 [..., in/block],
    each block's scale as a number (whatever its own encoding: `_block_scales`). Elements are
    x_b / s_b rounded to nearest even onto e2m1, saturating at ±6 (e2m1_round); the GEMM
    multiplies both operands dequantized exactly to fp32."""

    block: int                    # elements a scale covers: each format sets it (NVFP4 16, MXFP4 32)

    def __init__(self, name: str):
        super().__init__(name, 6.0, torch.int8)

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] % self.block:
            raise PrecisionError(f"{self.name} needs an input dimension divisible by {self.block}, "
                                 f"got {x.shape[-1]}")
        return x.float().reshape(*x.shape[:-1], x.shape[-1] // self.block, self.block)

    def _block_scales(self, xb: torch.Tensor, per_tensor: bool = False,
                      top: torch.Tensor | float | None = None) -> torch.Tensor:
        """The scales of x already in blocks ([..., nb, block], fp32): [..., nb]."""
        raise NotImplementedError

    def scales(self, x: torch.Tensor, per_tensor: bool = False,
               top: torch.Tensor | float | None = None) -> torch.Tensor:
        return self._block_scales(self._blocks(x.detach()), per_tensor, top)

    def quantize_weight(self, w: torch.Tensor,
                        top: torch.Tensor | float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A weight's codes and block scales; a tensor-wide scale (where the format has one)
        from the weight's amax, or from `top` (a fused group's)."""
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


class NVFP4(BlockFP4):
    """NVIDIA's NVFP4 (formats docstring): blocks of 16, each with an e4m3 scale relative to an
    fp32 global scale; the scale stored is the block's e4m3 scale times the global scale."""

    block = 16
    fused_global_scale = True     # fused projections (q/k/v, gate/up) share one weight global scale

    def __init__(self):
        super().__init__("nvfp4")

    def _block_scales(self, xb, per_tensor=False, top=None):
        """e4m3(clamp(amax_b / 6 / g, 2^-9, 448)) · g, g = amax / (448·6) over the tensor
        (weights, `per_tensor`; `top` gives the amax instead, e.g. one shared by the members of a
        fused projection) or over each row (activations: per token). The lower clamp at 2^-9,
        the smallest e4m3 subnormal, is Model-Optimizer's: a block far below the tensor's amax
        keeps the smallest scale instead of rounding to a zero scale (and a zeroed block); an
        all-zero tensor takes g = 1."""
        amax = block_amax(xb)                                                   # [..., nb]
        if top is None:
            top = amax.amax() if per_tensor else amax.amax(-1, keepdim=True)
        top = torch.as_tensor(top, dtype=torch.float32, device=amax.device)
        g = torch.where(top > 0, top / (E4M3_MAX * self.qmax), torch.ones_like(top))
        return (amax / self.qmax / g).clamp(E4M3_MIN_SUBNORMAL, E4M3_MAX).to(torch.float8_e4m3fn).float() * g


E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127    # E8M0 encodes 2^-127 … 2^127 (0xFF is NaN)
E2M1_EMAX = 2                             # e2m1's largest binade: 6 = 1.5 · 2^2


class MXFP4(BlockFP4):
    """OCP Microscaling MXFP4 (MX spec v1.0; gpt-oss's weight format): blocks of 32, each with an
    E8M0 scale, a bare power of two, and no tensor-wide scale. The scale of a block is
        X = 2^(⌊log2 amax_b⌋ − 2),   the exponent clamped to E8M0's [−127, 127],
    the spec's rule (emax of e2m1 is 2): amax_b / X lies in [4, 8), so a block's largest
    elements above 6·X saturate to ±6 (up to 25% low), and every other element rounds on a grid
    up to twice as coarse as NVFP4's, whose e4m3 scale fits the block's amax to 3 bits. An
    all-zero block takes X = 2^-127 (the spec's FP32_MIN_NORMAL guard, then the clamp). A power
    of two makes x / X and the dequantization exact."""

    block = 32

    def __init__(self):
        super().__init__("mxfp4")

    def _block_scales(self, xb, per_tensor=False, top=None):
        """2^clamp(⌊log2 amax_b⌋ − 2, −127, 127) per block, ⌊log2 a⌋ = e − 1 from
        frexp(a) = (m, e), m ∈ [0.5, 1) (exact for every finite a > 0, subnormals too)."""
        amax = block_amax(xb)                                                   # [..., nb]
        _, e = torch.frexp(amax)
        exp = torch.where(amax > 0, e - 1 - E2M1_EMAX, torch.full_like(e, E8M0_MIN_EXP))
        return torch.ldexp(torch.ones_like(amax), exp.clamp_(E8M0_MIN_EXP, E8M0_MAX_EXP))
