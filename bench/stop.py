"""Stop rules and the mismatch early warning. Pure bookkeeping over the evaluation history;
its state is a plain dict so checkpoints can carry it.

Split accuracy is a noisy estimate: avg@4 over the embedded default build's 177 problems
(n = 708 graded samples) has a standard error near 0.0096 at p = 0.93, so single readings
decide nothing. The rules therefore decide on bounds that account for the sample size behind
each reading:

- converged: the one-sided `confidence` Wilson lower bound on the successes pooled over the
  last `hold` evaluations is >= target. With hold=3 and confidence=0.9 (pooled n = 2,124 on
  that build) the pooled accuracy must reach ~0.956 (0.957 at n = 1,440, the n that
  tests/bench/test_stop.py simulates), which a run truly at 0.93 (4.7 pooled standard errors below
  at n = 2,124) reaches in ~0.1% of runs of 30 evaluations at n = 1,440 (windows overlapping;
  fewer at a larger n), while a run truly at 0.97 converges at its third evaluation in > 99% of
  runs. hold=2 at the same confidence lets ~0.5% of runs at 0.93 through (too close to the 1%
  the sanity test allows); hold=4 costs one more evaluation and gains nothing needed.
  tests/bench/test_stop.py simulates both cases.
- plateaued / collapsed: measured from a peak that moves only on a gain of at least
  `min_delta`, so upward noise of less than min_delta neither resets the patience nor raises
  the bar a later reading must not fall far below. The raw best reading is kept for display.
- futile (`futility`, on by default): the run cannot plausibly reach the target by `max_steps`.
  Over the last `futility_window` evaluations (steps xᵢ, accuracies yᵢ over nᵢ graded samples)
  fit the n-weighted least-squares line ȳ + b·(x − x̄) and project it, optimistically, to
  T = max_steps: P = ȳ + max(b, 0)·(T − x̄) — a falling trend is projected flat, a rising one
  linearly, although accuracy curves bend down as they near their ceiling. Its standard error
  se(P)² = φ·p̄(1−p̄)·(1/Σnᵢ + (T − x̄)²/Σnᵢ(xᵢ − x̄)²) is the binomial one at the readings'
  sample sizes (p̄ = ȳ), times φ = max(1, the residuals' overdispersion Σnᵢrᵢ²/((W−2)·p̄(1−p̄))),
  so a run whose readings wobble more than sampling explains gets a wider bound. The run is
  futile when P + z·se(P) < target, z = Φ⁻¹(futility_confidence): even the optimistic upper end
  of the projection stays below the bar. Measured by `runners/stop_sim.py` (simulated runs at
  the embedded default's n = 177 × 4 = 708 graded samples per evaluation, an evaluation every 5
  steps, max_steps 150, binomial noise; 2,000 runs per shape, seed 0; tests/bench/test_stop.py re-runs
  it with 400 per shape and checks the bounds below). With window 10 and confidence 0.95:
    shape (true accuracy)                       futile  converged  median step: futile  plateaued
    rising to 0.97 (0.95 at step ~60, fp16)      0.0%    100%                     -       125
    slow rise to 0.965 (0.95 at step ~120)       0.0%    84.6%                    -       145
    plateau at 0.89 from step ~60 (NVFP4-like)   100%    0%                      95       120
    plateau at 0.93                              99.2%   0%                     125       120
    plateau at 0.945                             5.2%    10.2%                  150       120
    collapse: 0.90 at step 50, 0.45 at step 100  100%    0%                      80        95
  False FAIL (futile before converging, on the two shapes whose true accuracy reaches the
  target): 0 of 4,000 (the test's bound: <= 1%). False continue (a plateau at 0.93 or below, or
  the collapse, not called futile by max_steps): 0.85% at worst (0.93; bound: <= 5%). A plateau
  at 0.945, just under the target, is called futile at the last evaluation or not at all, as a
  rule erring toward continuing should. On the NVFP4-like plateau futility decides at step 95
  where plateaued decides at 120 (79% of its steps): the projection's slope uncertainty times
  the remaining steps is what holds it back (at step 90: ±0.03), so a shorter max_steps decides
  sooner. Window 6 decides later (105: its slope is noisier) and misses 11% of the 0.93
  plateaus; confidence 0.99 costs 5 steps and misses 13% of them.

Every rule is also evaluated while it is off (shadow decisions): `StopState.shadow` keeps, per
rule, the first step at which it would have decided and what it would have said, so the store
measures each rule on runs it did not stop (`first_decisions` recomputes them from a stored
evaluation history).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from statistics import NormalDist

from bench.knobs import knob
from bench.stats import wilson_lower
from bench.statuses import COLLAPSED, CONVERGED, FUTILE, PLATEAUED

# the rules decided on the split evaluations, in the order after_eval applies them
EARLY_RULES = (CONVERGED, COLLAPSED, FUTILE, PLATEAUED)


@dataclass
class StopConfig:
    """When a run ends (checked after every evaluation of the split). The first seven are not
    command-line options (their defaults are the module doc's); the rules' switches and the
    futility rule's settings are (`bench run` / `bench sweep`)."""

    target: float = knob(0.95, help="converged: the lower bound on split accuracy is >= target.", gt=0, le=1,
                         cli=False)
    hold: int = knob(3, help="The bound pools the graded samples of the last `hold` evaluations.", ge=1, cli=False)
    confidence: float = knob(0.9, help="The bound is the one-sided Wilson bound at this level.", gt=0, lt=1,
                             cli=False)
    patience: int = knob(10, help="plateaued: the peak has not moved (by >= min_delta) in this many evaluations.",
                         ge=1, cli=False)
    min_delta: float = knob(0.01, help="The peak moves only when a reading exceeds it by at least this.", ge=0,
                            cli=False)
    collapse_drop: float = knob(0.3, help="collapsed: accuracy fell this far below the peak.", gt=0, cli=False)
    kl_window: int = knob(20, help="Early warning: KL (k3) rising steadily over this many steps.", ge=4, cli=False)
    futility: bool = knob(True, help="End a run as futile (FAIL) once even an optimistic projection of its recent "
                          "split accuracy stays below the target at max_steps (bench/stop.py; measured: 0 false "
                          "FAIL in 35 real runs and 4,000 simulated rising ones). Off: the rule is only recorded "
                          "(shadow decisions).", verl=True)
    futility_window: int = knob(10, help="Futility: the projection fits the last this many split evaluations.",
                                unit="evaluations", ge=3, verl=True)
    futility_confidence: float = knob(0.95, help="Futility: the projection's one-sided upper bound at this level "
                                      "must stay below the target.", gt=0.5, lt=1, verl=True)
    plateau: bool = knob(False, help="End a run as plateaued (FAIL) after `patience` evaluations without a gain "
                         "(measured: 1 false FAIL in 17 sound runs, so off by default: only recorded, the run goes "
                         "on).", verl=True)
    collapse: bool = knob(True, help="End a run as collapsed when its split accuracy falls far below its peak (off: "
                          "only recorded).", verl=True)

    def on(self, rule: str) -> bool:
        """Whether `rule` (a status of EARLY_RULES) ends a run; converged always does."""
        return {FUTILE: self.futility, PLATEAUED: self.plateau, COLLAPSED: self.collapse}.get(rule, True)


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
    # per rule of EARLY_RULES: [step, status, reason] of the first evaluation at which it would
    # have stopped the run, whether or not it is on (shadow decisions)
    shadow: dict[str, list] = field(default_factory=dict)

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


def futility_projection(evals: list[tuple[int, float, int]], max_steps: int,
                        confidence: float) -> tuple[float, float, float] | None:
    """(P, P + z·se(P), b): the optimistic projection of the split accuracy at `max_steps` from
    the evaluations `evals` [(step, accuracy, n)] (the module doc's definition: the n-weighted
    least-squares line, its slope b clipped at 0 from below, the binomial standard error at the
    readings' n widened by their overdispersion). None when fewer than 3 readings with n > 0 or
    all at one step."""
    pts = [(float(x), float(y), float(k)) for x, y, k in evals if k > 0]
    if len(pts) < 3:
        return None
    w = sum(k for _, _, k in pts)
    xm = sum(x * k for x, _, k in pts) / w
    ym = sum(y * k for _, y, k in pts) / w
    sxx = sum(k * (x - xm) ** 2 for x, _, k in pts)
    if sxx <= 0:
        return None
    b = sum(k * (x - xm) * (y - ym) for x, y, k in pts) / sxx
    pq = min(max(ym, 0.5 / w), 1 - 0.5 / w)
    pq = pq * (1 - pq)
    resid = sum(k * (y - ym - b * (x - xm)) ** 2 for x, y, k in pts)
    phi = max(1.0, resid / ((len(pts) - 2) * pq))
    proj = ym + max(b, 0.0) * (max_steps - xm)
    se = math.sqrt(phi * pq * (1 / w + (max_steps - xm) ** 2 / sxx))
    return proj, proj + NormalDist().inv_cdf(confidence) * se, b


def pooled_steps(ends: list[int], width: int) -> list[int]:
    """The distinct training steps (indices into the run's per-step rewards) behind evaluations
    whose windows end at `ends` (exclusive), each window the `width` steps before its end:
    ⋃ᵢ [max(0, endᵢ − width), endᵢ), ascending. Windows overlap when evaluations come more often
    than every `width` steps: B=16 on a 1,460-problem split (width 92) evaluated every 10 steps,
    three evaluations cover 92 + 2·10 = 112 steps, not 3·92 = 276."""
    return sorted({i for end in ends for i in range(max(0, end - width), end)})


def _futile(state: StopState, cfg: StopConfig, max_steps: int | None) -> tuple[str, str] | None:
    window = state.evals[-cfg.futility_window:]
    if max_steps is None or len(window) < cfg.futility_window:
        return None
    p = futility_projection(window, max_steps, cfg.futility_confidence)
    if p is None or p[1] >= cfg.target:
        return None
    proj, hi, b = p
    total = sum(k for _, _, k in window)
    flat = ", projected flat" if b < 0 else ""
    return FUTILE, (f"cannot plausibly reach {cfg.target} by max_steps={max_steps}: the last {len(window)} evaluations "
                    f"(steps {window[0][0]}–{window[-1][0]}, {total} graded samples) project {proj:.3f} at step "
                    f"{max_steps} (trend {100 * b:+.3f} per 100 steps{flat}), at most {hi:.3f} at "
                    f"{cfg.futility_confidence:.0%} (step {window[-1][0]})")


def after_eval(state: StopState, cfg: StopConfig, step: int, accuracy: float, n: int,
               pooled: tuple[float, int] | None = None, max_steps: int | None = None) -> tuple[str, str] | None:
    """Record one split evaluation (`accuracy` over `n` graded samples, e.g. problems × m);
    return (status, reason) when the run should stop: the first rule of EARLY_RULES that decides
    and is on (`StopConfig.on`). Every rule's first decision, on or off, is kept in
    `state.shadow`. The bound pools the last `hold`
    evaluations: by default as Σ aᵢnᵢ / Σ nᵢ over Σ nᵢ samples, right when each evaluation grades
    samples of its own (native: fresh draws every time). Where evaluations share graded samples
    (verl's windows of training rewards overlap when eval_every < their length) the caller gives
    `pooled` = (accuracy, n) over the distinct samples of those evaluations instead. `max_steps`:
    the horizon of the futility rule's projection (None: the rule never decides)."""
    decisions = _decide(state, cfg, step, accuracy, n, pooled, max_steps)
    for rule, verdict in decisions.items():
        if verdict is not None and rule not in state.shadow:
            state.shadow[rule] = [step, *verdict]
    return next((v for rule, v in decisions.items() if v is not None and cfg.on(rule)), None)


def _decide(state: StopState, cfg: StopConfig, step: int, accuracy: float, n: int,
            pooled: tuple[float, int] | None, max_steps: int | None) -> dict[str, tuple[str, str] | None]:
    """Update the state with one evaluation; {rule: its verdict at this evaluation or None}, in
    EARLY_RULES order."""
    out: dict[str, tuple[str, str] | None] = dict.fromkeys(EARLY_RULES)
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
            out[CONVERGED] = CONVERGED, (f"split accuracy {acc:.3f} over the last {cfg.hold} evaluations ({total} "
                                         f"graded samples): its {cfg.confidence:.0%} lower bound {state.bound:.3f} "
                                         f">= {cfg.target} (step {step})")
    if state.peak - accuracy >= cfg.collapse_drop:
        out[COLLAPSED] = COLLAPSED, (f"split accuracy {accuracy:.3f} fell {state.peak - accuracy:.3f} below its peak "
                                     f"{state.peak:.3f} (step {state.peak_step})")
    out[FUTILE] = _futile(state, cfg, max_steps)
    if state.evals_since_peak >= cfg.patience:
        out[PLATEAUED] = PLATEAUED, (f"no gain of {cfg.min_delta} over {cfg.patience} evaluations "
                                     f"(peak {state.peak:.3f} at step {state.peak_step})")
    return out


def first_decisions(evals: list[tuple[int, float, int]], cfg: StopConfig,
                    max_steps: int | None) -> dict[str, list]:
    """The shadow decisions of a stored evaluation history [(step, accuracy, n)], in order:
    {rule: [step, status, reason]} for each rule of EARLY_RULES that would have decided, as
    `after_eval` records them while the run goes on (the rules are pure functions of the
    history; a pooled verl bound is not recomputed here)."""
    state = StopState()
    for step, accuracy, n in evals:
        after_eval(state, cfg, step, accuracy, n, max_steps=max_steps)
    return state.shadow


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
