"""The CPU 16-bit kernels of both engines, and the arithmetic the built-in rollout engine shares
with an inference engine (vLLM). Which of them a model gets is bench/model_formats.py's choice
(`prepare_train` for the training engine, `apply_rollout_kernels` for the rollout engine).

**The training engine on CPUs without 16-bit GEMM.** On a CPU with no bf16/fp16 GEMM (no AMX or
AVX512-BF16/FP16, e.g. AVX2-only EPYC) torch falls back to a scalar kernel about 13x slower than
fp32 (backward: 6.5 s vs 0.76 s per tiny-math step). A GPU trainer's 16-bit GEMM (cuBLAS) reads
16-bit operands, accumulates in fp32 and rounds the output once; `upcast_matmuls` does exactly
that on the CPU, at fp32 speed. Attention's two products get the same treatment
(`upcast_attention`, FlashAttention-2's arithmetic): torch's CPU 16-bit flash attention is ~6×
its fp32 there. Setting, for the training engine: BENCH_LOWP_MATMUL = auto (upcast only where
the CPU lacks the instructions) | native | upcast. `cpu_16bit` detects the instructions
(BENCH_CPU_16BIT = none | bf16 | fp16 | all overrides it, so either CPU's path runs anywhere).

**The rollout engine.** A training engine (transformers modules under FSDP) and an inference
engine run the same model with different kernels, and that difference is the
training–inference mismatch the sanity test measures. On a GPU the causes are (FP16 paper §2;
vLLM, FlashAttention-2): fused activations, other reduction orders in the GEMMs (decode GEMMs
split the reduction dimension, a training prefill GEMM does not) and FlashAttention's rounding
of P. The built-in engine reproduces each of them for every rollout format but fp32, so no pair
but fp32/fp32 ever computes identically, on any CPU:

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
   (bench.gemms.split_k_matmul), where the trainer's GEMM reduces K in one pass: the same
   real sum in another fp32 order, so fp32-level differences (~2^-24 relative) reach the final
   rounding as they do between a GPU's decode and prefill kernels. Where the CPU has the
   16-bit instructions, torch's own kernels run in both engines, and their blocking differs
   between a decode GEMM (a few rows) and a training GEMM (all rows).
3. **GEMMs and attention read 16-bit operands and accumulate in fp32** with one rounding
   (cuBLAS, FlashAttention; `upcast_matmuls` / `upcast_attention`) — the same contract in both
   engines; torch's own CPU 16-bit GEMM on CPUs without the instructions (no
   AVX512-FP16/AMX-FP16 for fp16, no AVX512-BF16/AMX for bf16) is a scalar kernel 2–4× slower
   than fp32, so both engines upcast there (BENCH_CPU_16BIT overrides the detection).
4. **Decode with a KV cache** against the trainer's single prefill: other GEMM shapes.

What is modelled is these rounding differences, at the rates the format's unit roundoff and
the split-K order give; their size against real vLLM is measured (docs/precision.md, "How the
engines differ"), not assumed. fp32 rollouts are left alone (fp32/fp32 differs only by kernel
order, k3 ~1e-13).
"""

from __future__ import annotations

import os
import types

import torch
import torch.nn.functional as F
from torch import nn

from . import formats
from .errors import PrecisionError
from .gemms import split_k_matmul

# ------------------------------------------------------------ which 16-bit instructions the CPU has

# the CPU features that give native 16-bit arithmetic: x86 (Linux /proc/cpuinfo "flags") and Arm
# (Linux "Features": bf16, and asimdhp/fphp for half precision; macOS the same names from sysctl)
_NATIVE_FLAGS = {"bf16": ("amx_bf16", "avx512_bf16", "bf16"), "fp16": ("amx_fp16", "avx512_fp16", "asimdhp", "fphp")}
# macOS on Apple silicon: sysctl hw.optional.arm.FEAT_* = 1 → the Linux feature name
_SYSCTL_FEATURES = {"hw.optional.arm.FEAT_BF16": "bf16", "hw.optional.arm.FEAT_FP16": "asimdhp"}


