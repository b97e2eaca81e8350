"""Precision pairs: the rollout engine's format × the training engine's format.

rollout ∈ {fp32, bf16, bf16+head32, fp16, fp8, int8, nvfp4} × train ∈ {fp32, bf16, bf16+head32,
fp16, fp8}: 35 pairs; the formats themselves are the registry in bench/formats.py. `fp16` means
both sides; `rollout=int8,train=fp32` is a mixed pair; int8 and nvfp4 are rollout-only, so
`int8` alone is refused with what to write instead.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from itertools import product

import torch

from . import formats
from .formats import PrecisionError, ROLLOUT_FORMATS, TRAIN_FORMATS

CLASSIC = ("fp32", "fp16", "bf16")       # the paper's 16/32-bit formats
DTYPES = CLASSIC                          # kept for callers that mean those three


def canon(d: str, side: str = "rollout") -> str:
    """The canonical format name; `side` "train" refuses rollout-only formats."""
    name = formats.canonical(d)
    if side == "train" and not formats.get(name).train:
        raise PrecisionError(f"{name} is a rollout-only format (there is no {name} training); write "
                             f"rollout={name},train=X with X one of {', '.join(TRAIN_FORMATS)}")
    return name


def torch_dtype(d: str):
    """The storage dtype of the format's unquantized parameters (fp8/int8: bf16)."""
    return formats.get(d).dtype


def vllm_dtype(d: str) -> str:
    return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[formats.get(d).dtype_name]


@dataclass(frozen=True)
class Precision:
    rollout: str
    train: str

    @classmethod
    def parse(cls, text: str) -> "Precision":
        """`fp16` → (fp16, fp16); `rollout=fp32,train=bf16` → that pair (either order)."""
        text = text.strip()
        if "=" not in text:
            return cls(canon(text), canon(text, "train"))
        parts = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
        if set(parts) != {"rollout", "train"} or text.count("=") != 2:
            raise PrecisionError(f"bad precision {text!r}; write e.g. fp16 or rollout=fp32,train=bf16")
        return cls(canon(parts["rollout"]), canon(parts["train"], "train"))

    @property
    def name(self) -> str:
        return self.rollout if self.rollout == self.train else f"rollout={self.rollout},train={self.train}"

    def __str__(self) -> str:
        return self.name


ALL_PAIRS = tuple(Precision(r, t) for r, t in product(ROLLOUT_FORMATS, TRAIN_FORMATS))
CLASSIC_PAIRS = tuple(Precision(r, t) for r, t in product(CLASSIC, CLASSIC))


def parse_list(text: str) -> list[Precision]:
    """`bf16,fp16` (or `bf16;fp16`) → both same-format pairs; a mixed pair is its two halves
    `rollout=X,train=Y` side by side, in a list separated by `,` or `;` alike
    (`fp16;rollout=fp8,train=fp16`, `fp16,rollout=fp8,train=fp16`); `all` → every pair (35: 7
    rollout × 5 train formats); `all16` → the paper's nine pairs of fp32, fp16, bf16."""
    if text.strip() == "all":
        return list(ALL_PAIRS)
    if text.strip() == "all16":
        return list(CLASSIC_PAIRS)
    tokens = [t.strip() for t in re.split(r"[;,]", text) if t.strip()]
    pairs, i = [], 0
    while i < len(tokens):
        if "=" not in tokens[i]:
            pairs.append(Precision.parse(tokens[i]))
            i += 1
            continue
        if i + 1 >= len(tokens) or "=" not in tokens[i + 1]:
            raise PrecisionError(f"bad precision list {text!r}: {tokens[i]!r} needs its other half "
                                 "(write a mixed pair as rollout=X,train=Y)")
        pairs.append(Precision.parse(f"{tokens[i]},{tokens[i + 1]}"))
        i += 2
    if not pairs:
        raise PrecisionError(f"bad precision list {text!r}; write e.g. bf16,fp16 or fp16;rollout=fp8,train=fp16")
    return pairs


@dataclass
class LossScaler:
    """Dynamic loss scaling for fp16 training: multiply the loss by `scale` before backward;
    on non-finite gradients skip the step and multiply the scale by `backoff`; after
    `growth_interval` finite steps in a row double it. Disabled (scale 1, never changed) for
    fp32/bf16, where a non-finite step is still skipped and counted: `skipped` and
    `skipped_in_a_row` count for every dtype (the paper's GSPO-in-BF16 failure is a NaN grad
    norm, which must end the run as `diverged`, not pass silently)."""

    enabled: bool
    scale: float = 2.0 ** 16
    growth_interval: int = 400
    backoff: float = 0.5
    good_steps: int = 0
    skipped: int = 0
    skipped_in_a_row: int = 0

    def __post_init__(self):
        if not self.enabled:
            self.scale = 1.0

    def update(self, finite: bool) -> None:
        """Record one optimizer step: applied (`finite`) or skipped for non-finite gradients."""
        if finite:
            self.skipped_in_a_row = 0
            self.good_steps += 1
            if self.enabled and self.good_steps % self.growth_interval == 0:
                self.scale *= 2.0
        else:
            self.skipped += 1
            self.skipped_in_a_row += 1
            self.good_steps = 0
            if self.enabled:
                self.scale = max(self.scale * self.backoff, 1.0)

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("enabled", "scale", "growth_interval", "backoff", "good_steps",
                                               "skipped", "skipped_in_a_row")}


