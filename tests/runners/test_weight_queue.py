"""runners/staleness.WeightQueue on the real training and rollout engines of tiny-math: its π_old
model is never trained, a snapshot that does not fit the model is refused, and an evaluation's
push of the current weights neither counts in the engine's sync statistics nor leaves its
tracking changed."""

from __future__ import annotations

import copy

import pytest
import torch

from bench.engines.torch_engine import TorchEngine
from bench.models import load_model, load_tokenizer, resolve_model
from runners.algos import get_loss
from runners.presets import get_preset
from runners.staleness import WeightQueue
from runners.train_engine import Batch, TrainingEngine


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model(resolve_model("tiny-math"))


def _queue(tiny, k=1):
    learner = TrainingEngine(copy.deepcopy(tiny), "fp32", get_preset("tiny"), get_loss("grpo"), "grpo")
    learner.sync_compute()
    return learner, WeightQueue(k, learner)


def test_the_pi_old_model_is_a_frozen_copy(tiny):
    learner, q = _queue(tiny)
    assert q.model is not learner.compute
    assert not any(p.requires_grad for p in q.model.parameters())
    assert all(p.requires_grad for p in learner.master.parameters())


def test_a_snapshot_that_does_not_fit_the_model_is_refused(tiny):
    learner, q = _queue(tiny)
    q.record(learner.master)
    snap = dict(q.snaps[0])
    snap.pop(list(snap)[-1])                                 # one parameter short, the last
    q.load_state([snap])
    g = torch.Generator().manual_seed(0)
    batch = Batch.pack([torch.randint(2, 85, (5,), generator=g).tolist()], [[3, 4, 5]], 0)
    with pytest.raises(ValueError, match="zip"):
        q.old_logprobs(batch)


def test_an_evaluations_push_is_not_a_sync_and_leaves_tracking_on(tiny):
    ref = resolve_model("tiny-math")
    engine = TorchEngine(ref.path, "fp32", model=copy.deepcopy(tiny), tokenizer=load_tokenizer(ref),
                         track_updates=True)
    learner, q = _queue(tiny)
    q.record(learner.master)                                 # θ_0 queued
    with torch.no_grad():
        for p in learner.master.parameters():
            p.add_(0.01)                                     # the master moves on: θ_1
    engine.update_weights(q.rollout_weights(learner.master))  # the stale sync: θ_0
    synced = dict(engine.sync_stats)
    assert synced, "a tracked sync records its statistics"
    seen = []
    with q.current_weights(engine, learner.master):
        seen.append(engine.track_updates)
        seen.append(_same(engine, dict(learner.master.named_parameters())))
    assert seen == [False, True]                             # inside: untracked, at θ_1
    assert engine.track_updates is True and engine.sync_stats == synced
    assert _same(engine, q.snaps[0])                         # θ_0 again after


def _same(engine, weights: dict) -> bool:
    """The engine's parameters that keep the master's names hold `weights` (the embedding and
    the norms, at least: the fused projections are renamed)."""
    lm = dict(engine.model.named_parameters())
    shared = [n for n in weights if n in lm]
    assert len(shared) >= 3, sorted(lm)
    return all(torch.equal(lm[n], weights[n].to(lm[n].dtype)) for n in shared)