def cpuinfo_field(key: str) -> str | None:
    """The value of the first `key` line of /proc/cpuinfo ("flags", "model name", "vendor_id"),
    or None where there is none (no such file: not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _sysctl(name: str) -> str | None:
    """`sysctl -n NAME` (macOS), or None where there is no such command or key."""
    import shutil
    import subprocess

    exe = shutil.which("sysctl")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def cpu_features(flags: str | None, features: str | None, sysctl=_sysctl) -> set[str]:
    """The CPU's feature names from what the machine offers: /proc/cpuinfo's x86 `flags` or Arm
    `Features` line, else (macOS, no /proc) the sysctl keys of _SYSCTL_FEATURES; an empty set
    where none of them is there (then every 16-bit format takes bench's emulated kernels, which
    are correct on any CPU, only slower). Pure but for `sysctl`, so any machine can be faked."""
    if flags or features:
        return set((flags or "").split()) | set((features or "").split())
    return {name for key, name in _SYSCTL_FEATURES.items() if (sysctl(key) or "").strip() == "1"}


def _cpu_flags() -> set[str]:
    return cpu_features(cpuinfo_field("flags"), cpuinfo_field("Features"))


def native_16bit(flags: set[str]) -> frozenset[str]:
    """The 16-bit dtypes whose instructions `flags` name (_NATIVE_FLAGS)."""
    return frozenset(d for d, f in _NATIVE_FLAGS.items() if flags & set(f))


def cpu_16bit_flags() -> list[str]:
    """The CPU's flags that decide its 16-bit kernels (AMX, AVX512-BF16/FP16, Arm's bf16 and
    half-precision SIMD) and AVX2, sorted: what the benchmarks print beside their ratios."""
    return sorted(_cpu_flags() & {"avx2", *(f for fs in _NATIVE_FLAGS.values() for f in fs)})


CPU_16BIT_CHOICES = ("none", "bf16", "fp16", "all")


def cpu_16bit() -> frozenset[str]:
    """The 16-bit dtypes ("bf16", "fp16") whose instructions the kernels take as present: the
    CPU's own (AMX / AVX512-BF16 for bf16, AMX-FP16 / AVX512-FP16 for fp16), or what
    BENCH_CPU_16BIT = none | bf16 | fp16 | all says, so either kind of CPU's path runs on any
    machine (tests, benchmarks). A bad value is bad input (PrecisionError)."""
    mode = os.environ.get("BENCH_CPU_16BIT", "").strip()
    if not mode:
        return native_16bit(_cpu_flags())
    if mode not in CPU_16BIT_CHOICES:
        raise PrecisionError(f"BENCH_CPU_16BIT={mode!r}; choose one of {', '.join(CPU_16BIT_CHOICES)} "
                             "(unset: what the CPU has)")
    return frozenset({"none": (), "all": ("bf16", "fp16")}.get(mode, (mode,)))


def cpu_kernel_path() -> str:
    """The CPU 16-bit kernel path in one word, as stored with results: none, bf16, fp16 or all."""
    have = cpu_16bit()
    return "all" if len(have) == 2 else next(iter(have), "none")


def cpu_has_native(dtype: str) -> bool:
    """Whether the CPU (or BENCH_CPU_16BIT) has the 16-bit instructions of the format's dtype."""
    return formats.get(dtype).dtype_name in cpu_16bit()


def should_upcast(dtype: str, device: str = "cpu") -> bool:
    mode = os.environ.get("BENCH_LOWP_MATMUL", "auto")
    if mode not in ("auto", "native", "upcast"):
        raise PrecisionError(f"BENCH_LOWP_MATMUL={mode!r}; choose auto, native or upcast")
    if formats.get(dtype).dtype_name == "fp32" or not str(device).startswith("cpu") or mode == "native":
        return False
    return mode == "upcast" or not cpu_has_native(dtype)


# ------------------------------------------------------------ 16-bit GEMMs and attention upcast (both engines)

def _upcast_linear_forward(self, x):
    w = self.weight
    if w.element_size() == 4:        # fp32 layer: nothing to emulate
        return F.linear(x, w, self.bias)
    y = F.linear(x.float(), w.float(), None if self.bias is None else self.bias.float())
    return y.to(w.dtype)


def _patch_forwards(model: nn.Module, wanted, forward) -> int:
    """Bind `forward` to every module of `model` that `wanted(module)` accepts and whose forward
    nothing has replaced yet; returns how many modules it changed."""
    mods = [m for m in model.modules() if wanted(m) and "forward" not in m.__dict__]
    for mod in mods:
        mod.forward = types.MethodType(forward, mod)
    return len(mods)


def upcast_matmuls(model) -> int:
    """Make every nn.Linear of `model` compute in fp32 from its 16-bit operands and round the
    output to the weight dtype (see above). Returns how many layers it changed."""
    return _patch_forwards(model, lambda m: isinstance(m, nn.Linear), _upcast_linear_forward)


UPCAST_ATTENTION = "bench_upcast"      # the attention implementation name `upcast_attention` registers


