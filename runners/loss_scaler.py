"""Dynamic loss scaling for the training engine (runners/train_engine.py): fp16 training
multiplies the loss by a scale that backs off on non-finite gradients and grows after a run of
finite steps, as torch.amp.GradScaler and Megatron/FSDP's dynamic scalers do (init 2^16, growth
interval 400, backoff 0.5; `RunConfig.loss_scale_*`). For every dtype a non-finite step is
skipped and counted, so N in a row end a run `diverged`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LossScaler:
    """Dynamic loss scaling for fp16 training: multiply the loss by `scale` before backward;
    on non-finite gradients skip the step and multiply the scale by `backoff`; after
    `growth_interval` finite steps in a row double it. Disabled (scale 1, never changed) for
    fp32/bf16, where a non-finite step is still skipped and counted: `skipped` and
    `skipped_in_a_row` count for every dtype (the paper's GSPO-in-BF16 failure is a NaN grad
    norm, which must end the run as `diverged`, not pass silently)."""

    enabled: bool
    scale: float = 2.0 ** 16
    growth_interval: int = 400
    backoff: float = 0.5
    good_steps: int = 0
    skipped: int = 0
    skipped_in_a_row: int = 0

    def __post_init__(self):
        if not self.enabled:
            self.scale = 1.0

    def update(self, finite: bool) -> None:
        """Record one optimizer step: applied (`finite`) or skipped for non-finite gradients."""
        if finite:
            self.skipped_in_a_row = 0
            self.good_steps += 1
            if self.enabled and self.good_steps % self.growth_interval == 0:
                self.scale *= 2.0
        else:
            self.skipped += 1
            self.skipped_in_a_row += 1
            self.good_steps = 0
            if self.enabled:
                self.scale = max(self.scale * self.backoff, 1.0)

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("enabled", "scale", "growth_interval", "backoff", "good_steps",
                                               "skipped", "skipped_in_a_row")}
