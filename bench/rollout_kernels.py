"""The built-in rollout engine's 16-bit arithmetic, as an inference engine (vLLM) computes it.

A training engine (transformers modules under FSDP) and an inference engine run the same model
with different kernels, and that difference is the training–inference mismatch the sanity test
measures. The built-in engine reproduces two of vLLM's documented kernel choices for bf16 and
fp16 (bf16+head32 too; fp32 is left alone, W8A8 formats have their own scaled matmul):

1. GEMMs read 16-bit operands, accumulate in fp32 and round the output once (cuBLAS; vLLM's
   linear layers), attention's two products included (FlashAttention: P rounded to 16 bits
   between them). On a CPU this is `bench.precision.upcast_matmuls` and `upcast_attention`;
   torch's own CPU 16-bit GEMM is the same contract, but on CPUs without the instructions (no
   AVX512-FP16/AMX-FP16 for fp16, no AVX512-BF16/AMX for bf16) it runs a scalar kernel 2–4×
   slower than fp32.
2. The MLP's activation is one fused kernel (vLLM `SiluAndMul`): silu(gate) · up computed in
   fp32 from the 16-bit projections and rounded once,
       h = round16( silu(g) · u ),  g = round16(x W_gateᵀ), u = round16(x W_upᵀ),
   where transformers' `LlamaMLP` (and Qwen2's, Mistral's) rounds twice:
       h = round16( round16(silu(g)) · u ).
   One rounding fewer in the rollout engine than in the training engine, in every layer and
   every token: a difference of the size of the format's unit roundoff (2^-8 bf16, 2^-11 fp16),
   so bf16's mismatch stays ~64× fp16's in k3, as the paper's Figure 2 has it.

So the two engines never compute identically, even where both GEMMs are upcast (the training
engine upcasts only where the CPU lacks the 16-bit instructions: bench/precision.py), and
16-bit rollouts cost about what fp32 rollouts do on any CPU.
"""

from __future__ import annotations

import types

import torch
from torch import nn

SILU_MLP = ("gate_proj", "up_proj", "down_proj", "act_fn")


def _is_silu(act) -> bool:
    """nn.SiLU or transformers' SiLUActivation (ACT2FN["silu"])."""
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _fused_silu_mul_forward(self, x):
    """down(round(silu(gate(x)) · up(x))) with silu and the product in fp32 (one rounding)."""
    g, u = self.gate_proj(x), self.up_proj(x)
    h = (torch.nn.functional.silu(g.float()) * u.float()).to(g.dtype)
    return self.down_proj(h)


def fuse_silu_mul(model: nn.Module) -> int:
    """Give every gated-SiLU MLP of `model` (Llama/Qwen2/Mistral: gate_proj, up_proj, down_proj
    and a SiLU act_fn) vLLM's fused SiluAndMul. Returns how many modules it changed; MLPs with
    another activation are left as they are."""
    n = 0
    for mod in model.modules():
        if (all(hasattr(mod, a) for a in SILU_MLP) and _is_silu(mod.act_fn)
                and "forward" not in mod.__dict__):
            mod.forward = types.MethodType(_fused_silu_mul_forward, mod)
            n += 1
    return n


def apply(model: nn.Module, fmt, device) -> dict[str, int]:
    """Apply the rollout engine's kernels to `model`, already cast to the format `fmt`
    (bench/formats.py; see the module docstring). Where the CPU lacks the format's 16-bit
    instructions: GEMMs (bf16, fp16, bf16+head32; W8A8 formats have their own scaled matmul) and
    attention (every 16-bit activation dtype, W8A8's bf16 included) upcast as bench/precision.py
    does; fused SiluAndMul for bf16, fp16 and bf16+head32. Returns {"upcast_linear": n,
    "upcast_attention": 0 or 1, "fused_mlp": m}."""
    from .precision import cpu_has_native, upcast_attention, upcast_matmuls

    if fmt.dtype not in (torch.float16, torch.bfloat16):
        return {"upcast_linear": 0, "upcast_attention": 0, "fused_mlp": 0}
    emulate = torch.device(device).type == "cpu" and not cpu_has_native(fmt.name)
    attention = int(emulate and upcast_attention(model))
    if fmt.quant is not None:
        return {"upcast_linear": 0, "upcast_attention": attention, "fused_mlp": 0}
    return {"upcast_linear": upcast_matmuls(model) if emulate else 0, "upcast_attention": attention,
            "fused_mlp": fuse_silu_mul(model)}