def device_supports(dtype: str, device: str = "cpu") -> bool:
    """Whether `device` can run the format: matmuls in its storage dtype (fp16 on old CPUs /
    GPUs may be missing) and, for a W8A8 format, its quantize–matmul."""
    import torch

    fmt = formats.get(dtype)
    try:
        a = torch.ones(16, 16, dtype=fmt.dtype, device=device)
        ok = bool(torch.isfinite((a @ a).float()).all())
        if ok and fmt.quant is not None:
            ok = bool(torch.isfinite(fmt.matmul(a, *fmt.quantize(a.float())).float()).all())
        return ok
    except (RuntimeError, TypeError):
        return False


# ------------------------------------------------------------------ 16-bit matmuls on CPUs without them
#
# On a CPU with no bf16/fp16 GEMM (no AMX or AVX512-BF16/FP16, e.g. AVX2-only EPYC) torch falls
# back to a scalar kernel about 13x slower than fp32 (backward: 6.5 s vs 0.76 s per tiny-math
# step). A GPU trainer's 16-bit GEMM (cuBLAS) reads 16-bit operands, accumulates in fp32 and rounds
# the output once; `upcast_matmuls` does exactly that on the CPU, at fp32 speed. The built-in
# rollout engine does the same where the CPU lacks the instructions, and computes the MLP's
# activation as vLLM's fused SiluAndMul (bench/rollout_kernels.py), so the two engines still
# differ in kernels as vLLM and FSDP do on GPUs (fused vs unfused activation, decode with a KV
# cache vs one prefill). Attention's two products get the same treatment (`upcast_attention`):
# torch's CPU 16-bit flash attention is ~6× its fp32 there. Setting, for the training engine:
# BENCH_LOWP_MATMUL = auto (upcast only where the CPU lacks the instructions) | native | upcast.

_NATIVE_FLAGS = {"bf16": ("amx_bf16", "avx512_bf16"), "fp16": ("amx_fp16", "avx512_fp16")}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


CPU_16BIT_CHOICES = ("none", "bf16", "fp16", "all")


def cpu_16bit() -> frozenset[str]:
    """The 16-bit dtypes ("bf16", "fp16") whose instructions the kernels take as present: the
    CPU's own (AMX / AVX512-BF16 for bf16, AMX-FP16 / AVX512-FP16 for fp16), or what
    BENCH_CPU_16BIT = none | bf16 | fp16 | all says, so either kind of CPU's path runs on any
    machine (tests, benchmarks). A bad value is bad input (PrecisionError)."""
    import os

    mode = os.environ.get("BENCH_CPU_16BIT", "").strip()
    if not mode:
        flags = _cpu_flags()
        return frozenset(d for d, f in _NATIVE_FLAGS.items() if flags & set(f))
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
    import os

    mode = os.environ.get("BENCH_LOWP_MATMUL", "auto")
    if mode not in ("auto", "native", "upcast"):
        raise PrecisionError(f"BENCH_LOWP_MATMUL={mode!r}; choose auto, native or upcast")
    if formats.get(dtype).dtype_name == "fp32" or not str(device).startswith("cpu") or mode == "native":
        return False
    return mode == "upcast" or not cpu_has_native(dtype)


def _upcast_linear_forward(self, x):
    import torch.nn.functional as F

    w = self.weight
    if w.element_size() == 4:        # fp32 layer: nothing to emulate
        return F.linear(x, w, self.bias)
    y = F.linear(x.float(), w.float(), None if self.bias is None else self.bias.float())
    return y.to(w.dtype)


def upcast_matmuls(model) -> int:
    """Make every nn.Linear of `model` compute in fp32 from its 16-bit operands and round the
    output to the weight dtype (see above). Returns how many layers it changed."""
    import types

    import torch

    n = 0
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and "forward" not in mod.__dict__:
            mod.forward = types.MethodType(_upcast_linear_forward, mod)
            n += 1
    return n


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


def cast_parameters(model, dtype: str):
    """Cast the parameters of `model` to `dtype` in place; buffers keep their dtype.

    `model.to(dtype)` would also round floating buffers such as RoPE's `inv_freq` and
    `original_inv_freq` to 16 bits, a distortion that grows with position. FSDP's mixed
    precision and vLLM keep those buffers in fp32, so every engine here casts parameters
    only. Tied parameters stay tied (the one Parameter object is cast once). For a format
    this is its storage dtype only; bench/format_modules.py does the rest."""
    return formats.get(dtype).cast(model)


def prepare_compute_model(model, dtype: str, device: str = "cpu"):
    """The training engine's copy of `model` in format `dtype`: parameters cast (buffers stay
    fp32); where the CPU lacks 16-bit GEMM, 16-bit matmuls upcast; fp8 quantizes in the forward
    with a straight-through backward; bf16+head32 keeps an fp32 lm_head
    (bench/format_modules.py). Parameters keep their order."""
    from .format_modules import prepare_train

    return prepare_train(model, formats.get(canon(dtype, "train")), device)
