"""`bench report --early`: each stop rule's shadow decisions measured against the finished runs'
verdicts (runners/early_decisions.py has the definitions)."""

from __future__ import annotations

import json

from rich.table import Table

from bench.cli import out


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def print_early(store, build_id: str | None, as_json: bool) -> None:
    from runners.early_decisions import finished_shadows, rule_table

    shadows = finished_shadows(store, build_id)
    rows = rule_table(shadows)
    if as_json:
        out.print_json(json.dumps({"rules": rows, "runs": [vars(r) for r in shadows]}, default=str))
        return
    if not shadows:
        out.print("no finished native runs yet: `bench run --algo pg-seq-is --dtype fp16 --no-plateau` records "
                  "every rule's decision while only converged and max_steps end it", highlight=False)
        return
    t = Table("rule", "says", "runs (rule off)", "decided", "agreement", "false FAIL", "steps saved",
              "FAIL step ÷ today's (median)")
    for r in rows:
        t.add_row(r["rule"], r["says"], str(r["runs"]), str(r["decided"]),
                  "-" if r["agreement"] is None else f"{r['agree']}/{r['runs']} ({r['agreement']:.0%})",
                  str(r["false_fail"]) if r["says"] == "FAIL" else "-", _pct(r["steps_saved"]),
                  _pct(r["fail_step_vs_today_median"]))
    out.print(t)
    back = sum(1 for s in shadows if s.source == "recomputed")
    out.print(f"{len(shadows)} finished native run(s); {back} without recorded decisions, recomputed from their split "
              "evaluations. A rule is measured only on runs it could not stop (run with it off: a run a rule "
              "ended cannot show what it would have done later); converged is always on, so its row is the verdict "
              "itself. Agreement: the rule did not decide, or what it said holds (PASS: the run converged; FAIL: "
              "the run did not pass within its budget, by a rule (FAIL) or at max_steps (UNDECIDED)). Steps saved: "
              "the steps after its agreeing decisions, as a share of the measured runs' steps. Today's: the step "
              "the default rules other than the one measured (converged, futile, collapsed) end the run at.",
              highlight=False)
