"""The built-in rollout engine's kernels (bench/kernels.py, chosen by bench/model_formats.py): vLLM's fused SiluAndMul
rounds once where transformers' MLP rounds twice, for every format with 16-bit activations;
split-K GEMMs (a hand-computed fp32 order) in the quantized layers everywhere and in the 16-bit
layers where the CPU lacks the instructions (BENCH_CPU_16BIT); FlashAttention-2's arithmetic
(exp(S − m) rounded, the fp32 row sum dividing at the end, softcap); fp32 gets only the fused
projections (bench/fused_projections.py, tests/bench/test_fused_projections.py)."""

import pytest
import torch

from bench import formats, kernels
from bench.model_formats import NO_KERNELS, QuantLinear, RolloutWeights, apply_rollout_kernels, split_k_matmuls


def _mlp(dtype):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    return LlamaMLP(LlamaConfig(hidden_size=32, intermediate_size=96)).to(dtype)


def test_fused_silu_mul_rounds_once():
    mlp = _mlp(torch.float16)
    x = torch.randn(64, 32).to(torch.float16)
    with torch.no_grad():
        unfused = mlp(x)
        g, u = mlp.gate_proj(x), mlp.up_proj(x)
        once = mlp.down_proj((torch.nn.functional.silu(g.float()) * u.float()).to(torch.float16))
        twice = mlp.down_proj(torch.nn.functional.silu(g) * u)
        assert torch.equal(unfused, twice)
        assert kernels.fuse_silu_mul(mlp) == 1 and kernels.fuse_silu_mul(mlp) == 0
        fused = mlp(x)
    assert torch.equal(fused, once)
    assert not torch.equal(fused, unfused)       # one rounding fewer shows in the output
    assert (fused.float() - unfused.float()).abs().max() < 1e-2


def test_apply_gives_fp32_only_the_fused_projections():
    mlp = _mlp(torch.float32)
    assert apply_rollout_kernels(mlp, formats.get("fp32"), "cpu") == {**NO_KERNELS, "fused_projections": 1}
    assert "forward" not in mlp.__dict__ and "forward" not in mlp.down_proj.__dict__   # gate/up only


@pytest.mark.parametrize("name", ["fp8", "int8", "nvfp4"])
@pytest.mark.parametrize("cpu", ["none", "all"])
def test_quantized_formats_get_the_fused_activation_and_split_k(name, cpu, monkeypatch):
    """vLLM's LlamaMLP uses SiluAndMul whatever the quantization; the emulated scaled GEMMs
    reduce in split-K order on either CPU path."""
    monkeypatch.setenv("BENCH_CPU_16BIT", cpu)
    model = RolloutWeights(_tiny_llama(torch.float32), formats.get(name)).model
    got = apply_rollout_kernels(model, formats.get(name), "cpu")
    # 2 layers × 7 projections + lm_head; attention upcast only where bf16 is emulated
    assert got == {"split_k_linear": 15, "upcast_attention": int(cpu == "none"), "fused_mlp": 2,
                   "fused_projections": 4}                   # q/k/v and gate/up of each layer
    assert all(m.split_k == kernels.SPLIT_K for m in model.modules() if isinstance(m, QuantLinear))


@pytest.mark.parametrize("cpu,split", [("none", 3), ("fp16", 0), ("bf16", 3), ("all", 0)])
def test_16_bit_layers_split_only_without_native_instructions(cpu, split, monkeypatch):
    monkeypatch.setenv("BENCH_CPU_16BIT", cpu)
    mlp = _mlp(torch.float16)
    got = apply_rollout_kernels(mlp, formats.get("fp16"), "cpu")
    # no attention in an MLP; gate/up fused
    assert got == {"split_k_linear": split, "upcast_attention": 0, "fused_mlp": 1, "fused_projections": 1}


def test_cpu_16bit_override_and_bad_value(monkeypatch):
    for value, want in (("none", set()), ("bf16", {"bf16"}), ("fp16", {"fp16"}), ("all", {"bf16", "fp16"})):
        monkeypatch.setenv("BENCH_CPU_16BIT", value)
        assert kernels.cpu_16bit() == want and kernels.cpu_kernel_path() == value
        assert kernels.cpu_has_native("bf16") == ("bf16" in want)
        assert kernels.should_upcast("fp16") == ("fp16" not in want)
    monkeypatch.setenv("BENCH_CPU_16BIT", "avx2")
    with pytest.raises(kernels.PrecisionError, match="BENCH_CPU_16BIT='avx2'"):
        kernels.cpu_16bit()


