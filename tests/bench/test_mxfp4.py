"""MXFP4 (bench/quantizers.py `MXFP4`, the registry's `mxfp4`): the OCP Microscaling format's
E8M0 block scales, e2m1 codes and saturation by hand, the exponent clamp at both ends of E8M0,
an fp32 sweep against the spec's definition computed in float64, the GEMM, and the format's
place in the registry (rollout only, named, never in `all`, refused by vLLM)."""

import copy
import math

import pytest
import torch

from bench.errors import PrecisionError
from bench.model_formats import RolloutWeights
from bench.formats import FORMATS, NAMED_FORMATS, ROLLOUT_FORMATS
from bench.precision import ALL_PAIRS, Precision, parse_list

MXFP4 = FORMATS["mxfp4"]
Q = MXFP4.quant
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def test_mxfp4_block_scales_codes_and_step_by_hand():
    # one row, two blocks of 32: amax 3 → ⌊log2 3⌋ = 1 → X = 2^(1−2) = 0.5; amax 0.75 → ⌊log2 0.75⌋ = −1 → X = 2^-3
    w = torch.zeros(1, 64)
    w[0, 0], w[0, 1], w[0, 2], w[0, 32], w[0, 33] = 3.0, -1.1, 0.3, 0.75, 0.2
    codes, scale = Q.quantize_weight(w)
    assert scale.tolist() == [[0.5, 0.125]]
    # values / X: 6, −2.2 → −2, 0.6 → 0.5 | 6, 1.6 → 1.5; codes hold 2 × the e2m1 value
    assert codes.dtype == torch.int8 and codes[0, :3].tolist() == [12, -4, 1] and codes[0, 32:34].tolist() == [12, 3]
    deq = Q.dequantize(codes, scale)
    assert deq[0, :3].tolist() == [3.0, -1.0, 0.25] and deq[0, 32:34].tolist() == [0.75, 0.1875]
    # grid spacing in weight units: e2m1's (0.5 below 2, 1 in [2, 4), 2 from 4) × the block's X
    st = Q.step(codes, scale)
    assert st[0, :3].tolist() == [1.0, 0.5, 0.25] and st[0, 32:34].tolist() == [0.25, 0.0625]


def test_mxfp4_power_of_two_scale_saturates_the_top_of_a_block():
    """amax / X lies in [4, 8): values above 6·X saturate. 3.9 → X = 0.5 → 7.8 → 6 → 3.0 (NVFP4's
    e4m3 scale 3.9/6 keeps it within 3 bits); 7 → X = 1 → 6; 4 → X = 1 → exactly 4."""
    for amax, want in ((3.9, 3.0), (7.0, 6.0), (4.0, 4.0), (-7.5, -6.0), (6.0, 6.0)):
        x = torch.zeros(1, 32)
        x[0, 5] = amax
        assert Q.fake(x)[0, 5].item() == want, amax
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 3.9, 3.9
    assert FORMATS["nvfp4"].quant.fake(x)[0, 0].item() == pytest.approx(3.9, rel=2 ** -4)


def test_mxfp4_has_no_tensor_scale():
    """A block's scale is its own amax's, whatever the rest of the tensor holds: the same as a
    weight (per_tensor) and as an activation (per token), and a fused group shares nothing."""
    x = torch.zeros(2, 32)
    x[0, 0], x[1, 0] = 6.0, 0.6
    assert Q.scales(x).flatten().tolist() == [1.0, 0.125]           # ⌊log2 6⌋ − 2 = 0; ⌊log2 0.6⌋ − 2 = −3
    assert torch.equal(Q.quantize_weight(x)[1], Q.scales(x))
    assert not Q.fused_global_scale
    with pytest.raises(PrecisionError, match="mxfp4 needs an input dimension divisible by 32"):
        Q.quantize_weight(torch.ones(2, 48))