def flash_attention_arithmetic(s: torch.Tensor, v: torch.Tensor, dtype: torch.dtype,
                               dropout: float = 0.0) -> torch.Tensor:
    """FlashAttention-2's arithmetic from fp32 scores `s` [..., Lq, Lk] (scaled, masked: −inf
    where not attended) and fp32 values `v` [..., Lk, D] (16-bit values upcast):
        m = max_k S,   E = exp(S − m) (fp32),   l = Σ_k E (fp32, before any rounding),
        O = round16( (round16(E) · V)_fp32 / l )
    — the unnormalised exp(S − m) ∈ (0, 1] is rounded to 16 bits for the P·V product and the
    fp32 row sum divides at the end, so a long diffuse row keeps normal 16-bit numbers where
    rounding the normalised probabilities (≈ 1/Lk each) would fall into subnormals. One block
    holds every key here; the blockwise kernel rescales its running max in fp32 and rounds
    exp(S − m_running) instead, a difference of the same unit roundoff. Fully masked rows
    (left padding) give 0. `dropout` drops entries of E for the product, not of l (as FA does)."""
    m = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    l = e.sum(dim=-1, keepdim=True)
    p = torch.nn.functional.dropout(e, dropout) if dropout else e
    o = torch.matmul(p.to(dtype).float(), v) / torch.where(l > 0, l, torch.ones_like(l))
    return o.to(dtype)


def _upcast_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                              is_causal=None, softcap=None, **kwargs):
    """Attention with FlashAttention-2's arithmetic from 16-bit q, k, v (torch's own CPU kernel
    follows the same contract, slowly where the CPU lacks the instructions):
        S = softcap · tanh((Q Kᵀ)_fp32 · scale / softcap) + mask   (softcap: Gemma 2; else no tanh)
    then `flash_attention_arithmetic`. Shapes as transformers' attention functions: q
    [B, H, Lq, D], k/v [B, H_kv, Lk, D], a bool (True = attend) or additive mask
    [B, 1, Lq, Lk] or None (causal when Lq > 1); returns ([B, Lq, H, D], None). Attention sinks
    (`s_aux`, gpt-oss) are refused: this arithmetic does not model them."""
    from transformers.integrations.sdpa_attention import repeat_kv

    if kwargs.get("s_aux") is not None:
        raise PrecisionError("the upcast attention does not model attention sinks (s_aux); "
                             "set BENCH_LOWP_MATMUL=native or run on a CPU with the 16-bit instructions")
    dt = query.dtype
    rep = query.shape[1] // key.shape[1]
    k, v = repeat_kv(key, rep).float(), repeat_kv(value, rep).float()
    s = torch.matmul(query.float(), k.transpose(-1, -2)) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    lq, lk = s.shape[-2:]
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    if attention_mask is None and lq > 1 and causal:
        attention_mask = torch.ones(lq, lk, dtype=torch.bool, device=s.device).tril(lk - lq)
    if attention_mask is not None:
        m = attention_mask[..., :lk]
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
    out = flash_attention_arithmetic(s, v, dt, dropout if module.training else 0.0)
    return out.transpose(1, 2).contiguous(), None


def upcast_attention(model) -> bool:
    """Give a transformers `model` `_upcast_attention_forward` as its attention (registered with
    transformers as `bench_upcast`, with sdpa's masks): on a CPU without 16-bit instructions,
    torch's 16-bit flash attention is ~6× its fp32 (tiny-math fp16: 1.56 s of a 3.75 s training
    step against 0.25 s in fp32). False when the model takes no attention implementation."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(UPCAST_ATTENTION, _upcast_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(UPCAST_ATTENTION, sdpa_mask)
    if not hasattr(model, "set_attn_implementation"):
        return False
    model.set_attn_implementation(UPCAST_ATTENTION)
    return True


# ------------------------------------------------------------ the rollout engine's fused activation, split-K GEMMs

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
    return _patch_forwards(model, lambda m: all(hasattr(m, a) for a in SILU_MLP) and _is_silu(m.act_fn),
                           _fused_silu_mul_forward)


def _fp32_weight(linear: nn.Linear) -> torch.Tensor:
    """The layer's 16-bit weight as fp32 (exact), made once per weight version: a sync writes
    the weight in place (its `_version` moves), so the copy is remade then and only then."""
    w = linear.weight
    key = (w.data_ptr(), w._version)
    cached = linear.__dict__.get("_w32")
    if cached is None or cached[0] != key:
        cached = linear.__dict__["_w32"] = (key, w.detach().float())
    return cached[1]


def split_k_linear(x: torch.Tensor, w32: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """A 16-bit linear layer as a decode GEMM: fp32 from 16-bit operands (`w32`, the weight as
    fp32), K in SPLIT_K slices (split_k_matmul), bias in fp32, one rounding to `dtype`."""
    y = split_k_matmul(x.float(), w32, SPLIT_K)
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


def _split_k_linear_forward(self, x):
    return split_k_linear(x, _fp32_weight(self), self.bias, self.weight.dtype)


def split_k_linears(model: nn.Module) -> int:
    """Every 16-bit nn.Linear of `model` computes as `_split_k_linear_forward` (a decode GEMM in
    SPLIT_K slices). Returns how many layers changed; the quantized layers' scaled GEMMs get the
    same order from bench/model_formats.split_k_matmuls."""
    return _patch_forwards(model, lambda m: isinstance(m, nn.Linear) and m.weight.element_size() == 2,
                           _split_k_linear_forward)
