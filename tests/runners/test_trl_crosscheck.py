"""bench's losses against TRL's own code, live: `GRPOTrainer._compute_loss` (trl 1.16, installed
with the test extra) called on bench's tensors, with the trainer object replaced by the few
attributes that method reads (the loss type, the clip range, the OPSM threshold) and the model's
forward by the tensors themselves. No model, no accelerator state: the arithmetic is TRL's.

TRL divides the batch's per-token loss sum by its response tokens N (`num_items_in_batch`, for
cispo and dapo); bench divides by B·L (docs/algorithms.md), so TRL's loss and gradient are bench's
times B·L/N. The tests compare exactly that.
"""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from bench.algorithms import AlgoConfig
from runners.algos import LossInputs, get_loss

trl = pytest.importorskip("trl", reason="trl comes with the test extra (pip install -e '.[test]')")

pytestmark = pytest.mark.integration

P, G, T, L = 4, 4, 12, 16
B = P * G


class _Accelerator:
    num_processes = 1

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x

    gather_for_metrics = gather


def trl_loss(x: dict, loss_type: str, *, off_policy_mask_threshold=None, epsilon_low=0.2, epsilon_high=0.28):
    """(loss, d loss / d logp) as TRL's GRPOTrainer._compute_loss computes them."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    logp = x["logp"].clone().requires_grad_(True)
    mask = x["mask"]
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask, get_high_entropy_mask=None,
        top_entropy_quantile=1.0, aux_loss_enabled=False, _entropy_bonus_enabled=False,
        off_policy_mask_threshold=off_policy_mask_threshold, importance_sampling_level="token", beta=0.0,
        loss_type=loss_type, epsilon_low=epsilon_low, epsilon_high=epsilon_high, use_vllm=False,
        vllm_importance_sampling_correction=False, current_gradient_accumulation_steps=1,
        args=SimpleNamespace(delta=None, steps_per_generation=1, use_bias_correction_kl=False),
        model=SimpleNamespace(training=True), accelerator=_Accelerator(),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    inputs = {"prompt_ids": torch.ones(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.ones(B, T, dtype=torch.long), "completion_mask": mask,
              "advantages": x["adv"], "old_per_token_logps": x["logp_old"],
              "sampling_per_token_logps": x["logp_mu"], "num_items_in_batch": mask.sum()}
    loss = GRPOTrainer._compute_loss(stub, None, inputs)
    loss.backward()
    return loss.detach(), logp.grad


def bench_loss(x: dict, algo: str, cfg: AlgoConfig):
    logp = x["logp"].clone().requires_grad_(True)
    loss, metrics = get_loss(algo)(LossInputs(logp, x["logp_old"], x["logp_mu"], x["mask"], x["adv"]), cfg)
    loss.backward()
    return loss.detach(), logp.grad, metrics


@pytest.fixture(scope="module")
def x():
    from tests.runners.test_corrections_frameworks import make_inputs

    return make_inputs(seed=1)


def close(a, b):
    return torch.allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("algo, loss_type, kw, cfg", [
    ("cispo", "cispo", {"epsilon_high": 5.0}, AlgoConfig(max_len=L)),
    ("opsm", "dapo", {"off_policy_mask_threshold": 0.5}, AlgoConfig(max_len=L)),
    ("grpo", "dapo", {}, AlgoConfig(max_len=L)),
])
def test_loss_and_gradient_equal_trls(x, algo, loss_type, kw, cfg):
    if algo == "cispo":                                   # r = e^1.8 > 5 on every third token: the cap bites
        x = {**x, "logp_old": x["logp"] - 1.8 * (torch.arange(T) % 3 == 0).double()}
    theirs, g_theirs = trl_loss(x, loss_type, **kw)
    ours, g_ours, m = bench_loss(x, algo, cfg)
    scale = B * L / x["mask"].sum()
    assert close(theirs, ours * scale), (theirs, ours * scale)
    assert close(g_theirs, g_ours * scale)
    if algo == "opsm":
        assert 0 < m["masked_frac"] < 0.5                # OPSM dropped some negative sequences, not all
    if algo == "cispo":
        assert 0 < m["clip_frac"] < 1
