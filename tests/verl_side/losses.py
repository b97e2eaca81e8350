"""verl's side of the loss cross-check (tests/runners/test_verl_crosscheck.py), run by verl's interpreter:

    <verl python> tests/verl_side/losses.py inputs.pt outputs.pt [inputs2.pt outputs2.pt ...]

One process for every pair (verl's import is ~10 s of it). For each case in an inputs file (a
name and bench's verl overrides), compose verl's config with those overrides and compute what
verl's actor computes for one mini-batch: the advantage estimator on the rewards, the decoupled
rollout-correction weights (when not in bypass mode, as `trainer_base` does), then the
registered policy loss with the actor's aggregation and loss_scale_factor, and its gradient with
respect to log π_θ.

Two ways to call the loss:
- `loss` / `grad`: the registered policy loss on the whole batch with only loss_scale_factor in
  `global_batch_info` (verl's fallbacks then count the batch itself: its non-empty sequences,
  its tokens);
- `trainer_loss` / `trainer_grad`: the path verl 0.9.1's trainer executes: `ppo_loss`
  (verl/workers/utils/losses.py) on each micro-batch of one sequence
  (ppo_micro_batch_size_per_gpu=1, as `bench run --trainer verl` sets it), with the global batch
  info the trainer and the FSDP engine attach — dp_size 1, batch_num_tokens = the mini-batch's
  tokens, global_batch_size = ppo_mini_batch_size · rollout.n (ray_trainer._update_actor), here
  the whole batch of B sequences — the micro-batch losses summed as their backward passes
  accumulate.
"""

import contextlib
import sys
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

import verl.trainer
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass


def one_case(x: dict, overrides: list[str]) -> dict:
    with initialize_config_dir(str(Path(verl.trainer.__file__).parent / "config"), version_base=None):
        prompts = max(x["groups"]) + 1                # one mini-batch of every prompt's rollout.n samples
        cfg = compose("ppo_trainer", overrides=overrides + [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
            f"actor_rollout_ref.rollout.n={len(x['groups']) // prompts}"])
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor.global_batch_info["loss_scale_factor"] = actor.loss_scale_factor   # as ppo_loss; one rank: local means
    mask = x["mask"].bool()
    B, T = mask.shape

    # advantages from the configured estimator (outcome reward on the last response token)
    last = mask.long().cumsum(-1).argmax(-1)
    scores = torch.zeros(B, T)
    scores[torch.arange(B), last] = x["rewards"]
    index = np.array(x["groups"])
    est = cfg.algorithm.adv_estimator
    if est == "grpo":
        adv, _ = core_algos.compute_grpo_outcome_advantage(scores, mask.float(), index,
                                                           norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo)
    else:
        adv, _ = core_algos.get_adv_estimator_fn(est)(token_level_rewards=scores, response_mask=mask.float(),
                                                      index=index, config=cfg.algorithm)
    verl_adv = adv[:, 0].clone()

    # the loss on bench's advantages (inputs identical on both sides)
    advantages = x["advantages"].unsqueeze(-1).expand(B, T)
    rc = cfg.algorithm.rollout_correction
    weights = None
    if rc.get("bypass_mode", False):
        old = x["logp_rollout"]
    else:
        old = x["logp_old"]
        if rc.get("rollout_is") or rc.get("rollout_rs"):      # IS weights, rejection (response_mask), or both
            batch = DataProto.from_dict(tensors={"old_log_probs": old, "rollout_log_probs": x["logp_rollout"],
                                                 "response_mask": mask.float()})
            batch, _ = compute_rollout_correction_and_add_to_batch(batch, rc)
            weights = batch.batch["rollout_is_weights"] if rc.get("rollout_is") else None
            mask = batch.batch["response_mask"].bool()
    logp = x["logp"].clone().requires_grad_(True)
    loss, _ = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=old, log_prob=logp, advantages=advantages, response_mask=mask,
        loss_agg_mode=actor.loss_agg_mode, config=actor, rollout_is_weights=weights)
    loss.backward()
    trainer_loss, trainer_grad, errors = trainer_path(cfg, x["logp"], old, advantages, mask, weights)
    return {"loss": loss.detach(), "grad": logp.grad, "adv": verl_adv,
            "trainer_loss": trainer_loss, "trainer_grad": trainer_grad, "trainer_errors": errors}


def trainer_path(cfg, logp, old, advantages, mask, weights):
    """verl's `ppo_loss` over micro-batches of one sequence with the trainer's global batch info
    (module docstring). Each micro-batch is laid out as the FSDP engine hands it over: a
    one-token prompt then the response, the model's log-probs flat (no padding), each position
    holding the next token's log-prob."""
    from tensordict import TensorDict

    from verl.workers.utils.losses import ppo_loss

    B, T = mask.shape
    errors = []
    mini = cfg.actor_rollout_ref.actor.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n
    assert mini == B, (mini, B)                        # one mini-batch: the whole batch
    leaf = logp.clone().requires_grad_(True)
    total = torch.zeros(())
    for i in range(B):
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)     # fresh global_batch_info
        n = int(mask[i].sum())
        assert mask[i, :n].all()                       # right padding: the response is the first n
        # position j holds log p(token j+1): the prompt's position holds the first response token's
        flat = torch.cat([leaf[i, :n], torch.zeros(1)])
        fields = {"prompts": torch.ones(1, 1, dtype=torch.long), "responses": torch.ones(1, T, dtype=torch.long),
                  "attention_mask": torch.cat([torch.ones(1, 1), mask[i:i + 1].float()], -1).long(),
                  "response_mask": mask[i:i + 1].float(), "old_log_probs": old[i:i + 1],
                  "advantages": advantages[i:i + 1]}
        if weights is not None:
            fields["rollout_is_weights"] = weights[i:i + 1]
        data = TensorDict(fields, batch_size=[1])
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=mini)
        try:
            loss, _ = ppo_loss(actor, {"log_probs": flat}, data)
        except ZeroDivisionError as e:      # verl's IS metrics of a micro-batch whose only weight is 0
            errors.append(f"sequence {i}: ZeroDivisionError ({e})")
            with _metrics_tolerant():
                loss, _ = ppo_loss(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor), {"log_probs": flat}, data)
        total = total + loss
    total.backward()
    return total.detach(), leaf.grad, errors


@contextlib.contextmanager
def _metrics_tolerant():
    """verl 0.9.1's `compute_is_metrics` divides by the mean squared normalised weight (the
    effective sample size), 0 when every weight of the micro-batch is 0 (IcePop zeroed a
    one-sequence micro-batch): ZeroDivisionError ends the step. The weights and the loss do not
    depend on the metrics, so the loss is computed past it, the error kept for the test."""
    from verl.trainer.ppo import rollout_corr_helper as h

    orig = h.compute_is_metrics

    def tolerant(*a, **k):
        try:
            return orig(*a, **k)
        except ZeroDivisionError:
            return {}

    h.compute_is_metrics = tolerant
    try:
        yield
    finally:
        h.compute_is_metrics = orig


def main(paths: list[str]) -> None:
    for inp, outp in zip(paths[::2], paths[1::2], strict=True):
        x = torch.load(inp)
        torch.save({name: one_case(x, overrides) for name, overrides in x["cases"]}, outp)


if __name__ == "__main__":
    main(sys.argv[1:])
