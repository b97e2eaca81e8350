"""Stop rules and the mismatch early warning. Pure bookkeeping over the evaluation history;
its state is a plain dict so checkpoints can carry it.

Split accuracy is a noisy estimate: avg@4 over the embedded default build's 177 problems
(n = 708 graded samples) has a standard error near 0.0096 at p = 0.93, so single readings
decide nothing. The rules therefore decide on bounds that account for the sample size behind
each reading:

- converged: the one-sided `confidence` Wilson lower bound on the successes pooled over the
  last `hold` evaluations is >= target. With hold=3 and confidence=0.9 (pooled n = 2,124 on
  that build) the pooled accuracy must reach ~0.956 (0.957 at n = 1,440, the n that
  tests/test_stop.py simulates), which a run truly at 0.93 (4.7 pooled standard errors below
  at n = 2,124) reaches in ~0.1% of runs of 30 evaluations at n = 1,440 (windows overlapping;
  fewer at a larger n), while a run truly at 0.97 converges at its third evaluation in > 99% of
  runs. hold=2 at the same confidence lets ~0.5% of runs at 0.93 through (too close to the 1%
  the sanity test allows); hold=4 costs one more evaluation and gains nothing needed.
  tests/test_stop.py simulates both cases.
- plateaued / collapsed: measured from a peak that moves only on a gain of at least
  `min_delta`, so upward noise of less than min_delta neither resets the patience nor raises
  the bar a later reading must not fall far below. The raw best reading is kept for display.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from bench.stats import wilson_lower
from bench.statuses import COLLAPSED, CONVERGED, PLATEAUED


@dataclass
class StopConfig:
    """When a run ends (checked after every evaluation of the split)."""

    target: float = 0.95        # converged: the lower bound on split accuracy is >= target, where
    hold: int = 3               # ... the bound pools the graded samples of the last `hold` evaluations
    confidence: float = 0.9     # ... and is the one-sided Wilson bound at this level (see the module doc)
    patience: int = 10          # plateaued: the peak has not moved (by >= min_delta) in this many evaluations
    min_delta: float = 0.01     # the peak moves only when a reading exceeds it by at least this
    collapse_drop: float = 0.3  # collapsed: accuracy fell this far below the peak
    kl_window: int = 20         # early warning: KL (k3) rising steadily over this many steps


@dataclass
class StopState:
    evals: list[tuple[int, float, int]] = field(default_factory=list)  # (step, accuracy, graded samples n)
    peak: float = -1.0                  # noise-robust peak: moves only on a gain >= min_delta
    peak_step: int = 0
    evals_since_peak: int = 0
    best: float = -1.0                  # the raw best reading (display only)
    best_step: int = 0
    bound: float | None = None          # the last pooled lower bound (None until `hold` evaluations)
    first_at_target: int | None = None  # the first single reading >= target (display only)
    kl: list[float] = field(default_factory=list)
    kl_warning_step: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StopState":
        """Unknown keys are ignored and missing ones take their defaults (older checkpoints);
        an evaluation stored without its n gets n = 0, which no convergence can rest on."""
        names = {f.name for f in fields(cls)}
        s = cls(**{k: v for k, v in d.items() if k in names})
        s.evals = [(int(e[0]), float(e[1]), int(e[2]) if len(e) > 2 else 0) for e in s.evals]
        if "best" not in d and s.evals:
            s.best_step, s.best = max(((st, a) for st, a, _ in s.evals), key=lambda e: e[1])
        return s


def after_eval(state: StopState, cfg: StopConfig, step: int, accuracy: float, n: int,
               pooled: tuple[float, int] | None = None) -> tuple[str, str] | None:
    """Record one split evaluation (`accuracy` over `n` graded samples, e.g. problems × m);
    return (status, reason) when the run should stop. The bound pools the last `hold`
    evaluations: by default as Σ aᵢnᵢ / Σ nᵢ over Σ nᵢ samples, right when each evaluation grades
    samples of its own (native: fresh draws every time). Where evaluations share graded samples
    (verl's windows of training rewards overlap when eval_every < their length) the caller gives
    `pooled` = (accuracy, n) over the distinct samples of those evaluations instead."""
    state.evals.append((step, accuracy, int(n)))
    if state.peak < 0 or accuracy >= state.peak + cfg.min_delta - 1e-12:
        state.peak, state.peak_step, state.evals_since_peak = accuracy, step, 0
    else:
        state.evals_since_peak += 1
    if accuracy > state.best:
        state.best, state.best_step = accuracy, step
    if accuracy >= cfg.target and state.first_at_target is None:
        state.first_at_target = step
    window = state.evals[-cfg.hold:]
    if len(window) == cfg.hold and all(k > 0 for _, _, k in window):
        total = sum(k for _, _, k in window)
        acc = sum(a * k for _, a, k in window) / total
        if pooled is not None:
            acc, total = pooled[0], int(pooled[1])
        state.bound = wilson_lower(acc * total, total, cfg.confidence)
        if state.bound >= cfg.target:
            return CONVERGED, (f"split accuracy {acc:.3f} over the last {cfg.hold} evaluations ({total} graded "
                               f"samples): its {cfg.confidence:.0%} lower bound {state.bound:.3f} >= {cfg.target} "
                               f"(step {step})")
    if state.peak - accuracy >= cfg.collapse_drop:
        return COLLAPSED, (f"split accuracy {accuracy:.3f} fell {state.peak - accuracy:.3f} below its peak "
                           f"{state.peak:.3f} (step {state.peak_step})")
    if state.evals_since_peak >= cfg.patience:
        return PLATEAUED, (f"no gain of {cfg.min_delta} over {cfg.patience} evaluations "
                           f"(peak {state.peak:.3f} at step {state.peak_step})")
    return None


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
