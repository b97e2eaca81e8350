"""A run's verdict recomputed from its stored evidence, not read off its status label.

A status claims that something happened; the evidence is what the run stored while it happened:
its split evaluations (step, accuracy, graded samples), its step-0 calibration, the metrics of
its last steps and its budget. `decide(evidence)` replays the run's own stop rules (its stored
StopConfig, bench/stop.py) over the evaluations and returns the status they support, the rule
and the step that decided it:

- `miscalibrated` when the stored calibration failed (rule `calibration`, the gate's step);
- the first rule that decides and is on (`converged`, `futile`, `collapsed`, `plateaued`) at
  the evaluation where it decides: the run must have ended there;
- `diverged` when the last step's metrics show the divergence the trainer stops on: as many
  optimizer steps in a row skipped for non-finite values as `max_nonfinite_in_a_row` (the trainer
  logs `nonfinite_in_a_row` at every step that has some), non-finite weights, or (verl, and runs
  from before those were recorded) a non-finite loss or gradient;
- `max_steps` (UNDECIDED) when the run reached its budget with an evaluation at it and no rule
  decided (rule `budget`);
- a run `running`, `failed` (an error, Ctrl-C) or `skipped` claims no end and keeps that status
  (NO_CLAIM); for any other claim, no rule deciding means the claim is unsupported.

`check(evidence)` compares the claimed status with the recomputed one and says, naming the rule
and the readings, why a claim is not supported (bundle import refuses such a run; the report and
the app show the recomputed verdict beside the claim).

Configs stored before a stop knob existed get the default of their day for it, so a stored run
is judged by the rules it ran under: `futility` off and `plateau` on (`LEGACY_STOP`).
Evaluations: native runs grade n = problems × m samples per split evaluation (`evals.n` is m);
verl runs grade the last pass's training rewards and pool the last `hold` windows over their
distinct steps (bench/stop.py `pooled_steps`), recomputed here from the stored step rewards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from sqlalchemy import func, select

from bench import statuses
from bench.stop import StopConfig, StopState, after_eval, futility_projection, pooled_steps
from bench.store import Build, Eval, Run, RunStep

# stop knobs added after runs were first stored, with the default those runs ran under
LEGACY_STOP = {"futility": False, "plateau": True}
# statuses that claim no end: the run keeps them whatever its evaluations say
NO_CLAIM = (statuses.RUNNING, statuses.FAILED, statuses.SKIPPED)
# what the stored config's keys default to when missing (bench/../runners/presets.py RunConfig)
MAX_NONFINITE_DEFAULT = 20


@dataclass
class Evidence:
    """What a stored run says about itself, whatever its label: from the store (`from_store`)
    or from a bundle's run document (`from_bundle`)."""

    status: str                              # the claimed status
    step: int                                # the last step the run stored
    config: dict                             # the stored RunConfig (asdict)
    trainer: str = "native"
    calibration: dict | None = None
    evals: list[tuple[int, float, int]] = field(default_factory=list)   # split: (step, accuracy, stored n)
    problems: int = 0                        # the build's kept problems (native n = problems × stored n)
    last_metrics: dict = field(default_factory=dict)                    # the metrics of the last stored step
    rewards: list[tuple[int, float]] = field(default_factory=list)      # verl: (step, training reward)


@dataclass(frozen=True)
class Decision:
    status: str            # the status the evidence supports
    rule: str | None       # converged, futile, collapsed, plateaued, calibration, non-finite, budget; None: no end
    step: int | None       # the step at which it decided (None: no end)
    reason: str

    @property
    def verdict(self) -> str:
        return statuses.verdict(self.status)


def stop_config(config: dict) -> StopConfig:
    """The StopConfig a stored run ran under (LEGACY_STOP for knobs its config predates)."""
    stored = dict(config.get("stop") or {})
    names = {f.name for f in fields(StopConfig)}
    return StopConfig(**{**LEGACY_STOP, **{k: v for k, v in stored.items() if k in names}})


