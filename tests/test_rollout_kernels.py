"""The built-in rollout engine's 16-bit kernels (bench/rollout_kernels.py): vLLM's fused
SiluAndMul rounds once where transformers' MLP rounds twice; upcast GEMMs only where the CPU
lacks the instructions; nothing changes for fp32 or the W8A8 formats."""

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
        assert rollout_kernels.apply(mlp, formats.get(name), "cpu") == {"upcast_linear": 0, "fused_mlp": 0}
        assert "forward" not in mlp.__dict__


def test_apply_upcasts_only_without_native_instructions(monkeypatch):
    from bench import precision

    for native in (True, False):
        monkeypatch.setattr(precision, "cpu_has_native", lambda dtype, native=native: native)
        mlp = _mlp(torch.float16)
        got = rollout_kernels.apply(mlp, formats.get("fp16"), "cpu")
        assert got == {"upcast_linear": 0 if native else 3, "fused_mlp": 1}
