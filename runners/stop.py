"""Stop rules and the mismatch early warning. Pure bookkeeping over the evaluation history;
its state is a plain dict so checkpoints can carry it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

CONVERGED, PLATEAUED, COLLAPSED, DIVERGED, MAX_STEPS, FAILED = (
    "converged", "plateaued", "collapsed", "diverged", "max_steps", "failed")
STATUSES = ("running", CONVERGED, PLATEAUED, COLLAPSED, DIVERGED, MAX_STEPS, FAILED)


@dataclass
class StopConfig:
    """When a run ends (checked after every evaluation of the split)."""

    target: float = 0.95        # converged: split accuracy >= target ...
    hold: int = 2               # ... for this many consecutive evaluations
    patience: int = 10          # plateaued: the peak has not risen by min_delta in this many evaluations
    min_delta: float = 0.01
    collapse_drop: float = 0.3  # collapsed: accuracy fell this far below its peak
    kl_window: int = 20         # early warning: KL (k3) rising steadily over this many steps


@dataclass
class StopState:
    evals: list[tuple[int, float]] = field(default_factory=list)
    peak: float = -1.0
    peak_step: int = 0
    evals_since_peak: int = 0
    first_at_target: int | None = None
    kl: list[float] = field(default_factory=list)
    kl_warning_step: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StopState":
        s = cls(**d)
        s.evals = [tuple(e) for e in s.evals]
        return s


def after_eval(state: StopState, cfg: StopConfig, step: int, accuracy: float) -> tuple[str, str] | None:
    """Record one split evaluation; return (status, reason) when the run should stop."""
    state.evals.append((step, accuracy))
    if accuracy >= state.peak + cfg.min_delta or state.peak < 0:
        state.evals_since_peak = 0
    else:
        state.evals_since_peak += 1
    if accuracy > state.peak:
        state.peak, state.peak_step = accuracy, step
    if accuracy >= cfg.target and state.first_at_target is None:
        state.first_at_target = step
    recent = [a for _, a in state.evals[-cfg.hold:]]
    if len(recent) == cfg.hold and all(a >= cfg.target for a in recent):
        return CONVERGED, f"split accuracy >= {cfg.target} for {cfg.hold} evaluations (last {accuracy:.3f} at step {step})"
    if state.peak - accuracy >= cfg.collapse_drop:
        return COLLAPSED, f"split accuracy {accuracy:.3f} fell {state.peak - accuracy:.3f} below its peak {state.peak:.3f} (step {state.peak_step})"
    if state.evals_since_peak >= cfg.patience:
        return PLATEAUED, f"no gain of {cfg.min_delta} over {cfg.patience} evaluations (peak {state.peak:.3f} at step {state.peak_step})"
    return None


def non_finite(*values: float) -> bool:
    return any(not math.isfinite(v) for v in values)


def kl_rising(series: list[float], window: int) -> bool:
    """True when the last `window` values rise steadily: a positive least-squares slope with
    t-statistic > 3 and the second half's mean at least twice the first half's."""
    if len(series) < window or window < 4:
        return False
    y = series[-window:]
    n = len(y)
    xm, ym = (n - 1) / 2, sum(y) / n
    sxx = sum((i - xm) ** 2 for i in range(n))
    slope = sum((i - xm) * (v - ym) for i, v in enumerate(y)) / sxx
    resid = [v - ym - slope * (i - xm) for i, v in enumerate(y)]
    se = math.sqrt(sum(r * r for r in resid) / (n - 2) / sxx) if n > 2 else 0.0
    first, second = sum(y[: n // 2]) / (n // 2), sum(y[n // 2:]) / (n - n // 2)
    return slope > 0 and (se == 0 or slope / se > 3) and second >= 2 * max(first, 1e-12)


def after_step(state: StopState, cfg: StopConfig, step: int, kl: float) -> bool:
    """Record the step's KL; True the first time the early warning fires (its step is kept)."""
    state.kl.append(kl)
    state.kl = state.kl[-cfg.kl_window:]
    if state.kl_warning_step is None and kl_rising(state.kl, cfg.kl_window):
        state.kl_warning_step = step
        return True
    return False