def _readings(evals) -> str:
    """The last few readings in words: "0.950@60, 0.935@65, 0.960@70"."""
    return ", ".join(f"{a:.3f}@{s}" for s, a, _ in evals[-5:]) or "none"


def graded_evals(ev: Evidence) -> list[tuple[int, float, int]]:
    """The split evaluations in step order as the stop rules read them: (step, accuracy, graded
    samples), n = problems × the stored m for a native run, the stored n for verl."""
    verl = ev.trainer == "verl"
    return [(int(s), float(a), int(n) if verl else ev.problems * int(n)) for s, a, n in sorted(ev.evals)]


def replay(ev: Evidence) -> tuple[StopState, tuple[int, str, str] | None]:
    """The run's stop rules over its stored split evaluations, in order: (the final state, the
    first decision of a rule that is on as (step, status, reason), or None)."""
    cfg, max_steps = stop_config(ev.config), ev.config.get("max_steps")
    state = StopState()
    verl = ev.trainer == "verl"
    history = [(s, r) for s, r in sorted(ev.rewards) if r is not None and math.isfinite(r)]
    width = max(1, math.ceil(ev.problems / max(1, int(ev.config.get("prompts_per_step") or 1)))) if verl else 0
    per_step = int(ev.config.get("prompts_per_step") or 1) * int(ev.config.get("samples_per_prompt") or 1)
    ends: list[int] = []
    for step, acc, graded in graded_evals(ev):
        pooled = None
        if verl:
            ends.append(sum(1 for s, _ in history if s <= step))
            idx = pooled_steps(ends[-cfg.hold:], width)
            pooled = ((sum(history[i][1] for i in idx) / len(idx), len(idx) * per_step) if idx else (0.0, 0))
        d = after_eval(state, cfg, step, acc, graded, pooled=pooled, max_steps=max_steps)
        if d is not None:
            return state, (step, *d)
    return state, None


def _diverged(ev: Evidence) -> str | None:
    """Why the last step's metrics show divergence, or None."""
    m = ev.last_metrics or {}
    limit = int(ev.config.get("max_nonfinite_in_a_row") or MAX_NONFINITE_DEFAULT)
    if (m.get("nonfinite_in_a_row") or 0) >= limit:
        return f"{int(m['nonfinite_in_a_row'])} optimizer steps in a row skipped for non-finite values (limit {limit})"
    if (m.get("nonfinite_weights") or 0) > 0:
        return "non-finite weights after the update"
    # verl stops on one non-finite loss; a native run from before the counters claimed it on its own
    # (one skipped fp16 step of an ongoing native run is no divergence)
    if (ev.trainer == "verl" or ev.status == statuses.DIVERGED) and any(
            k in m and m[k] is None for k in ("loss", "grad_norm")):
        return "a non-finite loss or gradient (stored as null)"
    return None


def decide(ev: Evidence) -> Decision:
    """The status the run's evidence supports (the module doc's order)."""
    cal = ev.calibration
    if cal is not None and cal.get("ok") is False:
        return Decision(statuses.MISCALIBRATED, "calibration", 0 if ev.trainer != "verl" else min(ev.step, 1),
                        f"the step-0 calibration gate failed ({', '.join(cal.get('failed') or []) or 'k3 band'})")
    if ev.status in NO_CLAIM:
        return Decision(ev.status, None, None, f"{ev.status} at step {ev.step}: no end claimed")
    _, d = replay(ev)
    if d is not None:             # the trainer checks divergence before a step's evaluation: a decision wins
        step, status, reason = d
        return Decision(status, status, step, reason)
    div = _diverged(ev)
    if div:
        return Decision(statuses.DIVERGED, "non-finite", ev.step, div)
    max_steps = ev.config.get("max_steps")
    last_eval = max((s for s, _, _ in ev.evals), default=None)
    if max_steps == 0 and last_eval == 0:        # stored as max_steps before `evaluated` existed
        return Decision(ev.status if ev.status == statuses.MAX_STEPS else statuses.EVALUATED, "budget", 0,
                        f"max_steps=0: the step-0 evaluation only (reading {_readings(sorted(ev.evals))})")
    if max_steps is not None and ev.step >= max_steps and last_eval == ev.step:
        return Decision(statuses.MAX_STEPS, "budget", ev.step,
                        f"reached max_steps={max_steps} with no rule decided (readings {_readings(sorted(ev.evals))})")
    return Decision(statuses.FAILED, None, None, f"no rule decided by step {ev.step} (max_steps={max_steps}; "
                    f"readings {_readings(sorted(ev.evals))})")


