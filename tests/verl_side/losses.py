"""verl's side of the loss cross-check (tests/test_verl_crosscheck.py), run by verl's interpreter:

    <verl python> tests/verl_side/losses.py inputs.pt outputs.pt

For each case in inputs.pt (a name and bench's verl overrides), compose verl's config with
those overrides and compute what verl's actor computes for one mini-batch: the advantage
estimator on the rewards, the decoupled rollout-correction weights (when not in bypass mode,
as `trainer_base` does), then the registered policy loss with the actor's aggregation and
loss_scale_factor, and its gradient with respect to log π_θ.
"""

import sys
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

import verl.trainer
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.utils.config import omega_conf_to_dataclass


def one_case(x: dict, overrides: list[str]) -> dict:
    with initialize_config_dir(str(Path(verl.trainer.__file__).parent / "config"), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides + ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"])
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
        if rc.get("rollout_is"):
            batch = DataProto.from_dict(tensors={"old_log_probs": old, "rollout_log_probs": x["logp_rollout"],
                                                 "response_mask": mask.float()})
            batch, _ = compute_rollout_correction_and_add_to_batch(batch, rc)
            weights = batch.batch["rollout_is_weights"]
            mask = batch.batch["response_mask"].bool()
    logp = x["logp"].clone().requires_grad_(True)
    loss, _ = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=old, log_prob=logp, advantages=advantages, response_mask=mask,
        loss_agg_mode=actor.loss_agg_mode, config=actor, rollout_is_weights=weights)
    loss.backward()
    return {"loss": loss.detach(), "grad": logp.grad, "adv": verl_adv}


def main(inp: str, outp: str) -> None:
    x = torch.load(inp)
    torch.save({name: one_case(x, overrides) for name, overrides in x["cases"]}, outp)


if __name__ == "__main__":
    main(*sys.argv[1:3])
