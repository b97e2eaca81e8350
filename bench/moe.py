"""Mixture-of-experts layers under a format (bench/formats.py), for either engine.

transformers 5 keeps a Mixtral / Qwen2-MoE / Qwen3-MoE layer's experts as two 3-D parameters of
one module (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]) and its router as
a module with a 2-D `weight` [E, H] (`gate`), none of them an nn.Linear, so the dense layers'
machinery (bench/model_formats.py) does not see them. Here each expert's two projections and
the router are linear layers like the others:

- **16-bit casts**: the parameters are cast with the rest (`Format.cast`); the GEMMs read
  16-bit operands and accumulate in fp32 with one rounding where the CPU lacks the
  instructions (`upcast`, the training engine; `split_k`, the rollout engine's decode GEMM,
  bench/kernels.py), torch's own 16-bit kernels where it has them (`native`).
- **W8A8 / W4A4 formats** quantize each expert's projection as one linear layer (per output
  channel of that expert for fp8/int8; nvfp4's per-tensor global scale per expert and
  projection, gate and up sharing theirs as the one fused `gate_up_proj` tensor they are) and
  the router's weight like any linear layer: the rollout engine keeps codes and scales
  (`QuantExperts`, `QuantRouter`), the training engine quantizes in the forward with the
  straight-through backward of `W8A8STE`. (vLLM's Mixtral and Qwen-MoE keep the gate
  unquantized; bench quantizes every linear layer, so its sub-16-bit router flips are the
  upper end.)
- **Activation**: the training engine computes transformers' `act_fn(gate) · up` (two 16-bit
  roundings); the rollout engine vLLM's fused SiluAndMul (fp32, one rounding), as for dense MLPs.
- **Router**: logits = the router's linear layer in the format, then p = softmax(logits) in
  fp32, the top-k experts of p, their weights p_i / Σ_top-k p (Mixtral; Qwen's
  `norm_topk_prob`). `+router32` formats compute the logits in fp32 from the 16-bit hidden
  state (x upcast, fp32 weight; `Router32`), as prime-rl ships its router.

fp32 formats leave transformers' modules as they are (its own experts implementation).
"""

from __future__ import annotations

import types
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .formats import Format
from .gemms import W8A8STE, split_k_matmul
from .grids import float_step

EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


# ------------------------------------------------------------------ finding the layers

def is_router(mod: nn.Module) -> bool:
    """A transformers top-k router: a 2-D `weight` [E, H] and `top_k` (MixtralTopKRouter,
    Qwen2MoeTopKRouter, Qwen3MoeTopKRouter), or bench's replacement of one."""
    w = getattr(mod, "weight", None)
    return hasattr(mod, "top_k") and isinstance(w, torch.Tensor) and w.dim() == 2 and not isinstance(mod, nn.Linear)


def is_experts(mod: nn.Module) -> bool:
    """transformers' experts module (3-D `gate_up_proj` and `down_proj`), or bench's replacement."""
    if isinstance(mod, QuantExperts):
        return True
    return all(isinstance(getattr(mod, a, None), torch.Tensor) and getattr(mod, a).dim() == 3 for a in EXPERT_WEIGHTS)


def moe_blocks(model: nn.Module) -> list[nn.Module]:
    """The sparse MoE blocks of `model` in layer order: modules with a router `gate` and an
    `experts` child."""
    return [m for m in model.modules()
            if isinstance(getattr(m, "gate", None), nn.Module) and is_router(m.gate)
            and isinstance(getattr(m, "experts", None), nn.Module) and is_experts(m.experts)]


def is_moe(model: nn.Module) -> bool:
    return bool(moe_blocks(model))


def routers(model: nn.Module) -> list[nn.Module]:
    """Every router (`block.gate`) of `model`, in layer order."""
    return [b.gate for b in moe_blocks(model)]


