"""How early each stop rule decides, and how often it agrees with the runs' final verdicts
(`bench report --early`).

Every native run records its shadow decisions (store table run_decisions: per rule of
bench/stop.py EARLY_RULES, the first step at which it would have ended the run and the status
it would have given, whether the rule was on or not). The rules are pure functions of the
stored split evaluations, so a run recorded before that table existed gets its decisions
recomputed (back-filled) from its evals and its stored StopConfig: `shadow_decisions` returns
the recorded ones when there are any, else the recomputed ones. Split evaluations graded
n = problems × m samples (native: `evals.n` is m, the build's kept problems the rest); verl runs
pool overlapping windows of training rewards and are left out.

Per rule, over the finished runs on which the rule was off (a run that a rule stopped cannot
show what it would have said later; converged is always on, and is the verdict itself):
- the run's outcome is its verdict (bench/statuses.py): PASS when it converged, FAIL when a rule
  ended it, UNDECIDED at its budget. Runs the calibration gate ended have no evaluations for a
  rule to read and are left out;
- the rule agrees when it did not decide (it says nothing, the run ends as the other rules
  say) or when what it said holds: converged's PASS on a PASS; a FAIL (futile, plateaued,
  collapsed) on a run that did not pass within its budget, FAIL or UNDECIDED — futility's claim
  is exactly that the budget will not reach the bar. A FAIL on a run that passed is a false FAIL;
- steps saved: Σ over its agreeing decisions of (the run's steps − the decision's step), as a
  share of Σ steps of the runs measured;
- a FAIL decision's step against the step at which today's default rules, other than the one
  measured (converged, futile, collapsed: StopConfig's defaults), end that run: the smallest of
  their shadow steps and the run's own end.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sqlalchemy import select

from bench.store import Build, Eval, Run, RunDecision, session

from bench import statuses
from bench import stop as stop_rules
from bench.verdicts import stop_config
from .plan import config_from_dict

# the ends a rule can be measured against: every finished status but the step-0 gate's
FINISHED = tuple(s for s in statuses.FINISHED if s != statuses.MISCALIBRATED)
# the rules today's defaults turn on: what a FAIL decision's step is measured against
DEFAULT_ON = tuple(r for r in stop_rules.EARLY_RULES if stop_rules.StopConfig().on(r))


def _config(run: Run):
    """The run's StopConfig and max_steps from its stored config (the defaults of its day for
    missing stop keys: bench/verdicts.py `stop_config`; RunConfig's for the rest)."""
    return stop_config(run.config or {}), config_from_dict(run.config).max_steps


def recompute(s, run: Run) -> dict[str, list]:
    """The shadow decisions of `run` recomputed from its stored split evaluations:
    {rule: [step, status, reason]} (bench/stop.py `first_decisions`)."""
    stop_cfg, max_steps = _config(run)
    build = s.get(Build, run.build_id)
    problems = build.n_kept or 0
    rows = s.execute(select(Eval.step, Eval.score, Eval.n).where(Eval.run_id == run.id, Eval.benchmark == "split")
                     .order_by(Eval.step)).all()
    return stop_rules.first_decisions([(st, sc, problems * n) for st, sc, n in rows], stop_cfg, max_steps)


def recorded(s, run_id: str) -> dict[str, list]:
    """The shadow decisions the trainer stored for `run_id` ({} when none)."""
    return {d.rule: [d.step, d.status, d.reason]
            for d in s.scalars(select(RunDecision).where(RunDecision.run_id == run_id))}


def shadow_decisions(s, run: Run) -> tuple[dict[str, list], str]:
    """(decisions, "recorded" | "recomputed"): the stored ones, or those back-filled from the
    evaluations for a run that has none stored (from before the table, or none decided)."""
    rec = recorded(s, run.id)
    return (rec, "recorded") if rec else (recompute(s, run), "recomputed")


@dataclass
class RunShadow:
    run: str
    status: str
    steps: int
    verdict: str                      # PASS | FAIL | UNDECIDED (bench/statuses.py)
    on: dict[str, bool]               # rule → whether it could end this run
    decisions: dict[str, list]        # rule → [step, status, reason]
    source: str                       # recorded | recomputed

    def today_step(self, besides: str | None = None) -> int:
        """The step at which today's default rules, other than `besides`, end the run: the
        soonest of their shadow steps, or the run's own end."""
        return min([self.steps, *(self.decisions[r][0] for r in DEFAULT_ON if r != besides and r in self.decisions)])

    def holds(self, says: str) -> bool:
        """Whether a rule's verdict holds on this run: PASS on a run that passed, FAIL on one
        that did not pass within its budget (FAIL or UNDECIDED)."""
        return (self.verdict == statuses.PASS) == (says == statuses.PASS)


def finished_shadows(store, build_id: str | None = None) -> list[RunShadow]:
    """The shadow decisions of every finished native run (optionally of one build)."""
    out = []
    with session(store) as s:
        q = select(Run).where(Run.status.in_(FINISHED), Run.trainer == "native")
        if build_id:
            q = q.where(Run.build_id == build_id)
        for run in s.scalars(q.order_by(Run.created_at)):
            decisions, source = shadow_decisions(s, run)
            stop_cfg, _ = _config(run)
            out.append(RunShadow(run.id, run.status, run.step, statuses.verdict(run.status),
                                 {r: stop_cfg.on(r) for r in stop_rules.EARLY_RULES}, decisions, source))
    return out


def says(rule: str) -> str:
    return statuses.PASS if rule == stop_rules.CONVERGED else statuses.FAIL


def rule_table(shadows: list[RunShadow]) -> list[dict]:
    """One row per rule of EARLY_RULES (the module doc's definitions): runs measured (the rule
    off; every run for converged), decided, agreeing, false FAILs (said FAIL on a run that
    passed), steps saved as a share of the measured runs' steps, and the median ratio of a
    FAIL decision's step to the step today's rules took on that run."""
    rows = []
    for rule in stop_rules.EARLY_RULES:
        measured = [r for r in shadows if rule == stop_rules.CONVERGED or not r.on[rule]]
        decided = [r for r in measured if rule in r.decisions]
        agree = [r for r in decided if r.holds(says(rule))]
        total = sum(r.steps for r in measured)
        saved = sum(r.steps - r.decisions[rule][0] for r in agree)
        ratios = sorted(r.decisions[rule][0] / r.today_step(rule) for r in agree
                        if says(rule) == statuses.FAIL and r.today_step(rule) > 0)
        fail = says(rule) == statuses.FAIL
        rows.append({"rule": rule, "says": says(rule), "runs": len(measured), "decided": len(decided),
                     "agree": len(measured) - len(decided) + len(agree),
                     "agreement": None if not measured else (len(measured) - len(decided) + len(agree)) / len(measured),
                     "false_fail": sum(1 for r in decided if fail and not r.holds(says(rule))),
                     "false_pass": sum(1 for r in decided if not fail and not r.holds(says(rule))),
                     "steps_saved": None if not total else saved / total,
                     "fail_step_vs_today_median": _median(ratios),
                     "recomputed": sum(1 for r in measured if r.source == "recomputed")})
    return rows


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None
