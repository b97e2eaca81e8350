"""bench/grids.py against the number formats themselves: FLOAT_GRIDS' (mantissa bits, smallest
exponent) give torch's own spacing of fp32, bf16 and fp16 at normal and subnormal values; the
bit-arithmetic step is refused exactly where a grid's smallest step leaves fp32's normal range;
block_amax at its edges."""

from __future__ import annotations

import pytest
import torch

from bench.grids import FLOAT_GRIDS, block_amax, float_step, fp32_grid_step

# positive finite values of each format: subnormals, the smallest normal, powers of two, between, the largest binades
VALUES = {torch.float32: [1e-45, 1e-40, 2.0 ** -126, 3e-20, 0.7, 1.0, 1.5, 1024.0, 3e30, 3e38],
          torch.bfloat16: [1e-40, 2.0 ** -126, 1e-30, 0.3, 1.0, 3.0, 2.0 ** 100, 3e38],
          torch.float16: [6e-8, 1e-6, 2.0 ** -14, 1e-3, 0.3, 1.0, 3.0, 1000.0, 60000.0]}
INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


@pytest.mark.parametrize("dtype", list(FLOAT_GRIDS), ids=str)
def test_float_grids_give_each_formats_own_spacing(dtype):
    """The spacing above v in the format, read off its bits (the next bit pattern up is the next
    value for a positive finite v), is float_step(v, *FLOAT_GRIDS[dtype]) at every value."""
    v = torch.tensor(VALUES[dtype], dtype=dtype)
    assert (v > 0).all()
    up = (v.view(INT[dtype]) + 1).view(dtype)
    assert torch.equal(up.float() - v.float(), float_step(v.float(), *FLOAT_GRIDS[dtype]))


def test_the_bit_step_is_refused_exactly_where_the_smallest_step_is_subnormal():
    """fp32_grid_step needs 2^(min_exp − mantissa_bits) ≥ 2^−126: at 2^−126 itself it is
    float_step; one binade lower it is refused, naming the step."""
    v = torch.tensor([0.0, 2.0 ** -120, 1e-38, 0.5, 3.0, 1e30])
    assert torch.equal(fp32_grid_step(v, 3, -123), float_step(v, 3, -123))        # smallest step 2^−126
    with pytest.raises(ValueError, match=r"smallest step 2\^-127 is not a normal fp32 number"):
        fp32_grid_step(v, 3, -124)


def test_block_amax_at_its_edges():
    x = torch.tensor([[-3.0, 2.0, 0.5, -0.25], [1.0, -7.0, 7.0, 0.0]])
    assert block_amax(x).tolist() == [3.0, 7.0]
    assert block_amax(x[:, :1]).tolist() == [3.0, 1.0]                 # a block of one: 2^0
    assert torch.isnan(block_amax(torch.tensor([[1.0, float("nan")]]))).all()
    with pytest.raises(ValueError, match="power-of-two last dimension, got 3"):
        block_amax(x[:, :3])