def test_split_k_sums_its_slices_in_order():
    """Products 1, 2^-24, 2^-24, −1 (exact sum 2^-23). Four slices, left to right:
    ((1 + 2^-24) + 2^-24) − 1 = 0, each 1 + 2^-24 a tie rounding to even (1). Two slices:
    P0 = 1 + 2^-24 → 1, P1 = 2^-24 − 1 = −(1 − 2^-24) exactly, sum 2^-24."""
    from bench.gemms import split_k_matmul

    x = torch.tensor([[1.0, 2.0 ** -24, 2.0 ** -24, -1.0]])
    w = torch.ones(1, 4)
    assert split_k_matmul(x, w, 4).item() == 0.0
    assert split_k_matmul(x, w, 2).item() == 2.0 ** -24
    assert split_k_matmul(x, w, 3).item() == (x @ w.t()).item()        # K not divisible: one GEMM
    assert split_k_matmul(torch.randn(2, 5, 8), torch.randn(3, 8), 4).shape == (2, 5, 3)
    # the same order on a wide output and 8 slices, where torch's sum over the slices regroups
    # the partials (torch 2.13 on a CPU: 11 of these 255 outputs one ulp off the order)
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 128, generator=g) * torch.logspace(-6, 6, 128), torch.randn(85, 128, generator=g)
    parts = torch.bmm(x.reshape(3, 8, 16).transpose(0, 1), w.reshape(85, 8, 16).permute(1, 2, 0))  # [8, 3, 85]
    want = parts[0]
    for p in parts[1:]:
        want = want + p
    assert torch.equal(split_k_matmul(x, w, 8), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_k_linear_flips_some_roundings_by_one_ulp(dtype):
    """The rollout engine's 16-bit GEMM against the trainer's one-pass upcast GEMM: the same
    real sum in another fp32 order, so a few outputs round to the neighbouring 16-bit value and
    none further (bar the fp32 sum's own error on outputs that cancel to near 0)."""
    from bench.grids import FLOAT_GRIDS, float_step

    torch.manual_seed(0)
    a, b = torch.nn.Linear(384, 384).to(dtype), torch.nn.Linear(384, 384).to(dtype)
    b.load_state_dict(a.state_dict())
    kernels.upcast_matmuls(a)
    assert split_k_matmuls(b) == 1
    x = torch.randn(512, 384).to(dtype)
    with torch.no_grad():
        ya, yb = a(x), b(x)
    differ = ya != yb
    assert 0 < differ.float().mean() < 0.05
    # one 16-bit ulp, plus the fp32 sum's own error where cancellation leaves a tiny output
    fp32_error = 2.0 ** -20 * (x.float().abs() @ a.weight.float().abs().t())
    ulp = float_step(ya.float(), *FLOAT_GRIDS[dtype])
    assert ((ya.float() - yb.float()).abs() <= ulp + fp32_error).all()


def _tiny_llama(dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def test_upcast_attention_matches_sdpa_in_fp32_with_padding_and_a_kv_cache():
    """Prefill with left padding, then one decode step through the KV cache (grouped KV heads):
    the same logits as transformers' sdpa up to fp32 rounding; the pads' own rows stay finite."""
    from transformers import DynamicCache

    from bench.kernels import UPCAST_ATTENTION, upcast_attention

    ref, ours = _tiny_llama(torch.float32), _tiny_llama(torch.float32)
    assert upcast_attention(ours) and ours.config._attn_implementation == UPCAST_ATTENTION
    ids = torch.randint(3, 50, (3, 9))
    att = torch.ones_like(ids)
    att[0, :4] = 0
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        outs = []
        for m in (ref, ours):
            cache = DynamicCache()
            a = m(input_ids=ids, attention_mask=att, position_ids=pos, past_key_values=cache).logits
            att2 = torch.cat([att, torch.ones(3, 1, dtype=att.dtype)], -1)
            b = m(input_ids=ids[:, -1:], attention_mask=att2, position_ids=pos[:, -1:] + 1,
                  past_key_values=cache).logits
            outs.append((a, b))
    (a0, b0), (a1, b1) = outs
    assert torch.isfinite(a1).all()
    assert (a0 - a1)[att.bool()].abs().max() < 1e-5 and (b0 - b1).abs().max() < 1e-5


class _Attn:
    is_causal, training = True, False


def test_upcast_attention_rounds_like_flash_attention():
    """fp16 q, k, v: S in fp32, E = exp(S − rowmax) rounded to fp16, E·V accumulated in fp32,
    divided by the fp32 row sum of the unrounded E, rounded once (hand-computed here); a fully
    masked row gives 0."""
    from bench.kernels import _upcast_attention_forward

    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 3, 8).to(torch.float16) for _ in range(3))
    mask = torch.tensor([[True, False, False], [True, True, False], [False, False, False]]).view(1, 1, 3, 3)
    out, _ = _upcast_attention_forward(_Attn(), q, k, v, mask, scaling=0.5)
    s = ((q.float() @ k.float().transpose(-1, -2)) * 0.5).masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    e = torch.exp(s - m)
    want = ((e.to(torch.float16).float() @ v.float()) / e.sum(-1, keepdim=True).clamp(min=1e-30)).to(torch.float16)
    assert out.dtype == torch.float16 and torch.equal(out, want.transpose(1, 2))
    assert torch.equal(out[0, 2], torch.zeros(2, 8, dtype=torch.float16))
    normalised = (torch.softmax(s, -1).nan_to_num(0.0).to(torch.float16).float() @ v.float()).to(torch.float16)
    assert not torch.equal(out, normalised.transpose(1, 2))      # where P is rounded shows


