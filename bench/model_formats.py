"""A format (bench/formats.py) applied to a transformers model, for either engine.

Rollout side (`RolloutWeights`, used by the built-in engine): parameters are cast to the
format's dtype (buffers such as RoPE's stay fp32); for a W8A8 format every nn.Linear,
lm_head included, becomes a `QuantLinear` holding codes and per-channel scales; for
`bf16+head32` lm_head becomes an fp32 `Head32Linear`. A tied lm_head is untied on the way:
the embedding stays in the format's dtype while the head is quantized (or fp32) from the
same master tensor, and a weight sync that carries the embedding's master tensor refreshes
both. Every sync re-quantizes from the fp32 master, as a weight sync into a quantized vLLM
does. Where the format has a per-tensor weight scale (nvfp4's global scale), the projections
vLLM fuses into one layer (q/k/v → qkv_proj, gate/up → gate_up_proj) share it — the largest
amax of the group, as Model-Optimizer's export gives a fused layer one `weight_scale_2`.

Training side (`prepare_compute_model` by format name, `prepare_train`): the compute copy keeps
the module tree and its parameter list (the trainer pairs compute and master parameters by
position). For a W8A8 format the
linear weights stay fp32 and each nn.Linear forward runs the same quantizers as the rollout
engine (`W8A8STE`) with a straight-through backward; for `bf16+head32` lm_head stays fp32 and
computes fp32 logits. A tied embedding that stays fp32 for the head's sake has its output
rounded to the format's dtype, which is what a lookup in a cast embedding gives. Where the CPU
lacks the format's 16-bit GEMM, the remaining 16-bit matmuls and attention upcast (bench/kernels.py).

Kernels (`apply_rollout_kernels`): which of bench/kernels.py's kernels the rollout engine's model
gets for its format and device (fused SiluAndMul, split-K GEMMs, upcast attention, and for
every format vLLM's fused q/k/v and gate/up projections: bench/fused_projections.py).

Sync statistics (`RolloutWeights.load(..., track=True)`), over the weights of every linear
layer (lm_head included), at each sync:
  rollout_weights_moved   fraction whose stored value changed: the code (int8 value / e4m3
                          bit pattern / 2 × e2m1 value) for a quantized format, the 16/32-bit
                          value otherwise. A per-channel (or per-block) scale that follows its
                          amax changes the dequantized values without moving any code: not
                          counted.
  rollout_update_to_step  median over those weights of |Δw| / δ, Δw the fp32 master's change
                          since the previous sync and δ the grid spacing at the new stored
                          value: int8 the channel scale; e4m3 the scale × 2^(max(⌊log2|c|⌋, −6) − 3)
                          at code c; nvfp4 the e2m1 spacing at the code × its block's scale;
                          bf16/fp16/fp32 the value's ulp. Far below 1/2: most updates cannot move the
                          quantized copy. Over every such weight up to TRACK_SAMPLE (2^24) of them; a
                          larger model uses a fixed uniform sample of 2^24 positions (its fp32 copy of
                          the last sync is then ~200 MB, not 4 bytes per weight on the device).
"""

from __future__ import annotations

import types
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from . import formats, kernels, ladder, moe
from .formats import Format
from .gemms import W8A8STE
from .fused_projections import fuse_projections, fused_groups, unfuse_projections
from .precision import canon

TRACK_SAMPLE = 2 ** 24      # weights behind rollout_update_to_step at most (see the module docstring)


# ------------------------------------------------------------------ rollout side

