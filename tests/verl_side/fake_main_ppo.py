"""A stand-in for `python -m verl.trainer.main_ppo` in tests: verl's trainer needs GPUs and vLLM,
so this process takes the same Hydra overrides and does what bench relies on —
logs through verl's own `Tracking` (console + file backend at $VERL_FILE_LOGGER_PATH) the keys
main_ppo logs, validation at step 0 and every `trainer.test_freq` steps, checkpoints to
`trainer.default_local_dir` every `trainer.save_freq` steps, and on start continues from
`latest_checkpointed_iteration.txt` (resume_mode=auto). The training reward follows
0.5 + FAKE_VERL_SLOPE · step; FAKE_VERL_CRASH_AT=N exits with code 3 at step N; the mismatch
k3 is FAKE_VERL_K3 (default 1.2e-4; FAKE_VERL_BAD_SEED=S makes it 1.0 when `data.seed` is S),
logged as verl does: `rollout_corr/*` in decoupled mode, `actor/rollout_corr/*` in bypass mode
(the pg-seq-* cells).
"""

import os
import sys
import time
from pathlib import Path

from verl.utils.tracking import Tracking


def main(argv: list[str]) -> None:
    o = dict(a.lstrip("+").split("=", 1) for a in argv if "=" in a)
    steps, freq, save = (int(o[f"trainer.{k}"]) for k in ("total_training_steps", "test_freq", "save_freq"))
    ckpt = Path(o["trainer.default_local_dir"])
    marker = ckpt / "latest_checkpointed_iteration.txt"
    start = int(marker.read_text()) if marker.exists() else 0
    crash_at = int(os.environ.get("FAKE_VERL_CRASH_AT", "0"))
    slope = float(os.environ.get("FAKE_VERL_SLOPE", "0.02"))
    k3 = float(os.environ.get("FAKE_VERL_K3", "1.2e-4"))
    if "FAKE_VERL_BAD_SEED" in os.environ and o.get("data.seed") == os.environ["FAKE_VERL_BAD_SEED"]:
        k3 = 1.0
    corr = "actor/rollout_corr" if o.get("algorithm.rollout_correction.bypass_mode") == "True" else "rollout_corr"
    val = f"val-core/aime24/acc/mean@{o['actor_rollout_ref.rollout.val_kwargs.n']}"
    tracking = Tracking(o["trainer.project_name"], o["trainer.experiment_name"], default_backend=["console", "file"])
    if start == 0:
        tracking.log({val: 0.1}, step=0)
    for step in range(start + 1, steps + 1):
        if step == crash_at:
            sys.exit(3)
        acc = min(1.0, 0.5 + slope * step)
        data = {"critic/score/mean": acc, "actor/pg_loss": -0.01, "actor/grad_norm": 0.3, "actor/entropy": 0.5,
                f"{corr}/kl": 1e-4, f"{corr}/k3_kl": k3, "training/rollout_probs_diff_mean": 1e-3,
                "response_length/mean": 40.0, "timing_s/step": 0.05, "training/global_step": step}
        if step % freq == 0 or step == steps:
            data[val] = acc / 2
        tracking.log(data, step=step)
        if save > 0 and step % save == 0:
            ckpt.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(step))
        time.sleep(0.05)
    tracking.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
