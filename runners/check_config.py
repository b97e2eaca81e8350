"""The settings of `bench check` (runners/check.py), each a knob (bench/knobs.py), in a module of
their own so that reading them (the CLI's options) needs no torch."""

from __future__ import annotations

from dataclasses import dataclass

from bench.knobs import knob
from bench.model_sources import MODEL_HELP


@dataclass
class CheckConfig:
    """One consistency check. Sampling is fixed at T = 1, top-p = 1 (μ must be the raw softmax);
    the batch is the step-0 batch of a run: problems × responses from the same weights."""

    model: str = knob("tiny-math", help=MODEL_HELP, cli=False)
    source: str | None = knob(None, help="Problems (any `bench build --source`; default: the model's, "
                              "bench/models.py measure_defaults).", cli=False)
    prompts: int = knob(32, help="Problems sampled.", unit="problems", ge=1)
    n: int = knob(4, help="Responses per problem.", unit="responses", ge=1)
    max_tokens: int | None = knob(None, help="Max response length (default 64 for tiny-math, a named or warmed real "
                                  "model's own (128), 1024 otherwise).",
                                  unit="tokens", ge=1)
    seed: int = knob(0, help="Seed of the problems and the sampled responses.", ge=0)
    engine: str = knob("torch", help="Rollout engine: torch or vllm.", cli=False)
    threads: int | None = knob(None, help="Torch threads.", unit="threads", ge=1)
    device: str = knob("cpu", help="Both engines (bench/device.py; the vllm engine picks its own).", cli=False)
    vllm_logprobs: int | None = knob(None, help="--engine vllm: the log-probs a position returns for the "
                                     "full-vocabulary KL (default: every token up to a 4,096-token vocabulary, else "
                                     "the top 20; fewer than the vocabulary make kl_full a lower bound).",
                                     unit="tokens", ge=1)
    margin: float = knob(4.0, help="--derive-contract: each bound is this many times the largest value of the "
                         "trusted repeats.", gt=1)
