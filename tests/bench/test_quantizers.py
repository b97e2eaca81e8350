"""bench/quantizers.py's own contracts beside tests/bench/test_formats.py's numbers: quantizers
are frozen values, Int8's GEMM defaults to one fp32 GEMM where its sums are not exact in int32,
and the FP4 block formats take activations of any rank and name a bad input dimension."""

import dataclasses
from functools import partial

import pytest
import torch

from bench.errors import PrecisionError
from bench.quantizers import FP8E4M3, MXFP4, NVFP4, Int8
from conftest import one_gemm_by_default


def test_a_quantizer_is_a_frozen_value():
    q = Int8()
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.qmax = 1.0


def test_int8_matmul_is_one_fp32_gemm_by_default_past_the_exact_int32_range():
    """K = 2,048: K·127² ≥ 2^24, so the fp32 GEMM runs, and its default is one GEMM (split-K 1).
    Codes of one sign near 127 sum past 2^24, where fp32 rounds: split-K 2 sums in another
    order and moves some fp32 outputs."""
    g = torch.Generator().manual_seed(0)
    x, w = 0.8 + 0.2 * torch.rand(64, 2048, generator=g), 0.8 + 0.2 * torch.rand(96, 2048, generator=g)
    q = Int8()
    one_gemm_by_default(partial(q.matmul, x, *q.quantize_weight(w), out_dtype=torch.float32))


@pytest.mark.parametrize("q", [NVFP4(), MXFP4()], ids=lambda q: q.name)
def test_fp4_blocks_run_along_the_last_dimension_of_any_rank_and_add_the_bias(q):
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(q.fake(x), q.fake(x.reshape(6, 64)).reshape(2, 3, 64))
    with pytest.raises(PrecisionError, match=f"{q.name} needs an input dimension divisible by {q.block}, got 20"):
        q.fake(torch.ones(2, 3, 20))
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(4))
    b = torch.linspace(-1, 1, 8)
    codes, scale = q.quantize_weight(w)
    assert torch.equal(q.matmul(x, codes, scale, bias=b, out_dtype=torch.float32),
                       q.matmul(x, codes, scale, out_dtype=torch.float32) + b)       # the bias added once, in fp32


def test_fp8_matmul_is_one_fp32_gemm_by_default():
    """e4m3 code products span more than fp32's 24 bits, so their sum depends on its order:
    the default is one GEMM (split-K 1), and split-K 2 moves some fp32 outputs."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(64, 1024, generator=g), torch.randn(96, 1024, generator=g)
    q = FP8E4M3()
    one_gemm_by_default(partial(q.matmul, x, *q.quantize_weight(w), out_dtype=torch.float32))


def test_nvfp4_activations_are_scaled_per_token():
    """An activation row's global scale is its own amax's (per token), so a row quantizes the
    same whatever else is in the batch; a weight's is the whole tensor's."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 64, generator=g) * torch.tensor([[1.0], [1000.0]])
    q = NVFP4()
    assert torch.equal(q.fake(x)[0], q.fake(x[:1])[0])
    assert not torch.equal(q.dequantize(*q.quantize_weight(x))[0], q.fake(x)[0])
