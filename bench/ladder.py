"""The precision ladder: rollout formats with k mantissa bits, whose mismatch grows as k falls.

A rung `eEmK` is a binary float with K stored mantissa bits and E exponent bits, rounded to
nearest, ties to even (bench.grids.round_float), with subnormals and overflow to ±inf:

    e5m10, e5m9, e5m8      fp16's 5-bit exponent (min_exp −14, max_exp 15): e5m10 *is* fp16
    e8m7, e8m6, …, e8m1    bf16's 8-bit exponent (−126, 127): e8m7 *is* bf16

A rung computes exactly as the rollout engine computes its *carrier* (fp16 for e5, bf16 for e8:
the same cast parameters, the same kernels, the same points where the carrier rounds), except
that every rounding to the carrier is a rounding to the rung's grid. "Every tensor the format
touches" is then rounded at K bits: parameters (weights, norms, embeddings), activations, linear
outputs, attention outputs, logits, the KV cache — no carrier-precision floor under a low rung,
which the sub-16-bit formats of bench/formats.py keep (their activations and norms stay bf16).
What the carrier computes in fp32 (an RMSNorm's variance, an upcast GEMM's accumulation,
attention's softmax) stays fp32, as it does in the carrier.

How (`RoundingMode`, a TorchDispatchMode around the engine's forward): every aten op that would
produce a carrier tensor is run instead on its carrier inputs upcast to fp32 (exact) and its
carrier-dtype arguments turned fp32, and each output the carrier op would have made is rounded
once onto the rung's grid and stored back in the carrier (exact: K ≤ the carrier's bits):

    y = round_K( op_fp32(upcast(x)) ).

For the carrier's own K (e8m7, e5m10) that is the carrier op itself wherever torch's CPU kernel
for the carrier computes in fp32 and rounds once — its elementwise ops, reductions and
conversions; bench's emulated GEMMs and attention (BENCH_CPU_16BIT=none) already do so. So on the
emulated path e8m7 gives bf16's samples and log-probabilities bit for bit, and e5m10 fp16's
(tests/bench/test_ladder.py, on tiny-math, a Llama and a Gemma 3). A rung always takes the
emulated kernels, whatever the CPU has: native 16-bit GEMMs accumulate in an order no fp32 GEMM
reproduces, and a rung below the carrier has no native kernel anyway.

Why no rungs e8m8 … e8m10: no 16-bit carrier has an 8-bit exponent and more than 7 mantissa
bits, and an fp32 carrier cannot mark which fp32 tensors are the format's and which the model
keeps in fp32 on purpose (so e8m7 could not equal bf16). Above bf16 the ladder takes fp16's
exponent; the tiny-math and SmolLM2 activations stay far inside its range (fp16 runs there).

Views and aliasing ops pass through untouched (a KV cache is written through views); an op that
writes into a carrier tensor (copy_, add_, index_put_) writes the rounded result into it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .grids import round_float

RUNG = re.compile(r"^e(5|8)m(\d+)$")
EXPONENTS = {5: (torch.float16, -14, 15), 8: (torch.bfloat16, -126, 127)}   # carrier, min_exp, max_exp
CARRIER_BITS = {torch.float16: 10, torch.bfloat16: 7}


@dataclass(frozen=True)
class Rung:
    """A float format with `mantissa` stored mantissa bits and `exponent` exponent bits (5 or 8)."""

    exponent: int
    mantissa: int

    def __post_init__(self):
        if self.exponent not in EXPONENTS or not 1 <= self.mantissa <= CARRIER_BITS[EXPONENTS[self.exponent][0]]:
            raise ValueError(f"no rung e{self.exponent}m{self.mantissa}: e5m1…e5m10 or e8m1…e8m7")

    @property
    def name(self) -> str:
        return f"e{self.exponent}m{self.mantissa}"

    @property
    def carrier(self) -> torch.dtype:
        return EXPONENTS[self.exponent][0]

    @property
    def unit_roundoff(self) -> float:
        """u = 2^−(K+1), the largest relative error of one rounding (fp16 2^−11, bf16 2^−8)."""
        return 2.0 ** -(self.mantissa + 1)

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """x rounded onto the rung's grid (round_float), as fp32 values."""
        _, lo, hi = EXPONENTS[self.exponent]
        return round_float(x, self.mantissa, lo, hi)


def parse(name: str) -> Rung | None:
    """`e8m3` → Rung(8, 3); None for a name that is not a rung's."""
    m = RUNG.match(name.strip().lower())
    return Rung(int(m.group(1)), int(m.group(2))) if m else None


_ATEN = torch.ops.aten
# ops that only move or select values: on inputs already on the grid their carrier result is exact,
# so they run as they are (an embedding lookup would otherwise upcast the whole table at every call)
EXACT = frozenset({_ATEN.embedding.default, _ATEN.index_select.default, _ATEN.gather.default, _ATEN.cat.default,
                   _ATEN.stack.default, _ATEN.clone.default, _ATEN.index.Tensor, _ATEN.repeat.default})
HALF_TO_FLOAT = frozenset({_ATEN._softmax.default, _ATEN._log_softmax.default})    # (x, dim, half_to_float)


