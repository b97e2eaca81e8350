"""Number grids: the spacing of binary floating-point grids at a value, and rounding onto the
small grids the quantizers use (bench/quantizers.py). Pure elementwise functions over fp32
tensors, exact: every step is a power of two.

    float_step       spacing of a float grid at |v| (fp32, bf16, fp16, e4m3, e2m1)
    fp32_grid_step   the same by fp32 bit arithmetic, for grids whose smallest step is normal
    e2m1_round       round to nearest even onto e2m1 {0, ±0.5, …, ±6}, saturating
    block_amax       max |x| over a power-of-two block (NVFP4's 16, MXFP4's 32)
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0                # the largest finite float8_e4m3fn value
E4M3_MIN_SUBNORMAL = 2.0 ** -9  # its smallest positive value


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
