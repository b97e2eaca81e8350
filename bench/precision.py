"""Precision pairs: the rollout engine's format × the training engine's format.

rollout ∈ {fp32, bf16, bf16+head32, fp16, fp8, int8, nvfp4} × train ∈ {fp32, bf16, bf16+head32,
fp16, fp8}: 35 pairs; the formats themselves are the registry in bench/formats.py. `fp16` means
both sides; `rollout=int8,train=fp32` is a mixed pair; int8 and nvfp4 are rollout-only, so
`int8` alone is refused with what to write instead.

A pair has one display name (`pair_name`, `Precision.name`): the format alone when both sides
share it (`fp16`), else `rollout→train` (`fp8→fp16`), in the CLI's output, reports, the
leaderboard and stored JSON alike. `--dtype` takes it back as well as the spelled-out
`rollout=fp8,train=fp16` (`Precision.spec`, what bench passes on a command line).
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from itertools import product

from . import formats
from .errors import PrecisionError
from .formats import ROLLOUT_FORMATS, TRAIN_FORMATS

CLASSIC = ("fp32", "fp16", "bf16")       # the paper's 16/32-bit formats


ARROW = "→"       # between the rollout and the training format in a pair's display name


def pair_name(rollout: str, train: str) -> str:
    """The display name of the pair (rollout, train): `fp16` for (fp16, fp16), `fp8→fp16` for
    (fp8, fp16)."""
    return rollout if rollout == train else f"{rollout}{ARROW}{train}"


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


@dataclass(frozen=True)
class Precision:
    rollout: str
    train: str

    @classmethod
    def parse(cls, text: str) -> "Precision":
        """`fp16` → (fp16, fp16); `rollout=fp32,train=bf16` (either order) or the display name
        `fp32→bf16` → that pair."""
        text = text.strip()
        if "=" not in text and ARROW in text:
            rollout, _, train = text.partition(ARROW)
            return cls(canon(rollout.strip()), canon(train.strip(), "train"))
        if "=" not in text:
            return cls(canon(text), canon(text, "train"))
        parts = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
        if set(parts) != {"rollout", "train"} or text.count("=") != 2:
            raise PrecisionError(f"bad precision {text!r}; write e.g. fp16 or rollout=fp32,train=bf16")
        return cls(canon(parts["rollout"]), canon(parts["train"], "train"))

    @property
    def name(self) -> str:
        """The display name (`pair_name`): `fp16`, `fp8→fp16`."""
        return pair_name(self.rollout, self.train)

    @property
    def spec(self) -> str:
        """The pair as `--dtype` spells it out in ASCII: `fp16`, `rollout=fp8,train=fp16`."""
        return self.rollout if self.rollout == self.train else f"rollout={self.rollout},train={self.train}"

    def __str__(self) -> str:
        return self.name


ALL_PAIRS = tuple(Precision(r, t) for r, t in product(ROLLOUT_FORMATS, TRAIN_FORMATS))
CLASSIC_PAIRS = tuple(Precision(r, t) for r, t in product(CLASSIC, CLASSIC))
LADDER_PAIRS = tuple(Precision(r, "fp32") for r in formats.LADDER)    # ladder cells train in fp32


def parse_list(text: str) -> list[Precision]:
    """`bf16,fp16` (or `bf16;fp16`) → both same-format pairs; a mixed pair is its two halves
    `rollout=X,train=Y` side by side, in a list separated by `,` or `;` alike
    (`fp16;rollout=fp8,train=fp16`, `fp16,rollout=fp8,train=fp16`); `all` → every pair (35: 7
    rollout × 5 train formats); `all16` → the paper's nine pairs of fp32, fp16, bf16; `ladder` →
    every rung of the precision ladder against fp32 training, fp32 first (bench/ladder.py)."""
    named = {"all": ALL_PAIRS, "all16": CLASSIC_PAIRS, "ladder": LADDER_PAIRS}
    if text.strip() in named:
        return list(named[text.strip()])
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