def test_mxfp4_exponent_clamps_at_the_bottom_of_e8m0():
    """E8M0 holds 2^-127 … 2^127. amax 2^-126: ⌊log2⌋ − 2 = −128 → clamped to −127, so the value
    is 2 · X (code 4), not 4 · X (code 8) as an unclamped scale gives; fp32's largest binade
    (1.5 · 2^127) gives 2^125, inside E8M0 (the top clamp is out of fp32's reach); an all-zero
    block takes 2^-127 and zero codes."""
    x = torch.zeros(3, 32)
    x[0, 0], x[1, 0] = 2.0 ** -126, 1.5 * 2.0 ** 127
    codes, scale = Q.quantize_weight(x)
    assert scale[:, 0].tolist() == [2.0 ** -127, 2.0 ** 125, 2.0 ** -127]
    assert codes[:, 0].tolist() == [4, 12, 0] and codes[2].eq(0).all()
    assert Q.fake(x)[1, 0].item() == 1.5 * 2.0 ** 127


def _reference(block: list[float]) -> list[float]:
    """The spec in float64, one block: X = 2^clamp(⌊log2 amax⌋ − 2, −127, 127); each element
    x/X to the nearest e2m1 value (ties to the even code 0, 1, 2, 4), beyond ±6 to ±6; times X."""
    amax = max(abs(v) for v in block)
    e = -127 if amax == 0 else min(127, max(-127, math.floor(math.log2(amax)) - 2))
    x_scale = 2.0 ** e
    out = []
    for v in block:
        a = min(abs(v) / x_scale, 6.0)
        best = min(E2M1, key=lambda g: (abs(a - g), g not in (0.0, 1.0, 2.0, 4.0)))
        out.append(math.copysign(best, v) * x_scale if best else 0.0)
    return out


def test_mxfp4_fake_quantization_is_the_spec_on_an_fp32_sweep():
    # blocks of 32 drawn over 40 decades, with exact ties (k/4 · X) and values at the saturation edge
    g = torch.Generator().manual_seed(0)
    mags = torch.pow(2.0, torch.randint(-60, 60, (64, 1), generator=g).float())
    x = torch.randn(64, 32, generator=g) * mags
    x[::4] = (torch.randint(-28, 29, (16, 32), generator=g).float() / 4) * mags[::4]     # ties on e2m1's grid
    x[1::8, 0] = 7.999 * mags[1::8, 0]
    got = Q.fake(x)
    want = torch.tensor([_reference(row) for row in x.double().tolist()], dtype=torch.float64)
    assert torch.equal(got.double(), want)


def test_mxfp4_matmul_is_the_product_of_the_dequantized_operands():
    torch.manual_seed(0)
    x, w = torch.randn(3, 64).to(torch.bfloat16), torch.randn(5, 64) * 0.1
    wc, ws = MXFP4.quantize(w)
    y = MXFP4.matmul(x, wc, ws)
    want = (Q.fake(x) @ Q.dequantize(wc, ws).t()).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, want)


def test_mxfp4_is_a_named_rollout_only_format():
    assert "mxfp4" in NAMED_FORMATS and "mxfp4" not in ROLLOUT_FORMATS
    assert not any("mxfp4" in (p.rollout, p.train) for p in ALL_PAIRS) and len(ALL_PAIRS) == 35
    p = Precision.parse("rollout=mxfp4,train=fp16")
    assert p == Precision("mxfp4", "fp16") and p.name == "mxfp4→fp16" and Precision.parse(p.name) == p
    assert parse_list("fp16;rollout=MX-FP4,train=fp16") == [Precision("fp16", "fp16"), p]
    with pytest.raises(PrecisionError, match="mxfp4 is a rollout-only format"):
        Precision.parse("mxfp4")


def test_vllm_refuses_mxfp4_with_what_to_run():
    from bench.engines.vllm_engine import VLLMEngine

    with pytest.raises(PrecisionError, match="the vllm engine cannot run mxfp4: .*pre-quantized.*--engine torch"):
        VLLMEngine("/nowhere", "mxfp4")


def test_mxfp4_rollout_weights_quantize_every_linear_per_block():
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.model_formats import QuantLinear

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    rw = RolloutWeights(copy.deepcopy(model), MXFP4)
    assert rw.groups == []                                             # nothing shared by fused projections
    q = rw.model.model.layers[0].self_attn.q_proj
    assert isinstance(q, QuantLinear) and q.scale.shape == (64, 2)
    codes, scale = MXFP4.quantize(model.model.layers[0].self_attn.q_proj.weight.detach())
    assert torch.equal(q.codes, codes) and torch.equal(q.scale, scale)
