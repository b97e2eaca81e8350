"""The step-0 measurement `bench check` and `bench mismatch` share: for each rollout format of the
pairs, one rollout engine made from a copy of the fp32 master samples the responses; the same
sampled tokens are then scored by a compute copy of the master in each training format of the
pairs with that rollout. With d_t = log π_t − log μ_t on the sampled tokens, what each command
derives from (μ, π) is its own (runners/check.py, runners/offline_mismatch.py); the run's
calibration gate scores its own step-0 batch with the training engine (runners/trainer.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

from bench.engines import make_engine
from bench.model_formats import prepare_compute_model
from bench.precision import Precision


def rollout_passes(engine: str, model_path: str, base, pairs: list[Precision], torch_kw: dict | None = None,
                   vllm_kw: dict | None = None, engine_for=None, engine_hook=None
                   ) -> Iterator[tuple[object, list[Precision]]]:
    """(rollout engine, its pairs) for each rollout format of `pairs` in order: the built-in engine
    on a copy of the fp32 `base` (with `torch_kw`), or `engine` loading `model_path` (with
    `vllm_kw`); `engine_for(rollout)`, where given, an engine already running the master's
    weights in that format instead. `engine_hook(engine, rollout)` is called on each (the tests
    inject faults there). Each engine is closed once its pairs are done."""
    for rollout in dict.fromkeys(p.rollout for p in pairs):
        kw = {"model": copy.deepcopy(base), **(torch_kw or {})} if engine == "torch" else dict(vllm_kw or {})
        eng = engine_for(rollout) if engine_for is not None else make_engine(engine, model_path, rollout, **kw)
        if engine_hook is not None:
            engine_hook(eng, rollout)
        try:
            yield eng, [p for p in pairs if p.rollout == rollout]
        finally:
            eng.close()


def compute_copy(base, pair: Precision, device: str):
    """The training engine's model for `pair`: a copy of the fp32 master in its training format."""
    return prepare_compute_model(copy.deepcopy(base), pair.train, device).eval()