def check(ev: Evidence, d: Decision | None = None) -> str | None:
    """None when the claimed status is the one the evidence supports (a run without an end,
    `running`, `failed` or `skipped`, claims none and is never refused); else why not, with the
    rule and the readings. `d`: decide(ev), where the caller has it already."""
    d = decide(ev) if d is None else d
    if ev.status in NO_CLAIM and d.rule is None:
        return None
    if d.status == ev.status and (d.step is None or d.step == ev.step):
        return None
    if d.status == ev.status:
        return (f"status {ev.status!r} at step {ev.step}, but its rule decided at step {d.step}: {d.reason}")
    why = ""
    if ev.status == statuses.CONVERGED:
        cfg, state = stop_config(ev.config), replay(ev)[0]
        bound = "none" if state.bound is None else f"{state.bound:.3f}"
        why = (f" (the converged rule: no pooled {cfg.confidence:.0%} lower bound over {cfg.hold} evaluations "
               f"reached the target {cfg.target}; the last is {bound})")
    elif ev.status == statuses.MAX_STEPS and d.rule is None:
        why = (f" (max_steps: the run stopped at step {ev.step} without an evaluation at "
               f"max_steps={ev.config.get('max_steps')})")
    says = "no rule decided" if d.rule is None else f"they say {d.status!r} by the {d.rule} rule at step {d.step}"
    return f"status {ev.status!r} is not supported by its evaluations{why}: {says}: {d.reason}"


def projection(ev: Evidence) -> tuple[float | None, str]:
    """For a run undecided at its budget: where the futility rule's optimistic line (the
    n-weighted least-squares line over its last `futility_window` evaluations, bench/stop.py
    `futility_projection`) reaches the target, and that in words. (None, why not) when the trend
    is flat or falling, or there are too few evaluations."""
    cfg = stop_config(ev.config)
    window = graded_evals(ev)[-cfg.futility_window:]
    last = window[-1][0] if window else ev.step
    fit = futility_projection(window, last, cfg.futility_confidence)
    if fit is None:
        return None, "too few evaluations to project"
    p_last, _, b = fit
    if p_last >= cfg.target:
        return float(last), f"its projection is already at {p_last:.3f} ≥ {cfg.target} at step {last}"
    if b <= 0:
        return None, (f"its optimistic line would not reach {cfg.target}: the last {len(window)} evaluations "
                      f"trend {100 * b:+.3f} per 100 steps (projected {p_last:.3f} at step {last})")
    reach = last + (cfg.target - p_last) / b
    every = int(ev.config.get("eval_every") or 10)
    budget = every * math.ceil((reach + cfg.hold * every) / every)      # room for `hold` evaluations past it
    return reach, (f"its optimistic line (trend {100 * b:+.3f} per 100 steps over the last {len(window)} "
                   f"evaluations) reaches {cfg.target} near step {math.ceil(reach)}: "
                   f"`bench runs extend RUN --max-steps {budget}` can decide it")


def peak(ev: Evidence) -> float | None:
    """The highest split evaluation (the run's `peak_accuracy`)."""
    return max((a for _, a, _ in ev.evals), default=None)


