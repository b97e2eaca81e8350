"""The rollout engine's fused projections, as vLLM runs them: q/k/v as one GEMM (`qkv_proj`)
and gate/up as one (`gate_up_proj`), over the members' weights concatenated along the output
dimension,

    [y_q | y_k | y_v] = x [W_q; W_k; W_v]ᵀ,   each member returning its own columns.

The activation is quantized (W8A8, NVFP4) or upcast (16-bit GEMMs emulated on a CPU) once for
the group instead of once per member, and a decode step runs 4 GEMMs a layer instead of 7:
fewer, wider operations where a small model's decode step is bound by their number.

An output column of a GEMM is the dot product of its weight row with the activation, summed in
the kernel's K order whatever the other columns are, so the members' outputs are the numbers
their own GEMMs give, bit for bit, where the BLAS runs one kernel for both widths: checked on
the CPUs measured over decode and prefill shapes of 16 columns a member and more
(tests/bench/test_fused_projections.py compares whole rollouts; an Intel AMX Xeon's MKL takes another
kernel for a member of fewer than 16 columns, which no real projection has). On a GPU cuBLAS chooses its kernel
by shape, so there the group rounds as vLLM's fused GEMM does. The members' weights become views of
the group's (a sync writes them in place), so nothing is copied per sync but the fp32 copy an
emulated 16-bit GEMM reads.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels

FUSED_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))   # vLLM's qkv_proj, gate_up_proj


def fused_groups(model: nn.Module) -> list[list[str]]:
    """The nn.Linear modules (full names) that vLLM runs as one fused projection: a module's
    q_proj/k_proj/v_proj children (qkv_proj) and gate_proj/up_proj children (gate_up_proj)."""
    groups = []
    for name, mod in model.named_modules():
        for members in FUSED_PROJECTIONS:
            if all(isinstance(getattr(mod, m, None), nn.Linear) for m in members):
                groups.append([f"{name}.{m}" if name else m for m in members])
    return groups


def _kind(mod: nn.Module) -> str | None:
    """How a member computes: "quant" (a QuantLinear: codes, scales and the GEMM operand
    `w_gemm`), "split_k" (a 16-bit nn.Linear as an emulated decode GEMM), "linear" (a plain
    nn.Linear), None (anything else: not fused)."""
    if all(hasattr(mod, a) for a in ("codes", "scale", "w_gemm", "fmt", "split_k")):
        return "quant"
    if isinstance(mod, nn.Linear):
        fwd = mod.__dict__.get("forward")
        if fwd is None:
            return "linear"
        if getattr(fwd, "__func__", None) is kernels._split_k_linear_forward:
            return "split_k"
    return None


def _concat_into_views(members: list[nn.Module], attr: str) -> torch.Tensor | None:
    """The members' tensors `attr` concatenated along dim 0; each member's becomes a view of
    it (a Parameter keeps its object, its data now the view). None if a member has none."""
    parts = [getattr(m, attr) for m in members]
    if any(p is None for p in parts):
        return None
    base = torch.cat([p.detach() for p in parts], 0)
    start = 0
    for m, p in zip(members, parts):
        view = base[start:start + p.shape[0]]
        if isinstance(p, nn.Parameter):
            p.data = view
        else:
            setattr(m, attr, view)           # a registered buffer stays one
        start += p.shape[0]
    return base


class FusedProjection:
    """One GEMM for `members` (all of one `_kind`, one input): the first member called with an
    input computes every member's output; the others take their columns of it."""

    def __init__(self, members: list[nn.Module], kind: str):
        self.members, self.kind = members, kind
        self.bounds = [0]
        for m in members:
            self.bounds.append(self.bounds[-1] + m.out_features)
        attrs = ("codes", "scale", "w_gemm", "bias") if kind == "quant" else ("weight", "bias")
        self.base = {a: _concat_into_views(members, a) for a in attrs}
        self._w32: tuple[tuple, torch.Tensor] | None = None
        self._x: torch.Tensor | None = None
        self._xv = -1
        self._y: torch.Tensor | None = None
        self._served = 0

    def _fp32_weight(self) -> torch.Tensor:
        """The 16-bit group weight as fp32, remade when a member's weight was written (a sync)."""
        key = tuple(m.weight._version for m in self.members)
        if self._w32 is None or self._w32[0] != key:
            self._w32 = (key, self.base["weight"].float())
        return self._w32[1]

    def _check_views(self) -> None:
        """Refuse to compute from a base a member no longer writes into (a deepcopy, a `.data`
        assignment, a dtype or device move of the module): the group would be stale."""
        for attr in ("codes", "w_gemm") if self.kind == "quant" else ("weight",):      # what the GEMMs read
            base = self.base[attr]
            for m, start in zip(self.members, self.bounds):
                if getattr(m, attr).data_ptr() != base.data_ptr() + start * base.stride(0) * base.element_size():
                    raise RuntimeError(f"a fused projection's member no longer shares the group's {attr} (copied "
                                       "or moved after fuse_projections); call unfuse_projections, then fuse again")

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_views()
        b = self.base
        if self.kind == "quant":
            m = self.members[0]
            return m.fmt.matmul(x, b["codes"], b["scale"], b["bias"], b["w_gemm"], m.split_k)
        if self.kind == "split_k":
            return kernels.split_k_linear(x, self._fp32_weight(), b["bias"], b["weight"].dtype)
        return F.linear(x, b["weight"], b["bias"])

    def output(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Member i's output for input x: its columns of the group's GEMM, computed once per
        input (the same tensor, unmodified); dropped once every member took its part."""
        if self._x is not x or self._xv != x._version:
            self._y, self._x, self._xv, self._served = self._forward(x), x, x._version, 0
        y = self._y[..., self.bounds[i]:self.bounds[i + 1]]
        self._served += 1
        if self._served == len(self.members):
            self._x = self._y = None
        return y


def _member_forward(self, x):
    return self._bench_fused_group.output(x, self._bench_fused_index)


def fuse_projections(model: nn.Module) -> int:
    """Give every q/k/v and gate/up group of `model` (as `fused_groups`, quantized layers
    included) whose members compute alike one `FusedProjection`. Run after the model is on its
    device and its other kernels are set (the kind of GEMM is read off each member). Returns
    how many groups it fused."""
    n, seen = 0, set()
    for parent, names in [(mod, names) for mod in model.modules() for names in FUSED_PROJECTIONS]:
        members = [getattr(parent, name, None) for name in names]
        kinds = {_kind(m) if isinstance(m, nn.Module) else None for m in members}
        if len(kinds) != 1 or None in kinds or any("_bench_fused_group" in m.__dict__ for m in members):
            continue
        weights = [m.weight if hasattr(m, "weight") else m.w_gemm for m in members]
        if (len({w.dtype for w in weights}) != 1 or len({m.bias is None for m in members}) != 1
                or len({id(w) for w in weights} | seen) != len(seen) + len(members)):
            continue                # mixed dtypes or biases, or a weight shared with another member: alone
        seen |= {id(w) for w in weights}
        group = FusedProjection(members, kinds.pop())
        for i, m in enumerate(members):
            m._bench_fused_group, m._bench_fused_index = group, i
            m._bench_own_forward = m.__dict__.get("forward")          # a split-K GEMM's, or none
            m.forward = types.MethodType(_member_forward, m)
        n += 1
    return n


def unfuse_projections(model: nn.Module) -> int:
    """Undo `fuse_projections` (a model taken over from another engine): each member computes
    alone again, as it did before (its own forward back), its tensors still views of the old
    group's. Returns how many members changed."""
    n = 0
    for mod in model.modules():
        if mod.__dict__.pop("_bench_fused_group", None) is not None:
            own = mod.__dict__.pop("_bench_own_forward")
            del mod._bench_fused_index, mod.forward
            if own is not None:
                mod.forward = own
            n += 1
    return n
