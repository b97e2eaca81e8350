import pytest

from bench.precision import ALL_PAIRS, CLASSIC_PAIRS, Precision, PrecisionError, parse_list


def test_parse_pairs():
    assert Precision.parse("fp16") == Precision("fp16", "fp16")
    assert Precision.parse("rollout=fp32,train=bf16") == Precision("fp32", "bf16")
    assert Precision.parse("train=bf16,rollout=float32") == Precision("fp32", "bf16")
    assert Precision.parse("rollout=fp32,train=bf16").name == "rollout=fp32,train=bf16"
    assert Precision.parse("bfloat16").name == "bf16"
    assert len(ALL_PAIRS) == 35 and len(set(ALL_PAIRS)) == 35          # 7 rollout × 5 training formats
    assert parse_list("bf16,fp16") == [Precision("bf16", "bf16"), Precision("fp16", "fp16")]
    assert len(parse_list("all")) == 35
    assert parse_list("all16") == list(CLASSIC_PAIRS) and len(CLASSIC_PAIRS) == 9


@pytest.mark.parametrize("bad", ["fp4", "rollout=fp16", "rollout=fp16,train=int8", "roll=fp16,train=fp16"])
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


def _rope_buffers(model):
    return {n: b for n, b in model.named_buffers() if "inv_freq" in n}


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_casting_keeps_rope_buffers_fp32(dtype):
    """Only parameters change dtype: RoPE's inv_freq / original_inv_freq stay fp32 and exact
    in the training engine and the built-in rollout engine, as FSDP and vLLM keep them."""
    import copy

    import torch

    from bench.engines.torch_engine import TorchEngine
    from bench.models import load_model, load_tokenizer, resolve_model
    from bench.precision import prepare_compute_model, torch_dtype

    ref = resolve_model("tiny-math")
    master = load_model(ref, torch.float32)
    before = {n: b.clone() for n, b in _rope_buffers(master).items()}
    assert before, "the tiny model has RoPE buffers"
    compute = prepare_compute_model(copy.deepcopy(master), dtype)
    engine = TorchEngine(ref.path, dtype, model=copy.deepcopy(master), tokenizer=load_tokenizer(ref))
    for model in (compute, engine.model):
        assert all(p.dtype == torch_dtype(dtype) for p in model.parameters())
        for n, b in _rope_buffers(model).items():
            assert b.dtype == torch.float32 and torch.equal(b, before[n]), n
    # tied embeddings stay tied
    assert compute.lm_head.weight is compute.model.embed_tokens.weight


def test_non_finite_steps_are_counted_for_every_dtype():
    from bench.precision import LossScaler

    for enabled in (False, True):
        s = LossScaler(enabled, scale=8.0)
        s.update(False), s.update(False)
        assert (s.skipped, s.skipped_in_a_row) == (2, 2)
        s.update(True)
        assert (s.skipped, s.skipped_in_a_row) == (2, 0)
        assert s.scale == (2.0 if enabled else 1.0)