def _blockwise_flash(s, v, dtype, block=128):
    """FlashAttention-2's forward loop over key blocks (online softmax): running max m and sum l
    in fp32, exp(S_blk − m) rounded to `dtype` for the product, the accumulator rescaled by
    exp(m_old − m_new), O = acc / l rounded once."""
    m = torch.full(s.shape[:-1] + (1,), float("-inf"))
    l = torch.zeros_like(m)
    acc = torch.zeros(*s.shape[:-1], v.shape[-1])
    for a in range(0, s.shape[-1], block):
        sb = s[..., a:a + block]
        new = torch.maximum(m, sb.amax(-1, keepdim=True))
        p, c = torch.exp(sb - new), torch.exp(m - new)
        l = l * c + p.sum(-1, keepdim=True)
        acc = acc * c + p.to(dtype).float() @ v[..., a:a + block, :]
        m = new
    return (acc / l).to(dtype)


def test_flash_arithmetic_on_a_long_diffuse_row_matches_the_blockwise_kernel():
    """8,192 keys alternating scores 0 and −8, values 0 and 1: O = e^-8 / (1 + e^-8) = 3.3535e-4.
    The normalised probability of a −8 key, e^-8 / (4096 (1 + e^-8)) = 8.19e-8, is an fp16
    subnormal (spacing 2^-24 = 5.96e-8) and rounds to 5.96e-8: rounding P gives 4096 · 2^-24 =
    2.44e-4, 27% low. FlashAttention rounds E = e^-8 = 3.35e-4 (a normal fp16) and divides by
    the fp32 sum: within an fp16 ulp or two. Every 128-key block holds a 0 score, so the
    blockwise kernel's running max is the row max from the first block on: it gives the same
    bits. Random scores at the same length: as close to the exact result as the blockwise kernel."""
    from bench.kernels import flash_attention_arithmetic

    n = 8192
    s = torch.where(torch.arange(n) % 2 == 0, 0.0, -8.0).view(1, 1, n)
    v = (torch.arange(n) % 2).float().view(1, n, 1)
    exact = torch.tensor(-8.0, dtype=torch.float64).exp() / (1 + torch.tensor(-8.0, dtype=torch.float64).exp())
    ours = flash_attention_arithmetic(s, v, torch.float16)
    assert torch.equal(ours, _blockwise_flash(s, v, torch.float16))
    assert abs(ours.double().item() - exact.item()) <= 2 * 2.0 ** -22          # fp16 ulp at 3.4e-4 is 2^-22
    rounded_p = (torch.softmax(s, -1).to(torch.float16).float() @ v).item()
    assert rounded_p == pytest.approx(4096 * 2.0 ** -24) and rounded_p < 0.75 * exact.item()

    torch.manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        s = torch.randn(2, 8, n) * 3
        v = torch.randn(2, n, 16).to(dtype).float()
        exact = torch.softmax(s.double(), -1) @ v.double()
        err = [(o.double() - exact).abs().mean().item()
               for o in (flash_attention_arithmetic(s, v, dtype), _blockwise_flash(s, v, dtype))]
        assert 0.67 < err[0] / err[1] < 1.5          # as accurate as the blockwise kernel


def test_upcast_attention_honours_softcap():
    """Gemma 2: S = softcap · tanh(S / softcap) before the mask and softmax."""
    from bench.kernels import _upcast_attention_forward, flash_attention_arithmetic

    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, 4, 8).to(torch.bfloat16) * 4 for _ in range(3))
    out, _ = _upcast_attention_forward(_Attn(), q, k, v, None, scaling=1.0, softcap=5.0)
    s = torch.tanh((q.float() @ k.float().transpose(-1, -2)) / 5.0) * 5.0
    s = s.masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf"))
    assert torch.equal(out, flash_attention_arithmetic(s, v.float(), torch.bfloat16).transpose(1, 2))
    plain, _ = _upcast_attention_forward(_Attn(), q, k, v, None, scaling=1.0)
    assert not torch.equal(out, plain)
