import pytest

from bench.precision import ALL_PAIRS, CLASSIC_PAIRS, Precision, PrecisionError, parse_list


def test_parse_pairs():
    assert Precision.parse("fp16") == Precision("fp16", "fp16")
    assert Precision.parse("rollout=fp32,train=bf16") == Precision("fp32", "bf16")
    assert Precision.parse("train=bf16,rollout=float32") == Precision("fp32", "bf16")
    assert Precision.parse("rollout=fp32,train=bf16").name == "fp32→bf16"       # one display name
    assert Precision.parse("rollout=fp32,train=bf16").spec == "rollout=fp32,train=bf16"
    assert Precision.parse("fp32→bf16") == Precision.parse(" fp32 → bfloat16 ") == Precision("fp32", "bf16")
    assert Precision("fp16", "fp16").name == Precision("fp16", "fp16").spec == "fp16"
    assert Precision.parse("bfloat16").name == "bf16"
    assert len(ALL_PAIRS) == 35 and len(set(ALL_PAIRS)) == 35          # 7 rollout × 5 training formats
    assert parse_list("bf16,fp16") == [Precision("bf16", "bf16"), Precision("fp16", "fp16")]
    assert len(parse_list("all")) == 35
    assert parse_list("all16") == list(CLASSIC_PAIRS) and len(CLASSIC_PAIRS) == 9


@pytest.mark.parametrize("bad", ["fp4", "rollout=fp16", "rollout=fp16,train=int8", "roll=fp16,train=fp16"])
def test_bad_precision_lists_valid(bad):
    with pytest.raises(PrecisionError):
        Precision.parse(bad)


class _MatmulDtypes:
    """Records the operand dtypes of every matrix product torch dispatches (mm, addmm, bmm, ...)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        seen = self.seen = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                import torch

                if "mm" in func.overloadpacket.__name__ or "linear" in func.overloadpacket.__name__:
                    seen.append({a.dtype for a in args if isinstance(a, torch.Tensor)})
                return func(*args, **(kwargs or {}))

        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self.seen

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


@pytest.mark.parametrize("dt_name, ulp", [("bf16", 2.0 ** -7), ("fp16", 2.0 ** -10)])
def test_upcast_matmul_rounds_like_a_16bit_gemm(dt_name, ulp):
    """One rounding of the fp32 result, bias included, on hand-made ties (`ulp` is the spacing
    of the format at 1.0), and the product itself runs in fp32."""
    import torch

    from bench.kernels import upcast_matmuls
    from bench.precision import torch_dtype

    dt = torch_dtype(dt_name)
    lin = torch.nn.Linear(8, 4).to(dt)
    assert upcast_matmuls(lin) == 1 and upcast_matmuls(lin) == 0
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 1.0] + [0.0] * 6] * 3 + [[1.0] * 8]))
        lin.bias.copy_(torch.tensor([2.0 ** -20, -2.0 ** -20, 0.0, 0.0]))
    x = torch.tensor([[1.0, ulp / 2] + [0.0] * 6,        # · the first three rows: 1 + ulp/2, a tie
                      [1.0] + [2.0 ** -9] * 7]).to(dt)   # · the last row: 1 + 7·2⁻⁹
    with _MatmulDtypes() as seen:
        up = lin(x)
    assert up.dtype == dt
    # row 0 of x against the first three outputs: 1 + ulp/2 ± 2⁻²⁰ rounds once to the side the
    # bias picks; with no bias the tie goes to even (1.0). Two roundings (the product to 16 bits,
    # then + bias) would give 1.0 for all three.
    assert up[0, :3].tolist() == [1.0 + ulp, 1.0, 1.0]
    # row 1 against the all-ones output: 1 + 7·2⁻⁹ = 1.013671875 in fp32; one rounding gives
    # bf16 1.015625 (1 + 2⁻⁶, the nearer of 1.0078125 and 1.015625), fp16 1.013671875 (exact).
    # Summing the parts in 16 bits would stop at 1.0 in bf16 (each 2⁻⁹ is below half an ulp).
    assert up[1, 3].item() == {"bf16": 1.015625, "fp16": 1.013671875}[dt_name]
    # the product reads fp32 operands (the point of the upcast: torch's 16-bit CPU GEMM also rounds
    # once, so only the kernel tells them apart; without the instructions it is ~13× slower)
    assert seen and all(s == {torch.float32} for s in seen), seen
    # on random operands: each output within one ulp of the fp64 result, most of them equal to it
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32).to(dt)
    upcast_matmuls(lin)
    x = torch.randn(8, 64).to(dt).requires_grad_(True)
    up = lin(x)
    exact = x.double() @ lin.weight.double().T + lin.bias.double()
    spacing = torch.tensor(2.0).pow(torch.floor(torch.log2(exact.abs()))) * ulp    # ulp(exact)
    assert ((up.double() - exact).abs() <= spacing).all()
    assert (up == exact.to(dt)).float().mean() >= 0.9
    up.float().sum().backward()
    assert lin.weight.grad.dtype == dt and torch.isfinite(lin.weight.grad.float()).all()


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
    from bench.model_formats import prepare_compute_model
    from bench.precision import torch_dtype

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
