import pytest

from bench.precision import ALL_PAIRS, Precision, PrecisionError, parse_list


def test_parse_pairs():
    assert Precision.parse("fp16") == Precision("fp16", "fp16")
    assert Precision.parse("rollout=fp32,train=bf16") == Precision("fp32", "bf16")
    assert Precision.parse("train=bf16,rollout=float32") == Precision("fp32", "bf16")
    assert Precision.parse("rollout=fp32,train=bf16").name == "rollout=fp32,train=bf16"
    assert Precision.parse("bfloat16").name == "bf16"
    assert len(ALL_PAIRS) == 9 and len(set(ALL_PAIRS)) == 9
    assert parse_list("bf16,fp16") == [Precision("bf16", "bf16"), Precision("fp16", "fp16")]
    assert len(parse_list("all")) == 9


@pytest.mark.parametrize("bad", ["fp8", "rollout=fp16", "rollout=fp16,train=int8", "roll=fp16,train=fp16"])
def test_bad_precision_lists_valid(bad):
    with pytest.raises(PrecisionError):
        Precision.parse(bad)


def test_upcast_matmul_rounds_like_a_16bit_gemm():
    import torch

    from bench.precision import LossScaler, upcast_matmuls

    torch.manual_seed(0)
    for dt in (torch.bfloat16, torch.float16):
        lin = torch.nn.Linear(64, 32).to(dt)
        x = torch.randn(8, 64).to(dt).requires_grad_(True)
        native = lin(x)
        exact = (x.double() @ lin.weight.double().T + lin.bias.double()).to(dt)   # fp64 sum, one rounding
        assert upcast_matmuls(lin) == 1 and upcast_matmuls(lin) == 0
        up = lin(x)
        assert up.dtype == dt
        assert torch.equal(up, exact) or (up.float() - exact.float()).abs().max() <= (native.float() - exact.float()).abs().max() + 1e-2
        up.float().sum().backward()
        assert lin.weight.grad.dtype == dt and torch.isfinite(lin.weight.grad.float()).all()
    s = LossScaler(True, scale=8.0, growth_interval=2)
    s.update(True), s.update(True)
    assert s.scale == 16.0
    s.update(False)
    assert s.scale == 8.0 and s.skipped == 1
    assert LossScaler(False).scale == 1.0
