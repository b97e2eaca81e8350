"""Number formats: one small object per format in one registry (`FORMATS`).

A format says how an engine stores and multiplies: `dtype` is the storage dtype of every
parameter it does not quantize (and of activations and linear outputs); `quant`, when set,
is the W8A8 (or W4A4) quantizer of every linear layer (lm_head included; embeddings and norms
stay in `dtype`); `head32` keeps lm_head and the logits in fp32. `cast` / `quantize` / `matmul`
are the three operations; bench/model_formats.py applies them to a model for either engine.

    fp32, fp16, bf16   parameters in that dtype (buffers such as RoPE's stay fp32)
    bf16+head32        bf16, except an fp32 lm_head and fp32 logits (vLLM's
                       hf_overrides={"head_dtype": "float32"}, SGLang's enable_fp32_lm_head,
                       TRL's cast_lm_head_to_fp32); rollout or training
    bf16+router32,     MoE models: bf16 / fp16, except every router (the gate's linear layer and
    fp16+router32      its softmax) in fp32 from the 16-bit hidden state, as prime-rl ships;
                       rollout or training; the built-in engine only. On a dense model the same
                       as bf16 / fp16. Not in `all` (bench/moe.py has the router's arithmetic)
    fp8                W8A8 e4m3 as vLLM's online `fp8_per_channel` (llm-compressor's
                       FP8_DYNAMIC): weight scale per output channel amax/448, activation scale
                       per token at run time amax/448, codes = torch's float8_e4m3fn rounding
                       (round-to-nearest-even) of the value clamped to ±448, products
                       accumulated in fp32, output bf16; rollout or training (Jet-RL's unified
                       cell: the same quantizers with a straight-through backward)
    int8               W8A8 symmetric int8: the same scales with 127, round-half-to-even,
                       clamped to ±127 (never -128: the grid stays symmetric, as amax/127
                       scaling implies; -128 is reachable only by a rounding overshoot),
                       fp32 accumulation, bf16 output; rollout only
    nvfp4              W4A4 NVFP4 (NVIDIA's Blackwell format; vLLM's `modelopt_fp4` checkpoints):
                       e2m1 values {0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6} in blocks of 16 along
                       the input dimension, each block with an e4m3 scale amax_b/6 relative to
                       an fp32 global scale amax/(448·6) — per tensor for weights, per token at
                       run time for activations (a checkpoint's calibrated static activation
                       scale does not exist for an online format). Round-to-nearest-even onto
                       e2m1, saturating at ±6; block products accumulated in fp32, bf16 output;
                       rollout only; the built-in engine only (vLLM has no online NVFP4)
    mxfp4              W4A4 MXFP4 (the OCP Microscaling format; gpt-oss ships its experts in it):
                       the same e2m1 values in blocks of 32, each block with an E8M0 scale — a
                       bare power of two, 2^(⌊log2 amax_b⌋ − 2) — and no tensor scale, for weights
                       and (per token, at run time) activations; a block's largest values above
                       6·scale saturate. Rollout only; the built-in engine only. Not in `all`
                       (the 35 pairs stay those of the results so far): name it

The clamp comes before the cast on purpose: torch 2.13 on CPU saturates a float8 cast, but
the standard (and CUDA's) conversion of a value past 448 gives NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from bench.errors import PrecisionError, did_you_mean
from bench.grids import FLOAT_GRIDS, float_step
from bench.ladder import Rung
from bench.quantizers import FP8E4M3, MXFP4, NVFP4, Int8, Quantizer


@dataclass(frozen=True)
class Format:
    name: str
    dtype: torch.dtype                       # storage of what is not quantized; activations
    quant: Quantizer | None = None           # W8A8 on every linear layer, lm_head included
    head32: bool = False                     # lm_head weight and logits in fp32
    router32: bool = False                   # MoE routers (linear + softmax) in fp32 (bench/moe.py)
    train: bool = True                       # usable as the training format
    vllm: dict | None = None                 # vLLM LLM(...) kwargs; None: vLLM cannot run it
    vllm_refusal: str = ""
    in_all: bool = True                      # one of the formats `--dtype all` pairs
    rung: Rung | None = None                 # a ladder rung: the carrier `dtype` rounded at its bits (bench/ladder.py)
    aliases: tuple[str, ...] = field(default=())

    @property
    def plain(self) -> bool:
        """Nothing but a parameter dtype for every dense layer (`router32` changes MoE routers only)."""
        return self.quant is None and not self.head32

    @property
    def dtype_name(self) -> str:
        return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[self.dtype]

    def cast(self, model, keep=()):
        """Parameters (not buffers) to `dtype`, except those in `keep` (ids)."""
        for p in model.parameters():
            if p.is_floating_point() and p.dtype != self.dtype and id(p) not in keep:
                p.data = p.data.to(self.dtype)
        return model

    def quantize(self, w: torch.Tensor, top: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A weight's codes and scales; `top`: the amax a fused group shares (nvfp4's global scale)."""
        if self.quant is None:
            raise PrecisionError(f"{self.name} does not quantize")
        return self.quant.quantize_weight(w) if top is None else self.quant.quantize_weight(w, top=top)

    def matmul(self, x: torch.Tensor, w_codes: torch.Tensor, w_scale: torch.Tensor, bias=None,
               w_gemm: torch.Tensor | None = None, split_k: int = 1) -> torch.Tensor:
        return self.quant.matmul(x, w_codes, w_scale, bias, self.dtype, w_gemm, split_k)

    def step(self, stored: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """Grid spacing at each stored weight (codes and scales for quantized formats)."""
        if self.quant is not None:
            return self.quant.step(stored, scale)
        return float_step(stored, *FLOAT_GRIDS[stored.dtype])


_VLLM_NO_ROUTER32 = ("vLLM 0.32 has no switch for an fp32 router in a bf16/fp16 model; run +router32 rollouts with "
                     "--engine torch")
_VLLM_NO_INT8 = ("vLLM 0.32 has no W8A8 int8 for a bf16/fp16 checkpoint (its online `int8_per_channel_weight_only` "
                 "is weight-only and MoE-only); run int8 rollouts with --engine torch")
_VLLM_NO_NVFP4 = ("vLLM 0.32 runs NVFP4 only from a pre-quantized checkpoint (`modelopt_fp4`, Blackwell GPUs): it has "
                  "no online NVFP4 quantization of a bf16/fp16 checkpoint; run nvfp4 rollouts with --engine torch")
_VLLM_NO_MXFP4 = ("vLLM 0.32 runs MXFP4 only from a pre-quantized checkpoint (gpt-oss's experts): it has no online "
                  "W4A4 MXFP4 quantization of a bf16/fp16 checkpoint; run mxfp4 rollouts with --engine torch")
FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("fp32", torch.float32, vllm={"dtype": "float32"}, aliases=("float32", "float")),
    Format("bf16", torch.bfloat16, vllm={"dtype": "bfloat16"}, aliases=("bfloat16",)),
    Format("bf16+head32", torch.bfloat16, head32=True,
           vllm={"dtype": "bfloat16", "hf_overrides": {"head_dtype": "float32"}}, aliases=("bf16-head32",)),
    Format("fp16", torch.float16, vllm={"dtype": "float16"}, aliases=("float16", "half")),
    Format("fp8", torch.bfloat16, quant=FP8E4M3(),
           vllm={"dtype": "bfloat16", "quantization": "fp8_per_channel"}, aliases=("e4m3", "fp8-e4m3")),
    Format("int8", torch.bfloat16, quant=Int8(), train=False, vllm_refusal=_VLLM_NO_INT8, aliases=("w8a8-int8",)),
    Format("nvfp4", torch.bfloat16, quant=NVFP4(), train=False, vllm_refusal=_VLLM_NO_NVFP4,
           aliases=("fp4", "w4a4-nvfp4")),
    Format("mxfp4", torch.bfloat16, quant=MXFP4(), train=False, vllm_refusal=_VLLM_NO_MXFP4, in_all=False,
           aliases=("mx-fp4", "w4a4-mxfp4")),
    Format("bf16+router32", torch.bfloat16, router32=True, vllm_refusal=_VLLM_NO_ROUTER32, in_all=False,
           aliases=("bf16-router32",)),
    Format("fp16+router32", torch.float16, router32=True, vllm_refusal=_VLLM_NO_ROUTER32, in_all=False,
           aliases=("fp16-router32",)),
)}
_VLLM_NO_RUNG = ("vLLM has no float formats between its dtypes; run ladder rungs with --engine torch "
                 "(bench/ladder.py emulates them)")
