"""The built-in rollout engine's 16-bit kernels (bench/rollout_kernels.py): vLLM's fused
SiluAndMul rounds once where transformers' MLP rounds twice; upcast GEMMs and attention only where
the CPU lacks the instructions; nothing changes for fp32 or the W8A8 formats' linear layers."""

import torch

from bench import formats, rollout_kernels


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
        assert rollout_kernels.fuse_silu_mul(mlp) == 1 and rollout_kernels.fuse_silu_mul(mlp) == 0
        fused = mlp(x)
    assert torch.equal(fused, once)
    assert not torch.equal(fused, unfused)       # one rounding fewer shows in the output
    assert (fused.float() - unfused.float()).abs().max() < 1e-2


def test_apply_leaves_fp32_and_w8a8_alone():
    for name in ("fp32", "fp8", "int8"):
        mlp = _mlp(torch.float32)
        assert rollout_kernels.apply(mlp, formats.get(name), "cpu") == {"upcast_linear": 0, "upcast_attention": 0,
                                                                         "fused_mlp": 0}
        assert "forward" not in mlp.__dict__


def test_apply_upcasts_only_without_native_instructions(monkeypatch):
    from bench import precision

    for native in (True, False):
        monkeypatch.setattr(precision, "cpu_has_native", lambda dtype, native=native: native)
        mlp = _mlp(torch.float16)
        got = rollout_kernels.apply(mlp, formats.get("fp16"), "cpu")
        assert got == {"upcast_linear": 0 if native else 3, "upcast_attention": 0, "fused_mlp": 1}   # no attention in an MLP


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

    from bench.precision import UPCAST_ATTENTION, upcast_attention

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
            b = m(input_ids=ids[:, -1:], attention_mask=att2, position_ids=pos[:, -1:] + 1, past_key_values=cache).logits
            outs.append((a, b))
    (a0, b0), (a1, b1) = outs
    assert torch.isfinite(a1).all()
    assert (a0 - a1)[att.bool()].abs().max() < 1e-5 and (b0 - b1).abs().max() < 1e-5


def test_upcast_attention_rounds_like_flash_attention():
    """fp16 q, k, v: S and the softmax in fp32, P rounded to fp16, P·V accumulated in fp32 and
    rounded once (hand-computed here); a fully masked row gives 0."""
    from bench.precision import _upcast_attention_forward

    class M:
        is_causal, training = True, False

    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 3, 8).to(torch.float16) for _ in range(3))
    mask = torch.tensor([[True, False, False], [True, True, False], [False, False, False]]).view(1, 1, 3, 3)
    out, _ = _upcast_attention_forward(M(), q, k, v, mask, scaling=0.5)
    s = (q.float() @ k.float().transpose(-1, -2)) * 0.5
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0).to(torch.float16)
    want = (p.float() @ v.float()).to(torch.float16).transpose(1, 2)
    assert out.dtype == torch.float16 and torch.equal(out, want)
    assert torch.equal(out[0, 2], torch.zeros(2, 8, dtype=torch.float16))
    unrounded = (torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0) @ v.float()).to(torch.float16)
    assert not torch.equal(out, unrounded.transpose(1, 2))      # P's rounding shows
