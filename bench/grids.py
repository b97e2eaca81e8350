"""Number grids: the spacing of binary floating-point grids at a value, and rounding onto the
small grids the quantizers use (bench/quantizers.py). Pure elementwise functions over fp32
tensors, exact: every step is a power of two.

    float_step       spacing of a float grid at |v| (fp32, bf16, fp16, e4m3, e2m1)
    fp32_grid_step   the same by fp32 bit arithmetic, for grids whose smallest step is normal
    e2m1_round       round to nearest even onto e2m1 {0, ±0.5, …, ±6}, saturating
    round_float      round to nearest even onto any binary float grid with fp32's range or less
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


def float_max(mantissa_bits: int, max_exp: int) -> float:
    """The largest finite value of a binary float grid: (2 − 2^−m) · 2^max_exp (bf16: m 7,
    max_exp 127; fp16: 10, 15 → 65504)."""
    return (2.0 - 2.0 ** -mantissa_bits) * 2.0 ** max_exp


def round_float(v: torch.Tensor, mantissa_bits: int, min_exp: int, max_exp: int) -> torch.Tensor:
    """v (fp32) rounded to nearest, ties to even, onto the binary float grid with `mantissa_bits`
    (m ≤ 23) stored mantissa bits, normal exponents min_exp … max_exp (min_exp ≥ −126) and
    subnormals below 2^min_exp (IEEE 754's roundTiesToEven), as fp32 values; ±inf where the
    rounding overflows past (2 − 2^−m) · 2^max_exp (float_max). The rule is
        step = 2^(max(⌊log2|v|⌋, min_exp) − m),   r = round_half_even(v / step) · step
    (float_step), computed as a cast to bf16 is, on v's bits: with d = 23 − m dropped bits,
        bits(r) = (bits(v) + 2^(d−1) − 1 + bit_d(v)) & ~(2^d − 1)
    — exact for every normal and fp32-subnormal v (a carry into the exponent is the step to the
    next binade, or to inf) — and, where the grid's own subnormals start above fp32's
    (|v| < 2^min_exp, min_exp > −126), round(v / 2^(min_exp − m)) · 2^(min_exp − m) (exact: a
    power of two). NaN stays NaN. (7, −126, 127) is bf16 and (10, −14, 15) fp16: the same bits as
    `.to(torch.bfloat16)` and `.to(torch.float16)` (tests/bench/test_ladder.py)."""
    x = v.float().contiguous()
    d = 23 - mantissa_bits
    r = x
    if d > 0:
        bits = x.view(torch.int32)
        r = ((bits + ((1 << (d - 1)) - 1) + ((bits >> d) & 1)) & ~((1 << d) - 1)).view(torch.float32)
    if min_exp > -126:
        sub = 2.0 ** (min_exp - mantissa_bits)
        r = torch.where(x.abs() < 2.0 ** min_exp, torch.round(x / sub) * sub, r)
    if max_exp < 127 or d == 0:
        inf = torch.copysign(torch.full_like(r, float("inf")), x)
        r = torch.where(r.abs() > float_max(mantissa_bits, max_exp), inf, r)
    return torch.where(torch.isnan(x), x, r)


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
