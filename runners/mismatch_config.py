"""The settings of `bench mismatch` (runners/offline_mismatch.py), each a knob (bench/knobs.py), in a
module of their own so that reading them (the CLI's options) needs no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.knobs import knob
from bench.model_sources import MODEL_HELP


@dataclass
class MismatchConfig:
    """One offline analysis, each setting a knob (bench/knobs.py). Sampling is fixed at T=1, top-p=1: anything else
    makes μ the log-probability of a reshaped distribution and the comparison meaningless."""

    model: str = knob("tiny-math", help=MODEL_HELP, cli=False)
    source: str | None = knob(None, help="Problems (any `bench build --source`; default: the model's, "
                              "bench/models.py measure_defaults).", cli=False)
    limit: int | None = knob(100, help="The first N problems.", unit="problems", ge=1)
    n: int = knob(32, help="Responses per problem.", unit="responses", ge=1)
    max_tokens: int | None = knob(None, help="Max response length (default 64 for tiny-math, 128 for smollm2-135m "
                                  "and gemma3-270m, 8192 otherwise).",
                                  unit="tokens", ge=1)
    engine: str = knob("torch", help="Rollout engine: torch or vllm.", cli=False)
    seed: int = knob(0, help="Seed of the sampled responses.", ge=0)
    batch: int = knob(256, help="Sequences per training-engine forward.", unit="sequences", ge=1)
    out: Path | None = knob(None, help="Plots; default $BENCH_HOME/mismatch/<model>.", cli=False)
    threads: int | None = knob(None, help="Torch threads.", unit="threads", ge=1)
    device: str = knob("cpu", help="Both engines (bench/device.py; the vllm engine picks its own).", cli=False)
    cascade_attention: bool = knob(False, help="The torch engine decodes with the shared-prefix attention "
                                   "(bench/engines/cascade.py); the report records it and pairs only with reports "
                                   "that did.")
    router_replay: bool = knob(False, help="MoE models (R3): score with the experts the rollout engine chose "
                               "(--engine torch); the router metrics still compare what the trainer would choose.")
