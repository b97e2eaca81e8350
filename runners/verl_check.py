"""verl's own checks of bench's overrides, run by verl's interpreter (it imports only verl):

    <verl python> runners/verl_check.py < cells.json     # [[override, ...], ...]

For each cell: Hydra composes verl's `ppo_trainer` config with the overrides exactly as
`python -m verl.trainer.main_ppo` would, then runs what `main_ppo.main` runs before it
starts Ray — `auto_set_device` and `validate_config` — and builds the actor, rollout and
algorithm dataclasses (their `__post_init__` checks). Prints one JSON list: null where the
cell passed, else the error. One process checks every cell (verl's import takes seconds).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path


def check(overrides: list[str]) -> str | None:
    from hydra import compose, initialize_config_dir

    import verl.trainer
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.device import auto_set_device

    try:
        with initialize_config_dir(str(Path(verl.trainer.__file__).parent / "config"), version_base=None):
            cfg = compose("ppo_trainer", overrides=overrides)
        auto_set_device(cfg)
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        for section in (cfg.actor_rollout_ref.rollout, cfg.algorithm):
            omega_conf_to_dataclass(section)
    except Exception as e:          # noqa: BLE001 - every failure is reported, per cell
        return f"{type(e).__name__}: {e}"
    return None


def main() -> None:
    cells = json.load(sys.stdin)
    warnings.simplefilter("ignore")
    results = [check(c) for c in cells]
    sys.stdout.write("\n" + json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