class QuantLinear(nn.Module):
    """Inference-only quantized linear layer: codes [out, in] and scales ([out, 1] per channel,
    [out, in/16] for nvfp4's blocks) as buffers. `group_top`: the amax of the fused projection
    it belongs to, where the format shares one global scale across it (nvfp4); `split_k`: the
    slices its GEMM reduces in (`split_k_matmuls`, bench/kernels.py)."""

    split_k = 1

    def __init__(self, linear: nn.Linear, fmt: Format, group_top: float | None = None):
        super().__init__()
        self.fmt, self.in_features, self.out_features = fmt, linear.in_features, linear.out_features
        self.group_top = group_top
        codes, scale = fmt.quantize(linear.weight.detach().float(), top=group_top)
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(fmt.dtype))
        # the weight as the format's GEMM reads it (Quantizer.gemm_weight), remade at each sync; a
        # buffer so it moves with the module, not persistent so checkpoints stay codes + scales
        self.register_buffer("w_gemm", fmt.quant.gemm_weight(codes, scale), persistent=False)

    def forward(self, x):
        return self.fmt.matmul(x, self.codes, self.scale, self.bias, self.w_gemm, self.split_k)

    @torch.no_grad()
    def load_weight(self, w: torch.Tensor, track: bool = False):
        """Re-quantize from `w`, written in place (the buffers may be views of a fused group's:
        bench/fused_projections.py)."""
        codes, scale = self.fmt.quantize(w.float(), top=self.group_top)
        moved = ~self.fmt.quant.same(codes, self.codes) if track else None
        self.codes.copy_(codes)
        self.scale.copy_(scale)
        self.w_gemm.copy_(self.fmt.quant.gemm_weight(codes, scale))
        return (moved, self.fmt.step(codes, scale)) if track else None

    @torch.no_grad()
    def load_bias(self, b: torch.Tensor, track: bool = False):
        self.bias.copy_(b.to(self.bias.dtype))


