"""bench/gemms.py's defaults and the straight-through backward's bookkeeping, beside the
numbers tests/bench/test_formats.py and test_rollout_kernels.py check: a GEMM is one fp32 GEMM
unless split-K is asked, and W8A8STE gives each operand its gradient only where one is asked."""

from functools import partial

import pytest
import torch

from bench.formats import FORMATS
from bench.gemms import W8A8STE, scaled_mm, split_k_matmul, w8a8_matmul
from conftest import one_gemm_by_default


def _wide(rows, k, seed):
    """fp32 values whose products span many binades, so a sum's fp32 rounding depends on its order."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-8, 9, (rows, k), generator=g).float())


def test_split_k_matmul_scaled_mm_and_w8a8_matmul_are_one_gemm_by_default():
    x, w = _wide(32, 1024, 0), _wide(48, 1024, 1)
    one = split_k_matmul(x, w)
    assert torch.equal(one, torch.matmul(x, w.t())) and not torch.equal(one, split_k_matmul(x, w, 2))
    one_gemm_by_default(partial(scaled_mm, x, torch.ones(32, 1), w, torch.ones(48, 1), out_dtype=torch.float32))
    q = FORMATS["fp8"].quant                                            # e4m3 products: fp32 sums round
    one_gemm_by_default(partial(w8a8_matmul, q, x, *q.quantize_weight(w), out_dtype=torch.float32))


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_the_straight_through_backward_gives_each_operand_its_gradient_only_where_asked(fmt):
    f = FORMATS[fmt]
    x, w, b = torch.randn(4, 16), torch.randn(3, 16), torch.randn(3)
    for wants in ((True, False, False), (False, True, False), (False, False, True)):
        xi, wi, bi = (t.clone().requires_grad_(r) for t, r in zip((x, w, b), wants))
        W8A8STE.apply(xi, wi, bi, f).float().sum().backward()
        assert [t.grad is not None for t in (xi, wi, bi)] == list(wants)
    wi = w.clone().requires_grad_(True)
    W8A8STE.apply(x, wi, b, f).float().sum().backward()
    assert torch.equal(wi.grad, (torch.ones(4, 3).t() @ f.quant.fake(x)).to(w.dtype))    # ∂w = gᵀ x̂