def config_is_moe(path: str) -> bool:
    """Whether the model at `path` (a directory or hub id) is a mixture of experts, from its config
    alone: experts per layer (`num_local_experts`, Mixtral; `num_experts`, Qwen-MoE) above 1."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    cfg = getattr(cfg, "text_config", None) or cfg
    return max(getattr(cfg, "num_local_experts", 0) or 0, getattr(cfg, "num_experts", 0) or 0) > 1


def is_linear_weight(mod: nn.Module, attr: str) -> bool:
    """Whether parameter `attr` of `mod` is the weight of a linear layer of an MoE block (an
    expert projection or a router): the weights format statistics count with the linear ones."""
    return (attr in EXPERT_WEIGHTS and is_experts(mod)) or (attr == "weight" and is_router(mod))


def checkpoint_names(named_tensors):
    """(name, tensor) pairs of a model's parameters as a Mixtral checkpoint names them, which is
    what transformers 5 writes (it converts back on save) and what vLLM's weight loader reads:
    `…mlp.gate.weight` → `…block_sparse_moe.gate.weight`; `…mlp.experts.gate_up_proj` [E, 2I, H]
    → `…block_sparse_moe.experts.{e}.w1.weight` (gate, the first I rows) and `.w3.weight` (up);
    `…mlp.experts.down_proj` [E, H, I] → `.w2.weight`. Other names pass unchanged."""
    for name, t in named_tensors:
        head, sep, tail = name.rpartition(".mlp.")
        if not sep or tail not in ("gate.weight", "experts.gate_up_proj", "experts.down_proj") or t.dim() < 2:
            yield name, t
        elif tail == "gate.weight":
            yield f"{head}.block_sparse_moe.gate.weight", t
        elif tail == "experts.down_proj":
            for e in range(t.shape[0]):
                yield f"{head}.block_sparse_moe.experts.{e}.w2.weight", t[e]
        else:
            gate, up = t.chunk(2, dim=1)
            for e in range(t.shape[0]):
                yield f"{head}.block_sparse_moe.experts.{e}.w1.weight", gate[e]
                yield f"{head}.block_sparse_moe.experts.{e}.w3.weight", up[e]


# ------------------------------------------------------------------ one GEMM

def linear_16(x: torch.Tensor, w: torch.Tensor, mode: str) -> torch.Tensor:
    """y = x Wᵀ for a 16-bit (or fp32) weight `w` [out, in], as `mode` says: `native` torch's
    kernel in w's dtype; `upcast` fp32 from the 16-bit operands, one rounding to w's dtype
    (cuBLAS's contract); `split_k` the same with the reduction in SPLIT_K slices (a decode
    GEMM, bench/kernels.py). An fp32 weight computes in fp32 in every mode."""
    from .kernels import SPLIT_K

    if w.dtype == torch.float32 or mode == "native":
        return F.linear(x.to(w.dtype), w)
    if mode == "split_k":
        return split_k_matmul(x.float(), w.float(), SPLIT_K).to(w.dtype)
    return F.linear(x.float(), w.float()).to(w.dtype)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor, fused: bool) -> torch.Tensor:
    """silu(gate) · up: `fused` in fp32 with one rounding (vLLM's SiluAndMul), else as
    transformers computes it in the activation dtype (two roundings)."""
    if fused:
        return (F.silu(gate.float()) * up.float()).to(gate.dtype)
    return F.silu(gate) * up


def _experts_loop(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                  proj) -> torch.Tensor:
    """Σ over the top-k experts e of token x of w_e · down_e(act(gate_up_e(x))), as transformers'
    eager experts forward (per expert: its tokens, the two projections `proj(x, name, e)`,
    the routing weight applied in the weights' dtype promotion, `index_add_` in the hidden dtype)."""
    out = torch.zeros_like(hidden)
    n_exp = self.num_experts
    with torch.no_grad():
        hit = torch.bincount(top_k_index.flatten(), minlength=n_exp)[:n_exp].nonzero().flatten().tolist()
    for e in hit:
        token, slot = torch.where(top_k_index == e)
        x = hidden[token]
        gate, up = proj(x, "gate_up_proj", e).chunk(2, dim=-1)
        h = proj(_silu_mul(gate, up, self._bench_fused), "down_proj", e)
        h = h * top_k_weights[token, slot, None]
        out.index_add_(0, token, h.to(out.dtype))
    return out


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' experts module with bench's 16-bit GEMMs (`_bench_mode`) and activation."""
    def proj(x, name, e):
        return linear_16(x, getattr(self, name)[e], self._bench_mode)
    return _experts_loop(self, hidden_states, top_k_index, top_k_weights, proj)


def _experts_w8a8_forward(self, hidden_states, top_k_index, top_k_weights):
    """Training side of a W8A8 format: each expert's projection through `W8A8STE` (the rollout
    engine's quantizers in the forward, straight through in the backward) from fp32 weights."""
    def proj(x, name, e):
        return W8A8STE.apply(x, getattr(self, name)[e], None, self._bench_format)
    return _experts_loop(self, hidden_states, top_k_index, top_k_weights, proj)


def route(logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) of each token from its router logits [N, E]: p = softmax(logits) in
    fp32, the top-k experts of p (torch.topk: the larger index loses a tie), weights p_i over
    them divided by their sum when `renormalize` (Mixtral always; Qwen's norm_topk_prob), fp32."""
    p = torch.softmax(logits.float(), dim=-1)
    w, idx = torch.topk(p, top_k, dim=-1)
    return (w / w.sum(dim=-1, keepdim=True) if renormalize else w), idx


def _renormalizes(router: nn.Module) -> bool:
    return bool(getattr(router, "norm_topk_prob", True))


def _router_out(self, logits: torch.Tensor):
    w, idx = route(logits, self.top_k, _renormalizes(self))
    if hasattr(self, "norm_topk_prob"):          # Qwen's routers return weights in the logits' dtype
        w = w.to(logits.dtype)
    return logits, w, idx


def _router_forward(self, hidden_states):
    """A router in a 16-bit format: logits from `linear_16` in `_bench_mode`, then `route`."""
    x = hidden_states.reshape(-1, self.weight.shape[-1])
    return _router_out(self, linear_16(x, self.weight, self._bench_mode))


def _router_w8a8_forward(self, hidden_states):
    x = hidden_states.reshape(-1, self.weight.shape[-1])
    return _router_out(self, W8A8STE.apply(x, self.weight, None, self._bench_format).float())


def _router32_forward(self, hidden_states):
    """`+router32`: logits = x Wᵀ in fp32 (x the 16-bit hidden state upcast, W the fp32 weight)."""
    x = hidden_states.reshape(-1, self.weight.shape[-1])
    return _router_out(self, F.linear(x.float(), self.weight.float()))


# ------------------------------------------------------------------ rollout side

class QuantExperts(nn.Module):
    """Inference-only experts of a W8A8 / W4A4 format: per projection codes [E, out, in] and
    scales ([E, out, 1] per channel; nvfp4 [E, out, in/16] with the expert's own global scale)
    as buffers, each expert quantized as one linear layer (`Format.quantize` of its 2-D weight).
    `split_k`: the slices of the scaled GEMMs' reduction (bench/kernels.py)."""

    split_k = 1
    _bench_fused = False

    def __init__(self, experts: nn.Module, fmt: Format):
        super().__init__()
        self.fmt, self.num_experts = fmt, experts.gate_up_proj.shape[0]
        self.act_fn = getattr(experts, "act_fn", None)
        for name in EXPERT_WEIGHTS:
            codes, scale = self._quantize(getattr(experts, name).detach())
            self.register_buffer(f"{name}_codes", codes)
            self.register_buffer(f"{name}_scale", scale)
            self.register_buffer(f"{name}_gemm", fmt.quant.gemm_weight(codes, scale), persistent=False)

    def _quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each expert's [out, in] weight quantized on its own, stacked: ([E, out, in], [E, ...])."""
        parts = [self.fmt.quantize(w[e].float()) for e in range(w.shape[0])]
        return torch.stack([c for c, _ in parts]), torch.stack([s for _, s in parts])

    def forward(self, hidden_states, top_k_index, top_k_weights):
        def proj(x, name, e):
            return self.fmt.matmul(x, getattr(self, f"{name}_codes")[e], getattr(self, f"{name}_scale")[e], None,
                                   getattr(self, f"{name}_gemm")[e], self.split_k)
        return _experts_loop(self, hidden_states, top_k_index, top_k_weights, proj)

    @torch.no_grad()
    def load(self, name: str, w: torch.Tensor, track: bool = False):
        codes, scale = self._quantize(w)
        moved = ~self.fmt.quant.same(codes, getattr(self, f"{name}_codes")) if track else None
        setattr(self, f"{name}_codes", codes)
        setattr(self, f"{name}_scale", scale)
        setattr(self, f"{name}_gemm", self.fmt.quant.gemm_weight(codes, scale))
        if not track:
            return None
        step = torch.stack([self.fmt.step(codes[e], scale[e]) for e in range(codes.shape[0])])
        return moved, step

    def loader(self, attr: str):
        return partial(self.load, attr)


class QuantRouter(nn.Module):
    """Inference-only router of a W8A8 / W4A4 format: the gate's weight as codes and scales,
    logits from the format's scaled GEMM (fp32 before the softmax), then `route`."""

    split_k = 1

    def __init__(self, router: nn.Module, fmt: Format):
        super().__init__()
        self.fmt, self.top_k = fmt, router.top_k
        if hasattr(router, "norm_topk_prob"):
            self.norm_topk_prob = router.norm_topk_prob
        self.hidden_dim = router.weight.shape[-1]
        codes, scale = fmt.quantize(router.weight.detach().float())
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.register_buffer("w_gemm", fmt.quant.gemm_weight(codes, scale), persistent=False)

    @property
    def weight(self):          # what `is_router` looks for: the dequantized weight [E, H]
        return self.fmt.quant.dequantize(self.codes, self.scale)

    def forward(self, hidden_states):
        x = hidden_states.reshape(-1, self.hidden_dim)
        logits = self.fmt.matmul(x, self.codes, self.scale, None, self.w_gemm, self.split_k).float()
        w, idx = route(logits, self.top_k, _renormalizes(self))
        return logits, w, idx

    @torch.no_grad()
    def load_weight(self, w: torch.Tensor, track: bool = False):
        codes, scale = self.fmt.quantize(w.float())
        moved = ~self.fmt.quant.same(codes, self.codes) if track else None
        self.codes, self.scale = codes, scale
        self.w_gemm = self.fmt.quant.gemm_weight(codes, scale)
        return (moved, self.fmt.step(codes, scale)) if track else None

    def loader(self, attr: str):
        return self.load_weight


class Router32(nn.Module):
    """`+router32`: the router's weight kept in fp32 (a buffer the format's cast leaves alone),
    logits in fp32 from the upcast 16-bit hidden state, then `route`."""

    def __init__(self, router: nn.Module):
        super().__init__()
        self.top_k = router.top_k
        if hasattr(router, "norm_topk_prob"):
            self.norm_topk_prob = router.norm_topk_prob
        self.register_buffer("weight", router.weight.detach().float().clone())

    def forward(self, hidden_states):
        return _router32_forward(self, hidden_states)

    @torch.no_grad()
    def load_weight(self, w: torch.Tensor, track: bool = False):
        old = self.weight.clone() if track else None
        self.weight.copy_(w.float())
        return (self.weight != old, float_step(self.weight, 23, -126)) if track else None

    def loader(self, attr: str):
        return self.load_weight


def prepare_rollout_experts(model: nn.Module, fmt: Format) -> dict[int, nn.Module]:
    """The rollout engine's MoE layers in `fmt`, before the format's cast: W8A8 / W4A4 formats
    replace each experts module with `QuantExperts` and each router with `QuantRouter`;
    `+router32` replaces each router with `Router32`; other 16-bit formats give the experts and
    routers bench's forward with torch's own kernels (`native`; bench/kernels.py may
    switch them to the decode GEMM). fp32: nothing. Returns {id(old module): new module}."""
    replaced: dict[int, nn.Module] = {}
    if fmt.dtype == torch.float32:
        return replaced
    for block in moe_blocks(model):
        for attr in ("experts", "gate"):
            old = getattr(block, attr)
            if fmt.quant is not None:
                new = QuantExperts(old, fmt) if attr == "experts" else QuantRouter(old, fmt)
            elif fmt.router32 and attr == "gate":
                new = Router32(old)
            else:
                _patch(old, attr, fmt, "native", fused=False)
                continue
            setattr(block, attr, new)
            replaced[id(old)] = new
    return replaced


def _patch(mod: nn.Module, attr: str, fmt: Format, mode: str, fused: bool) -> None:
    mod._bench_mode, mod._bench_format, mod._bench_fused = mode, fmt, fused
    fwd = _experts_forward if attr == "experts" else _router_forward
    mod.forward = types.MethodType(fwd, mod)


def apply_expert_kernels(model: nn.Module, emulate: bool) -> int:
    """The rollout engine's kernels for its MoE layers (bench/kernels.py): the fused
    SiluAndMul in every expert; the scaled GEMMs of quantized experts and routers in SPLIT_K
    slices; with `emulate` (a CPU without the format's 16-bit instructions) the 16-bit expert
    and router GEMMs as split-K decode GEMMs. Returns how many MoE blocks it changed."""
    from .kernels import SPLIT_K

    n = 0
    for block in moe_blocks(model):
        for mod in (block.experts, block.gate):
            if isinstance(mod, (QuantExperts, QuantRouter)):
                mod.split_k = SPLIT_K
            elif emulate and hasattr(mod, "_bench_mode"):
                mod._bench_mode = "split_k"
        if isinstance(block.experts, QuantExperts) or hasattr(block.experts, "_bench_mode"):
            block.experts._bench_fused = True
            n += 1
    return n


# ------------------------------------------------------------------ training side

def prepare_train_experts(model: nn.Module, fmt: Format, device: str = "cpu") -> set[int]:
    """The training compute copy's MoE layers in `fmt`, before the format's cast; returns the
    ids of the parameters the cast must leave in fp32. W8A8 formats: expert and router weights
    stay fp32 and are quantized in the forward (straight-through backward); `+router32`: the
    router's weight stays fp32 and its logits are fp32; 16-bit formats: expert and router GEMMs
    `upcast` where the CPU lacks the instructions (bench.kernels.should_upcast), else
    `native`. The parameter list and its order do not change."""
    from .kernels import should_upcast

    keep: set[int] = set()
    if fmt.dtype == torch.float32:
        return keep
    mode = "upcast" if should_upcast(fmt.dtype_name, device) else "native"
    for block in moe_blocks(model):
        experts, gate = block.experts, block.gate
        if fmt.quant is not None:
            for mod, fwd in ((experts, _experts_w8a8_forward), (gate, _router_w8a8_forward)):
                mod._bench_format, mod._bench_fused = fmt, False
                mod.forward = types.MethodType(fwd, mod)
                keep.update(id(p) for p in mod.parameters(recurse=False))
            continue
        _patch(experts, "experts", fmt, mode, fused=False)
        if fmt.router32:
            gate.forward = types.MethodType(_router32_forward, gate)
            keep.add(id(gate.weight))
        else:
            _patch(gate, "gate", fmt, mode, fused=False)
    return keep