class Head32Linear(nn.Module):
    """lm_head in fp32: fp32 weight, the hidden state upcast, fp32 logits."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.register_buffer("weight", linear.weight.detach().float().clone())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x):
        return F.linear(x.float(), self.weight, self.bias)

    load_weight = moe.Router32.load_weight      # the same fp32 weight, reloaded in place

    @torch.no_grad()
    def load_bias(self, b: torch.Tensor, track: bool = False):
        self.bias.copy_(b.float())


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


@torch.no_grad()
def _copy_param(p: nn.Parameter, fmt: Format, linear: bool, t: torch.Tensor, track: bool = False):
    old = p.detach().clone() if linear and track else None
    p.copy_(t.to(p.dtype))
    return None if old is None else (p != old, fmt.step(p.detach()))


class RolloutWeights:
    """Prepares `model` (fp32, as loaded) for the rollout engine in `fmt` and loads later
    weights into it by the master's parameter names (`model.named_parameters()` of an
    identical fp32 model: a tied pair comes once, under the embedding's name)."""

    def __init__(self, model: nn.Module, fmt: Format, track: bool = False):
        self.fmt = fmt
        unfuse_projections(model)            # a model another engine prepared: its members compute alone again
        owners: dict[int, list[tuple[str, nn.Module, str]]] = {}
        for mod_name, mod in model.named_modules():
            for attr, p in mod.named_parameters(recurse=False):
                owners.setdefault(id(p), []).append((mod_name, mod, attr))
        canonical = list(model.named_parameters())
        is_linear_weight = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
        is_linear_weight |= {id(p) for m in model.modules() for a, p in m.named_parameters(recurse=False)
                             if moe.is_linear_weight(m, a)}          # MoE experts and routers (bench/moe.py)
        # the fp32 master of every linear weight as it was (for |Δw| at the first sync), or of a
        # fixed uniform sample of TRACK_SAMPLE positions when there are more
        self.sample: dict[str, torch.Tensor | None] = {}
        if track:
            lin = [(n, p) for n, p in canonical if id(p) in is_linear_weight]
            n_lin = sum(p.numel() for _, p in lin)
            for k, (n, p) in enumerate(lin):
                self.sample[n] = (None if n_lin <= TRACK_SAMPLE else torch.randint(
                    p.numel(), (max(1, -(-p.numel() * TRACK_SAMPLE // n_lin)),),
                    generator=torch.Generator().manual_seed(k)).to(p.device))
        self.prev: dict[str, torch.Tensor] = {n: self._tracked(n, p.detach()) for n, p in canonical
                                              if n in self.sample}
        replaced: dict[int, nn.Module] = {}
        # the weight names of each fused projection that shares one global scale
        self.groups: list[list[str]] = ([[f"{m}.weight" for m in members] for members in fused_groups(model)]
                                        if fmt.quant is not None and fmt.quant.fused_global_scale else [])
        tops = self._group_tops(dict(model.named_parameters()))
        self.quant_modules: dict[str, QuantLinear] = {}
        if not fmt.plain:
            head = model.get_output_embeddings()
            for mod_name, mod in list(model.named_modules()):
                if isinstance(mod, nn.Linear) and (fmt.quant is not None or mod is head):
                    top = tops.get(f"{mod_name}.weight")
                    new = QuantLinear(mod, fmt, top) if fmt.quant is not None else Head32Linear(mod)
                    _set_module(model, mod_name, new)
                    replaced[id(mod)] = new
                    if fmt.quant is not None:
                        self.quant_modules[f"{mod_name}.weight"] = new
        replaced.update(moe.prepare_rollout_experts(model, fmt))
        fmt.cast(model)
        if fmt.rung is not None:             # a ladder rung: the carrier's values on the rung's grid
            ladder.attach(model, fmt.rung)
        self.model = model
        self.loaders: dict[str, list] = {}
        self.linear_names: set[str] = set()
        for name, p in canonical:
            fns, copied = [], False
            is_linear = id(p) in is_linear_weight
            for _, mod, attr in owners[id(p)]:
                new = replaced.get(id(mod))
                if new is not None:
                    fns.append(new.loader(attr) if hasattr(new, "loader")
                               else new.load_weight if attr == "weight" else new.load_bias)
                elif not copied:        # the surviving parameter (a tied pair's embedding, or any other)
                    still_linear = is_linear and not any(id(m) in replaced for _, m, _ in owners[id(p)])
                    fns.append(partial(_copy_param, p, fmt, still_linear))
                    copied = True
            self.loaders[name] = fns
            if is_linear:
                self.linear_names.add(name)

    def _group_tops(self, tensors: dict[str, torch.Tensor]) -> dict[str, float]:
        """For every weight of a fused group: the largest |w| over the group's members in
        `tensors` (a member missing from them does not count)."""
        tops: dict[str, float] = {}
        for members in self.groups:
            present = [m for m in members if m in tensors]
            if present:
                top = max(float(tensors[m].detach().float().abs().amax()) for m in present)
                tops.update(dict.fromkeys(present, top))
        return tops

    def _tracked(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """`t` flattened to fp32 at the tracked positions of weight `name` (all, or its sample)."""
        idx = self.sample.get(name)
        flat = t.float().flatten()
        return flat.clone() if idx is None else flat[idx]

    @torch.no_grad()
    def load(self, named_tensors, track: bool = False) -> dict[str, float]:
        moved = total = 0
        ratios = []
        named_tensors = list(named_tensors)
        for name, top in self._group_tops(dict(named_tensors)).items():
            self.quant_modules[name].group_top = top
        for name, t in named_tensors:
            for fn in self.loaders[name]:
                out = fn(t.detach(), track)
                if out is None:
                    continue
                m, step = out
                moved += int(m.sum())
                total += m.numel()
                if name in self.prev:
                    ratios.append((self._tracked(name, t.detach()) - self.prev[name]).abs()
                                  / self._tracked(name, step))
            if track and name in self.linear_names:
                self.prev[name] = self._tracked(name, t.detach())
        if self.fmt.rung is not None:
            ladder.round_parameters(self.model, self.fmt.rung)
        stats = {}
        if total:
            stats["rollout_weights_moved"] = moved / total
        if ratios:
            stats["rollout_update_to_step"] = torch.cat(ratios).median().item()
        return stats


# ------------------------------------------------------------------ training side

def _w8a8_forward(self, x):
    return W8A8STE.apply(x, self.weight, self.bias, self._bench_format)


def _head32_forward(self, x):
    return F.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())


def _cast_output(dtype, module, args, output):
    return output.to(dtype)


def prepare_train(model: nn.Module, fmt: Format, device: str = "cpu") -> nn.Module:
    """The training compute copy in `fmt` (see the module docstring); parameters keep their
    order, so the trainer's compute↔master pairing and gradient copy are unchanged."""
    if not fmt.train:
        raise ValueError(f"{fmt.name} is a rollout-only format")
    keep: set[int] = set()
    if not fmt.plain:
        head = model.get_output_embeddings()
        for mod in model.modules():
            if not isinstance(mod, nn.Linear) or (fmt.quant is None and mod is not head):
                continue
            keep.add(id(mod.weight))            # W8A8: fp32 weights, quantized from fp32 as the rollout side
            if fmt.quant is not None:
                mod._bench_format = fmt
                mod.forward = types.MethodType(_w8a8_forward, mod)
            else:
                keep.update(id(p) for p in mod.parameters(recurse=False))
                mod.forward = types.MethodType(_head32_forward, mod)
    keep |= moe.prepare_train_experts(model, fmt, device)
    fmt.cast(model, keep)
    emb = model.get_input_embeddings()
    if emb is not None and emb.weight.dtype != fmt.dtype:       # tied to an fp32 head
        emb.register_forward_hook(partial(_cast_output, fmt.dtype))
    if kernels.should_upcast(fmt.dtype_name, device):
        kernels.upcast_matmuls(model)          # the remaining 16-bit linear layers (patched ones are skipped)
        kernels.upcast_attention(model)
    return model


def prepare_compute_model(model: nn.Module, dtype: str, device: str = "cpu") -> nn.Module:
    """The training engine's copy of `model` in format `dtype`: parameters cast (buffers stay
    fp32); where the CPU lacks 16-bit GEMM, 16-bit matmuls upcast (bench/kernels.py); fp8
    quantizes in the forward with a straight-through backward; bf16+head32 keeps an fp32
    lm_head (`prepare_train`). A rollout-only format is refused (PrecisionError). Parameters
    keep their order."""
    return prepare_train(model, formats.get(canon(dtype, "train")), device)


# ------------------------------------------------------------------ the rollout engine's kernels

NO_KERNELS = {"split_k_linear": 0, "upcast_attention": 0, "fused_mlp": 0, "fused_projections": 0}


def split_k_matmuls(model: nn.Module, sixteen_bit: bool = True) -> int:
    """Every quantized layer's scaled GEMM reduces in kernels.SPLIT_K slices; with `sixteen_bit`,
    every 16-bit nn.Linear computes as a split-K decode GEMM too (kernels.split_k_linears).
    Returns how many layers changed."""
    quant = [mod for mod in model.modules() if isinstance(mod, QuantLinear)]
    for mod in quant:
        mod.split_k = kernels.SPLIT_K
    return len(quant) + (kernels.split_k_linears(model) if sixteen_bit else 0)


def apply_rollout_kernels(model: nn.Module, fmt: Format, device) -> dict[str, int]:
    """Apply the rollout engine's kernels (bench/kernels.py) to `model`, already prepared in the
    format `fmt` (`RolloutWeights`) and on its device: fused SiluAndMul for every format with
    16-bit activations; split-K GEMMs for the quantized layers (every device) and, where the
    CPU lacks the format's 16-bit instructions, for the 16-bit layers, with attention upcast;
    then, for every format, fp32 included, vLLM's fused q/k/v and gate/up projections (the same
    numbers: bench/fused_projections.py). Returns {"split_k_linear": n, "upcast_attention": 0
    or 1, "fused_mlp": m, "fused_projections": g}."""
    got = dict(NO_KERNELS)
    if fmt.dtype in (torch.float16, torch.bfloat16):
        # a ladder rung always takes the emulated kernels (bench/ladder.py: its single rounding)
        emulate = torch.device(device).type == "cpu" and (fmt.rung is not None or not kernels.cpu_has_native(fmt.name))
        attention = int(emulate and kernels.upcast_attention(model))
        got.update({"split_k_linear": split_k_matmuls(model, sixteen_bit=emulate), "upcast_attention": attention,
                    "fused_mlp": kernels.fuse_silu_mul(model) + moe.apply_expert_kernels(model, emulate)})
    got["fused_projections"] = fuse_projections(model)
    return got
