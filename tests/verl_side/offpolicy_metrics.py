"""verl's side of the mismatch-metric cross-check (tests/runners/test_verl_metrics.py), run by verl's
interpreter:

    <verl python> tests/verl_side/offpolicy_metrics.py inputs.pt outputs.pt

inputs.pt holds `mu` (rollout log-probs), `pi` (training-engine log-probs, π_old), `mask`
(float32, [B, T]), `advantages` [B] and `cases`: (name, bench's verl overrides) pairs. Writes,
as plain floats:

- `offpolicy` / `offpolicy_fp32`: `compute_offpolicy_metrics(pi, mu, mask)` in float64 / float32;
- `debug`: `calculate_debug_metrics` (`training/rollout_probs_diff_*`), float64;
- per case, `logged`: the metric keys and values verl logs for it. Decoupled mode: what the
  trainer's `compute_rollout_correction_and_add_to_batch` returns for the batch. Bypass mode:
  the bypass_mode policy loss's metrics under the `actor/` prefix the trainer adds
  (`rename_dict(..., "actor/")`), once on the whole batch as one micro-batch (`logged`), and once
  per micro-batch of one sequence, as bench's command runs it (micro_batch_size_per_gpu=1),
  averaged over micro-batches as verl's `Metric(aggregation=MEAN)` does (`micro`; a micro-batch
  on which verl raises is left out and its error recorded in `micro_errors`).
"""

import sys
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

import verl.trainer
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics, compute_rollout_correction_and_add_to_batch
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.utils.py_functional import rename_dict


def floats(d: dict) -> dict:
    return {k: float(v.item() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def bypass_metrics(actor, mu, pi, mask, adv) -> dict:
    _, m = core_algos.get_policy_loss_fn("bypass_mode")(
        old_log_prob=mu, log_prob=pi, advantages=adv, response_mask=mask.bool(),
        loss_agg_mode=actor.loss_agg_mode, config=actor, rollout_is_weights=None)
    return rename_dict(floats(m), "actor/")


def one_case(x: dict, overrides: list[str]) -> dict:
    with initialize_config_dir(str(Path(verl.trainer.__file__).parent / "config"), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides + ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"])
    mu, pi, mask = x["mu"], x["pi"], x["mask"]
    rc = cfg.algorithm.rollout_correction
    if not rc.get("bypass_mode", False):
        batch = DataProto.from_dict(tensors={"old_log_probs": pi, "rollout_log_probs": mu, "response_mask": mask})
        _, metrics = compute_rollout_correction_and_add_to_batch(batch, rc)
        return {"bypass": False, "logged": floats(metrics)}
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor.global_batch_info["loss_scale_factor"] = actor.loss_scale_factor
    adv = x["advantages"].unsqueeze(-1).expand_as(mu)
    whole = bypass_metrics(actor, mu, pi, mask, adv)
    per_seq, errors = [], {}
    for i in range(mu.shape[0]):
        if not mask[i].any():
            continue                                            # verl rejects a micro-batch without tokens
        try:
            per_seq.append(bypass_metrics(actor, mu[i:i + 1], pi[i:i + 1], mask[i:i + 1], adv[i:i + 1]))
        except Exception as e:                                  # noqa: BLE001 (recorded for the test)
            errors[i] = f"{type(e).__name__}: {e}"
    micro = {k: float(np.mean([m[k] for m in per_seq])) for k in per_seq[0]}
    return {"bypass": True, "logged": whole, "micro": micro, "micro_errors": errors}


def main(inp: str, outp: str) -> None:
    x = torch.load(inp)
    mu, pi, mask = x["mu"].double(), x["pi"].double(), x["mask"].double()
    B, T = mask.shape
    debug = calculate_debug_metrics(DataProto.from_dict(tensors={
        "rollout_log_probs": mu, "old_log_probs": pi, "response_mask": mask,
        "responses": torch.zeros(B, T, dtype=torch.long)}))
    x64 = {**x, "mu": mu, "pi": pi, "mask": mask, "advantages": x["advantages"].double()}
    out = {"offpolicy": floats(compute_offpolicy_metrics(old_log_prob=pi, rollout_log_prob=mu, response_mask=mask)),
           "offpolicy_fp32": floats(compute_offpolicy_metrics(old_log_prob=x["pi"], rollout_log_prob=x["mu"],
                                                              response_mask=x["mask"])),
           "debug": floats(debug),
           "cases": {name: one_case(x64, overrides) for name, overrides in x["cases"]}}
    torch.save(out, outp)


if __name__ == "__main__":
    main(*sys.argv[1:3])