def from_bundle(run: dict, build: dict) -> Evidence:
    """The evidence of a bundle's run document (bench/bundle.py) and its build's."""
    steps = sorted(run["steps"], key=lambda x: x["step"])
    return Evidence(status=run["status"], step=run["step"], config=run["config"], trainer=run["trainer"],
                    calibration=run["calibration"],
                    evals=[(e["step"], e["score"], e["n"]) for e in run["evals"] if e["benchmark"] == "split"],
                    problems=build.get("n_kept") or len(build.get("kept") or []),
                    last_metrics=(steps[-1]["metrics"] or {}) if steps else {},
                    rewards=[(x["step"], x["reward"]) for x in steps] if run["trainer"] == "verl" else [])


def from_store(conn, run_ids: list[str] | None = None) -> dict[str, Evidence]:
    """The evidence of the stored runs `run_ids` (every run when None), by run id; `conn` is a
    SQLAlchemy Session or Connection. Four queries however many runs."""
    q = select(Run.id, Run.status, Run.step, Run.config, Run.trainer, Run.calibration, Build.n_kept) \
        .join(Build, Build.id == Run.build_id)
    if run_ids is not None:
        q = q.where(Run.id.in_(run_ids))
    out = {rid: Evidence(status=st, step=step or 0, config=cfg or {}, trainer=tr, calibration=cal, problems=kept or 0)
           for rid, st, step, cfg, tr, cal, kept in conn.execute(q).all()}
    if not out:
        return out
    ids = list(out)
    for rid, step, score, n in conn.execute(select(Eval.run_id, Eval.step, Eval.score, Eval.n)
                                            .where(Eval.run_id.in_(ids), Eval.benchmark == "split")
                                            .order_by(Eval.step)).all():
        out[rid].evals.append((step, score, n))
    last = select(RunStep.run_id, func.max(RunStep.step).label("s")).where(RunStep.run_id.in_(ids)) \
        .group_by(RunStep.run_id).subquery()
    for rid, metrics in conn.execute(select(RunStep.run_id, RunStep.metrics)
                                     .join(last, (last.c.run_id == RunStep.run_id) & (last.c.s == RunStep.step))).all():
        out[rid].last_metrics = metrics or {}
    verl = [rid for rid, ev in out.items() if ev.trainer == "verl"]
    if verl:
        for rid, step, reward in conn.execute(select(RunStep.run_id, RunStep.step, RunStep.reward)
                                              .where(RunStep.run_id.in_(verl)).order_by(RunStep.step)).all():
            out[rid].rewards.append((step, reward))
    return out


def deciding_window(ev: Evidence, d: Decision | None = None) -> tuple[int, int] | None:
    """(A, B): the steps A+1..B whose re-run re-computes every evaluation the deciding rule read —
    B the decision's step, A the evaluation before the first it read (0: from the start, the
    calibration included). The rule reads: converged and the budget the last `hold` evaluations;
    futile the last `futility_window`; plateaued the last `patience` + 1; collapsed those from
    its peak on; non-finite the last step after the last evaluation; the calibration gate step 0.
    None when nothing decided (no end claimed). What a re-run of the window does not recompute:
    the evaluations before A, on which the rules' state also rests (which reading was the peak,
    that no rule decided earlier); only a re-run from step 0 covers those."""
    d = decide(ev) if d is None else d
    if d.rule is None or d.step is None:
        return None
    if d.rule == "calibration":
        return (0, 0)
    steps = sorted({s for s, _, _ in ev.evals if s <= d.step})
    if d.rule == "non-finite":
        before = [s for s in steps if s < d.step]
        return (before[-1] if before else 0, d.step)
    cfg = stop_config(ev.config)
    if d.rule == statuses.COLLAPSED:
        peak_step = replay(ev)[0].peak_step
        read = [s for s in steps if s >= peak_step]
    else:
        k = {statuses.FUTILE: cfg.futility_window, statuses.PLATEAUED: cfg.patience + 1}.get(d.rule, cfg.hold)
        read = steps[-k:]
    if not read:
        return (0, d.step)
    i = steps.index(read[0])
    return (steps[i - 1] if i > 0 else 0, d.step)