@functools.cache
def _mutated(func) -> list[int]:
    """Positions of the arguments `func` writes into (copy_, add_, index_put_, out=)."""
    return [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


@functools.cache
def _aliases(func) -> bool:
    """Whether `func` returns a view of an input without writing it (view, transpose, slice,
    detach): such ops pass through. An op that writes into its input (add_, copy_) returns it
    too, but is rounded (`_mutated`)."""
    return func.is_view or any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


class RoundingMode(TorchDispatchMode):
    """While active, every op that would make a tensor of the rung's carrier dtype computes in
    fp32 and rounds once onto the rung's grid (the module docstring)."""

    def __init__(self, rung: Rung):
        super().__init__()
        self.rung = rung
        self.carrier = rung.carrier

    def _carrier_out(self, func, args, kwargs) -> bool:
        """Whether the op's floating outputs are the carrier's: it writes into a carrier tensor,
        or has a carrier input or a `dtype=` carrier argument and nothing that promotes past it
        (torch's rule: a floating tensor of another dtype with dimensions, or any such tensor
        where every carrier tensor is 0-dim); `_softmax(x, dim, half_to_float=True)` makes fp32."""
        written = _mutated(func)
        if written:
            i = written[0]
            target = args[i] if i < len(args) else kwargs.get(func._schema.arguments[i].name)
            return isinstance(target, torch.Tensor) and target.dtype == self.carrier
        if func in HALF_TO_FLOAT and len(args) > 2 and args[2]:
            return False
        if "dtype" in kwargs and kwargs["dtype"] is not None:
            return kwargs["dtype"] == self.carrier
        tensors = [t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        ours = [t for t in tensors if t.dtype == self.carrier]
        if not ours:
            return False
        dims = any(t.dim() > 0 for t in ours)
        return not any(t.is_floating_point() and t.dtype != self.carrier and (t.dim() > 0 or not dims)
                       for t in tensors)

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _aliases(func) or func in EXACT or not self._carrier_out(func, args, kwargs):
            return func(*args, **kwargs)
        up = functools.partial(_upcast, self.carrier)
        args32, kwargs32 = _map(up, args), _map(up, kwargs)
        out = func(*args32, **kwargs32)
        written = _mutated(func)
        if written:
            for i in written:                       # the op's result is in args32[i]: round it into args[i]
                target = args[i] if i < len(args) else kwargs[func._schema.arguments[i].name]
                source = args32[i] if i < len(args) else kwargs32[func._schema.arguments[i].name]
                target.copy_(self._down(source) if target.dtype == self.carrier else source)
            first = func._schema.arguments[written[0]]
            return args[written[0]] if written[0] < len(args) else kwargs[first.name]
        return _map(lambda t: self._down(t) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t, out)

    def _down(self, t: torch.Tensor) -> torch.Tensor:
        """fp32 → the rung's grid, stored in the carrier (exact)."""
        return self.rung.round(t).to(self.carrier)


def _map(fn, x):
    """fn over the leaves of an op's arguments or outputs (tuples, lists, dicts of leaves)."""
    if isinstance(x, (tuple, list)):
        return type(x)(_map(fn, y) for y in x)
    if isinstance(x, dict):
        return {k: _map(fn, y) for k, y in x.items()}
    return fn(x)


def _leaves(x):
    if isinstance(x, (tuple, list)):
        for y in x:
            yield from _leaves(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _leaves(y)
    else:
        yield x


def _upcast(carrier: torch.dtype, x):
    if isinstance(x, torch.Tensor) and x.dtype == carrier:
        return x.float()
    if isinstance(x, torch.dtype) and x == carrier:
        return torch.float32
    return x


@torch.no_grad()
def round_parameters(model: torch.nn.Module, rung: Rung) -> None:
    """Every carrier parameter and buffer of `model` onto the rung's grid, in place."""
    for t in (*model.parameters(), *model.buffers()):
        if t.dtype == rung.carrier:
            t.copy_(rung.round(t.float()).to(rung.carrier))


class _Scope:
    """One model's rounding: a forward hook pair on every module enters `RoundingMode` at the
    outermost module call — whichever module a caller starts from (the whole model, its decoder
    alone, the output head: runners/logprobs.py calls the last two) — and leaves it when that call
    returns or raises."""

    def __init__(self, rung: Rung):
        self.rung, self.depth, self.mode = rung, 0, None

    def enter(self, module, args):
        if self.depth == 0:
            self.mode = RoundingMode(self.rung)
            self.mode.__enter__()
        self.depth += 1

    def leave(self, module, args, output):
        self.depth -= 1
        if self.depth == 0:
            mode, self.mode = self.mode, None
            mode.__exit__(None, None, None)


def attach(model: torch.nn.Module, rung: Rung) -> torch.nn.Module:
    """`model` (already in the rung's carrier) computes at the rung: its parameters rounded onto
    the grid and every forward, from any of its modules, run under `RoundingMode` (`_Scope`)."""
    round_parameters(model, rung)
    if getattr(model, "_bench_rung_scope", None) is not None:
        raise ValueError("this model already computes at a rung")
    scope = model._bench_rung_scope = _Scope(rung)
    for mod in model.modules():
        mod.register_forward_pre_hook(scope.enter)
        mod.register_forward_hook(scope.leave, always_call=True)
    return model
