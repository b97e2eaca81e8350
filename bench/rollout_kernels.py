"""The built-in rollout engine's arithmetic, as an inference engine (vLLM) computes it.

A training engine (transformers modules under FSDP) and an inference engine run the same model
with different kernels, and that difference is the training–inference mismatch the sanity test
measures. On a GPU the causes are (FP16 paper §2; vLLM, FlashAttention-2): fused activations,
other reduction orders in the GEMMs (decode GEMMs split the reduction dimension, a training
prefill GEMM does not) and FlashAttention's rounding of P. The built-in engine reproduces each
of them for every rollout format but fp32, so no pair but fp32/fp32 ever computes identically,
on any CPU:

1. **Fused activation** (vLLM `SiluAndMul`, every 16-bit activation dtype: bf16, fp16,
   bf16+head32 and the bf16 activations of fp8, int8, nvfp4): silu(gate) · up in fp32 from the
   projections and rounded once,
       h = round16( silu(g) · u ),
   where transformers' `LlamaMLP` (and Qwen2's, Mistral's) rounds twice:
       h = round16( round16(silu(g)) · u ).
   A difference of the format's unit roundoff (2^-8 bf16, 2^-11 fp16) in every layer and token.
2. **Split-K reduction** where the engine emulates a GEMM (16-bit GEMMs on CPUs without the
   instructions; the W8A8 / W4A4 scaled GEMMs on every device): the reduction dimension in
   SPLIT_K equal slices whose fp32 partial sums are added in order
       y = round( ((P_0 + P_1) + P_2) + P_3 ),  P_s = x[:, K_s] W[:, K_s]ᵀ   (fp32)
   (bench.formats.split_k_matmul), where the trainer's GEMM reduces K in one pass: the same
   real sum in another fp32 order, so fp32-level differences (~2^-24 relative) reach the final
   rounding as they do between a GPU's decode and prefill kernels. Where the CPU has the
   16-bit instructions, torch's own kernels run in both engines, and their blocking differs
   between a decode GEMM (a few rows) and a training GEMM (all rows).
3. **GEMMs and attention read 16-bit operands and accumulate in fp32** with one rounding
   (cuBLAS, FlashAttention; bench.precision.upcast_matmuls / upcast_attention) — the same
   contract in both engines; torch's own CPU 16-bit GEMM on CPUs without the instructions (no
   AVX512-FP16/AMX-FP16 for fp16, no AVX512-BF16/AMX for bf16) is a scalar kernel 2–4× slower
   than fp32, so both engines upcast there (BENCH_CPU_16BIT overrides the detection).
4. **Decode with a KV cache** against the trainer's single prefill: other GEMM shapes.

What is modelled is these rounding differences, at the rates the format's unit roundoff and
the split-K order give; their size against real vLLM is measured (docs/precision.md, "How the
engines differ"), not assumed. fp32 rollouts are left alone (fp32/fp32 differs only by kernel
order, k3 ~1e-13).
"""

from __future__ import annotations

import types

import torch
from torch import nn

SILU_MLP = ("gate_proj", "up_proj", "down_proj", "act_fn")
SPLIT_K = 4          # slices of the reduction dimension in the rollout engine's emulated GEMMs


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


def _split_k_linear_forward(self, x):
    """The 16-bit linear layer as a decode GEMM: fp32 from 16-bit operands, K in SPLIT_K slices
    (split_k_matmul), bias in fp32, one rounding to the weight dtype."""
    from .formats import split_k_matmul

    w = self.weight
    y = split_k_matmul(x.float(), w.float(), SPLIT_K)
    if self.bias is not None:
        y = y + self.bias.float()
    return y.to(w.dtype)


def split_k_matmuls(model: nn.Module, sixteen_bit: bool = True) -> int:
    """Every quantized layer's scaled GEMM reduces in SPLIT_K slices; with `sixteen_bit`, every
    16-bit nn.Linear computes as `_split_k_linear_forward` too. Returns how many layers changed."""
    from .format_modules import QuantLinear

    n = 0
    for mod in model.modules():
        if isinstance(mod, QuantLinear):
            mod.split_k = SPLIT_K
            n += 1
        elif (sixteen_bit and isinstance(mod, nn.Linear) and mod.weight.element_size() == 2
              and "forward" not in mod.__dict__):
            mod.forward = types.MethodType(_split_k_linear_forward, mod)
            n += 1
    return n


NO_KERNELS = {"split_k_linear": 0, "upcast_attention": 0, "fused_mlp": 0}


def apply(model: nn.Module, fmt, device) -> dict[str, int]:
    """Apply the rollout engine's kernels to `model`, already prepared in the format `fmt`
    (bench/format_modules.py; see the module docstring): fused SiluAndMul for every format with
    16-bit activations; split-K GEMMs for the quantized layers (every device) and, where the CPU
    lacks the format's 16-bit instructions, for the 16-bit layers, with attention upcast
    (bench/precision.py). fp32: nothing. Returns {"split_k_linear": n, "upcast_attention": 0 or 1,
    "fused_mlp": m}."""
    from .precision import cpu_has_native, upcast_attention

    if fmt.dtype not in (torch.float16, torch.bfloat16):
        return dict(NO_KERNELS)
    emulate = torch.device(device).type == "cpu" and not cpu_has_native(fmt.name)
    attention = int(emulate and upcast_attention(model))
    from .moe import apply_rollout_kernels

    return {"split_k_linear": split_k_matmuls(model, sixteen_bit=emulate), "upcast_attention": attention,
            "fused_mlp": fuse_silu_mul(model) + apply_rollout_kernels(model, emulate)}
