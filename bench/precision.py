"""Precision pairs: the rollout engine's dtype × the training engine's dtype.

`fp16` means both; `rollout=fp32,train=bf16` is a mixed pair. Nine pairs in all.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

DTYPES = ("fp32", "fp16", "bf16")
_ALIASES = {"fp32": "fp32", "float32": "fp32", "float": "fp32",
            "fp16": "fp16", "float16": "fp16", "half": "fp16",
            "bf16": "bf16", "bfloat16": "bf16"}


class PrecisionError(ValueError):
    pass


def canon(d: str) -> str:
    try:
        return _ALIASES[d.strip().lower()]
    except KeyError:
        raise PrecisionError(f"unknown dtype {d!r}; choose one of {', '.join(DTYPES)}") from None


def torch_dtype(d: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[canon(d)]


def vllm_dtype(d: str) -> str:
    return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[canon(d)]


@dataclass(frozen=True)
class Precision:
    rollout: str
    train: str

    @classmethod
    def parse(cls, text: str) -> "Precision":
        """`fp16` → (fp16, fp16); `rollout=fp32,train=bf16` → that pair (either order)."""
        text = text.strip()
        if "=" not in text:
            d = canon(text)
            return cls(d, d)
        parts = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
        if set(parts) != {"rollout", "train"} or text.count("=") != 2:
            raise PrecisionError(f"bad precision {text!r}; write e.g. fp16 or rollout=fp32,train=bf16")
        return cls(canon(parts["rollout"]), canon(parts["train"]))

    @property
    def name(self) -> str:
        return self.rollout if self.rollout == self.train else f"rollout={self.rollout},train={self.train}"

    def __str__(self) -> str:
        return self.name


ALL_PAIRS = tuple(Precision(r, t) for r, t in product(DTYPES, DTYPES))


def parse_list(text: str) -> list[Precision]:
    """`bf16,fp16` → both same-dtype pairs; `all` → the nine pairs; `;` separates mixed pairs."""
    if text.strip() == "all":
        return list(ALL_PAIRS)
    if "=" in text:
        return [Precision.parse(t) for t in text.split(";") if t.strip()]
    return [Precision.parse(t) for t in text.split(",") if t.strip()]


@dataclass
class LossScaler:
    """Dynamic loss scaling for fp16 training: multiply the loss by `scale` before backward;
    on non-finite gradients skip the step and multiply the scale by `backoff`; after
    `growth_interval` finite steps in a row double it. Disabled (scale 1) for fp32/bf16."""

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
        if not self.enabled:
            return
        if finite:
            self.skipped_in_a_row = 0
            self.good_steps += 1
            if self.good_steps % self.growth_interval == 0:
                self.scale *= 2.0
        else:
            self.skipped += 1
            self.skipped_in_a_row += 1
            self.good_steps = 0
            self.scale = max(self.scale * self.backoff, 1.0)

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("enabled", "scale", "growth_interval", "backoff", "good_steps",
                                               "skipped", "skipped_in_a_row")}


def device_supports(dtype: str, device: str = "cpu") -> bool:
    """Whether `device` can run matmuls in `dtype` (fp16 on old CPUs / GPUs may be missing)."""
    import torch

    try:
        a = torch.ones(2, 2, dtype=torch_dtype(dtype), device=device)
        return bool(torch.isfinite((a @ a).float()).all())
    except (RuntimeError, TypeError):
        return False
