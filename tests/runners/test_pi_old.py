"""The trainer's choice of π_old (runners/trainer.pi_old), one test per case, on the real training
engine of tiny-math: which forward gives π_old, how many forwards it costs, and the values
against forwards computed here."""

from __future__ import annotations

import copy

import pytest
import torch

from bench.models import load_model, resolve_model
from runners.algos import get_loss
from runners.presets import get_preset
from runners.staleness import WeightQueue
from runners.train_engine import Batch, TrainingEngine
from runners.trainer import EXTRA_FORWARD, FILLED_BY_UPDATE, REUSE_UPDATE, STALE, pi_old


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model(resolve_model("tiny-math"))


def _batch() -> Batch:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 85, (5 + i,), generator=g).tolist() for i in range(6)]
    responses = [torch.randint(2, 85, (3 + 2 * i,), generator=g).tolist() for i in range(6)]
    return Batch.pack(prompts, responses, 0)


def _learner(tiny, budget: int | None = None, k: int = 0):
    cfg = get_preset("tiny")
    cfg.max_tokens_per_microbatch = budget
    learner = TrainingEngine(copy.deepcopy(tiny), "fp32", cfg, get_loss("grpo"), "grpo")
    learner.sync_compute()
    learner.passes = 0
    return learner, WeightQueue(k, learner)


def _fresh(learner, batch):
    """log π of the batch by a forward here, not counted in the learner's passes."""
    passes = learner.passes
    out = learner.logprobs(batch)
    learner.passes = passes
    return out


def test_on_policy_one_update_reuses_the_updates_forward(tiny):
    learner, stale = _learner(tiny)
    batch = _batch()
    old = pi_old(learner, stale, batch, updates_per_batch=1, microbatched=False)
    assert old.case == REUSE_UPDATE and learner.passes == 1 and not old.fill_old and old.logp_cur is None
    assert old.first.requires_grad and not old.logp_old.requires_grad
    assert torch.equal(old.logp_old, old.first.detach() * batch.mask)
    assert torch.allclose(old.logp_old, _fresh(learner, batch), atol=1e-6)
    assert (old.logp_old[batch.mask == 0] == 0).all() and (old.logp_old[batch.mask == 1] < 0).all()


def test_on_policy_one_update_in_micro_batches_is_filled_by_the_update(tiny):
    learner, stale = _learner(tiny, budget=40)
    batch = _batch()
    old = pi_old(learner, stale, batch, updates_per_batch=1, microbatched=True)
    assert old.case == FILLED_BY_UPDATE and learner.passes == 0 and old.fill_old
    assert old.first is None and old.logp_cur is None
    assert old.logp_old.shape == batch.mask.shape and not old.logp_old.any()


def test_several_updates_take_one_forward_before_the_first(tiny):
    learner, stale = _learner(tiny)
    batch = _batch()
    old = pi_old(learner, stale, batch, updates_per_batch=2, microbatched=False)
    assert old.case == EXTRA_FORWARD and learner.passes == 1
    assert old.first is None and not old.fill_old and old.logp_cur is None
    assert torch.equal(old.logp_old, _fresh(learner, batch))


def test_stale_rollouts_score_pi_old_at_the_sampling_weights(tiny):
    """K = 1 after one update: π_old is the forward at θ_{t−1} (recorded before the master
    moved), π_θ now the update's forward; the two differ, each equals its own forward here."""
    learner, stale = _learner(tiny, k=1)
    batch = _batch()
    before = _fresh(learner, batch)
    stale.record(learner.master)                       # θ_{t−1}
    with torch.no_grad():
        for p in learner.master.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    learner.sync_compute()
    now = _fresh(learner, batch)
    learner.passes = 0
    old = pi_old(learner, stale, batch, updates_per_batch=1, microbatched=False)
    assert old.case == STALE and stale.effective == 1 and not old.fill_old
    assert learner.passes == 2                         # the update's forward and the stale one
    assert torch.allclose(old.logp_old, before, atol=1e-6) and torch.allclose(old.logp_cur, now, atol=1e-6)
    assert not torch.allclose(old.logp_old, old.logp_cur, atol=1e-4)
    assert old.first is not None and torch.equal(old.logp_cur, old.first.detach() * batch.mask)
    learner.passes = 0
    again = pi_old(learner, stale, batch, updates_per_batch=2, microbatched=False)   # no update forward to reuse
    assert again.case == STALE and again.first is None and learner.passes == 2
    assert torch.allclose(again.logp_cur, now, atol=1e-6)