# the precision ladder (bench/ladder.py): rollout-only, named, never in `all`; e5m10 is fp16's grid, e8m7 bf16's
LADDER_RUNGS = tuple(Rung(5, k) for k in (10, 9, 8)) + tuple(Rung(8, k) for k in range(7, 0, -1))
FORMATS.update({r.name: Format(r.name, r.carrier, rung=r, train=False, in_all=False, vllm_refusal=_VLLM_NO_RUNG)
                for r in LADDER_RUNGS})
LADDER = ("fp32",) + tuple(r.name for r in LADDER_RUNGS)     # the ladder from the top, fp32 first
MOE_FORMATS = tuple(n for n, f in FORMATS.items() if f.router32)
NAMED_FORMATS = tuple(n for n, f in FORMATS.items() if not f.in_all)      # run when named, never in `all`
ROLLOUT_FORMATS = tuple(n for n, f in FORMATS.items() if f.in_all)
TRAIN_FORMATS = tuple(n for n, f in FORMATS.items() if f.train and f.in_all)
_ALIASES = {a: f.name for f in FORMATS.values() for a in (f.name, *f.aliases)}


def canonical(name: str) -> str:
    try:
        return _ALIASES[name.strip().lower()]
    except KeyError:
        named = tuple(n for n in NAMED_FORMATS if FORMATS[n].rung is None)
        raise PrecisionError(f"unknown dtype {name!r}{did_you_mean(name, _ALIASES)}; choose one of "
                             f"{', '.join(ROLLOUT_FORMATS + named)} or a ladder rung (e5m10…e5m8, e8m7…e8m1)") from None


def get(name: str) -> Format:
    return FORMATS[canonical(name)]
