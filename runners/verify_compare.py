"""What `bench runs verify` compares, as pure functions: a run's stored window (the step-0
calibration, the per-step metrics and leaderboard columns of steps 1..N, the evaluations and
state digests of steps 0..N; for a window re-run from a checkpoint kept at step A, the steps,
evaluations and digests of A+1..N) against the same window re-run, value by value in step order.

On the device and CPU kind the run recorded, every value must be bit-identical; elsewhere each
number must lie within TOLERANCE (math.isclose: |a − b| ≤ max(rel·max(|a|, |b|), abs)), because
another GEMM kernel or reduction order moves the last bits. The metrics that time the machine
(bench/machine_metrics.py) are left out: a re-run gives them new values whatever else holds.
Metrics or calibration fields only the re-run has (a newer bench logs more) are not compared;
a stored value the re-run lacks, or an evaluation only one side has, is a difference.

A state digest is compared only with one of its own scheme (bench/statedigest.py): a run stored
before scheme 2 hashed the process-wide RNG states, which no re-run repeats, so its digests are
left out of the comparison and the result says so ("not comparable (scheme 1)") instead of
calling an otherwise identical re-run different."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from bench.machine_metrics import is_machine_metric
from bench.store.schema import RunStep

TOLERANCE = {"rel": 1e-3, "abs": 1e-6}
TOLERANCE_TEXT = "rel 1e-3 / abs 1e-6 (math.isclose)"
COLUMNS = RunStep.COLUMNS          # the leaderboard columns, stored beside the metrics dict
MISSING = "(none)"

# verdicts
BIT_IDENTICAL, WITHIN_TOLERANCE, DIFFERS = "bit-identical", "within-tolerance", "differs"


@dataclass
class Window:
    """One side of the comparison: calibration (or None), steps {step: {name: value}} (the
    metrics dict plus `<name> (column)` for the leaderboard columns), evals {(step, benchmark):
    (n, score)}."""

    calibration: dict | None = None
    steps: dict[int, dict] = field(default_factory=dict)
    evals: dict[tuple[int, str], tuple[int, float]] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)    # step → state digest (bench/statedigest.py)
    schemes: dict[int, int] = field(default_factory=dict)    # step → its digest's scheme (absent: the current)


def step_values(columns: dict, metrics: dict | None) -> dict:
    """A stored step as compared: its leaderboard columns (named `<name> (column)`) and every
    metric that does not time the machine."""
    values = {f"{c} (column)": columns.get(c) for c in COLUMNS}
    values.update({k: v for k, v in (metrics or {}).items() if not is_machine_metric(k)})
    return values


def flatten(w: Window, last_step: int, start: int = 0, digests: bool = True) -> dict[tuple, object]:
    """The window as {(step, part, name): value}, keys sorting in comparison order: each step's
    calibration (step 0), then whether the step is there and its metrics (reward first), then its
    evaluations (n and score), then its state digest (`digests`: not where the re-run may round
    otherwise). From step 0 the window is 0..last_step; from a kept checkpoint at `start` > 0,
    start+1..last_step (the state at `start` is the checkpoint's, checked against its digest)."""
    out: dict[tuple, object] = {}
    first = 0 if start == 0 else start + 1
    if start == 0:
        for k, v in (w.calibration or {}).items():
            out[(0, 0, f"calibration {k}")] = v
    for step, values in w.steps.items():
        if max(1, first) <= step <= last_step:
            out[(step, 1, "")] = "present"
            for k, v in values.items():
                out[(step, 2 if k in ("reward", "reward (column)") else 3, k)] = v
    for (step, bench), (n, score) in w.evals.items():
        if first <= step <= last_step:
            out[(step, 4, f"eval {bench} n")] = n
            out[(step, 5, f"eval {bench}")] = score
    for step, digest in w.digests.items():
        if digests and first <= step <= last_step:
            out[(step, 6, "state digest")] = digest
    return out


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def same(a, b, tolerance: dict | None) -> bool:
    """Whether stored `a` and re-run `b` agree: equal (bit for bit for floats), or, with a
    `tolerance`, both numbers within it."""
    if a == b:
        return True
    if tolerance is None or not (_number(a) and _number(b)):
        return False
    if math.isnan(a) and math.isnan(b):
        return True
    return math.isclose(a, b, rel_tol=tolerance["rel"], abs_tol=tolerance["abs"])


def _name(key: tuple) -> str:
    return "step" if key[1] == 1 else key[2]


def comparable_digests(stored: Window, replayed: Window) -> tuple[Window, Window, str | None]:
    """Both windows with the digests of the steps whose schemes differ left out, and what was
    left out in words (None: nothing). A step's scheme defaults to the current one."""
    from bench.statedigest import SCHEME

    def scheme(w: Window, step: int) -> int:
        return w.schemes.get(step, SCHEME)

    apart = {step for step in stored.digests
             if step in replayed.digests and scheme(stored, step) != scheme(replayed, step)}
    if not apart:
        return stored, replayed, None
    old = sorted({scheme(stored, step) for step in apart})
    kept = (replace(w, digests={k: v for k, v in w.digests.items() if k not in apart}) for w in (stored, replayed))
    return *kept, f"not comparable (scheme {', '.join(map(str, old))})"


def compare(stored: Window, replayed: Window, last_step: int, tolerance: dict | None, start: int = 0) -> dict:
    """{"compared", "differences", "exact_differences", "first_difference", "verdict", "digests"}
    over the window (`flatten`); "digests" says which state digests were not compared and why
    (`comparable_digests`; None: every one in the window was). `tolerance` None: bit-identical
    required (the recorded device and CPU kind), state digests included; else numbers within it
    pass (`exact_differences` counts
    those that differ at all) and digests, which only an identical state repeats, are not
    compared. Compared: every stored value, and every step and evaluation either side has;
    metrics, calibration fields and digests only the re-run logs (a run stored before they were)
    are not."""
    exact_state = tolerance is None
    stored, replayed, note = comparable_digests(stored, replayed)
    if not exact_state:
        note = "not compared (another device or CPU kind)"
    a_all, b_all = flatten(stored, last_step, start, exact_state), flatten(replayed, last_step, start, exact_state)
    keys = set(a_all) | {k for k in b_all if k[1] in (1, 4, 5)}        # a digest only the re-run has: a newer bench
    differences = exact = 0
    first = None
    for key in sorted(keys):
        a, b = a_all.get(key, MISSING), b_all.get(key, MISSING)
        if a == b:
            continue
        exact += 1
        if not same(a, b, tolerance):
            differences += 1
            if first is None:
                first = {"step": key[0], "metric": _name(key), "stored": a, "replayed": b}
    verdict = DIFFERS if differences else (WITHIN_TOLERANCE if exact else BIT_IDENTICAL)
    return {"compared": len(keys), "differences": differences, "exact_differences": exact,
            "first_difference": first, "verdict": verdict, "digests": note}
