"""How the app colours a verdict, one palette for every table and chart: a cell's sanity verdict
(leaderboard/cells.py `verdict`) and its runs' statuses (bench/statuses.py).

- PASS (every seed converged) green; FAIL (a rule decided it) red; UNDECIDED (a seed ran out of
  budget before any rule decided, or stopped on an error) blue, neither green nor red; RUNNING
  (no seed failed, one still runs: the verdict is pending) amber; NO VERDICT grey.
- A status names how the runs ended, in five kinds: `pass` (converged), `pending` (running),
  `early` (decided before the run's own end: futile, a FAIL the futility rule called early, and
  skipped, a seed not run because its cell was already decided), `undecided` (max_steps: the
  budget ran out; failed: an error or Ctrl-C; interrupted: killed; evaluated: --max-steps 0) and
  `fail` (every other end: plateaued, collapsed, diverged, miscalibrated); each status's kind is
  declared in bench/statuses.py. A cell's status text lists its runs' statuses ("converged ×2,
  futile"); its kind is the first of pending, early, fail, undecided, pass that one of them has,
  so a cell still running or decided early never reads as an ordinary end.

`styled(frame)` is a pandas Styler over a display copy for st.dataframe (column_config formats
still apply: they take precedence over the Styler's text).
"""

from __future__ import annotations

import re

import pandas as pd

from bench.statuses import STATUSES

# (fill, ink) per verdict: the grid's pass-rate scale's green and red, lightened for a table cell
VERDICT_COLOURS = {"PASS": ("#c7e9c0", "#00441b"), "FAIL": ("#fcbba1", "#67000d"),
                   "UNDECIDED": ("#c6dbef", "#08306b"), "RUNNING": ("#fee391", "#662506"),
                   "NO VERDICT": ("#e0e0e0", "#252525")}
# a verdict as a mark on a white chart (the Leaderboard chart's points and intervals)
VERDICT_INK = {"PASS": "#1a9850", "FAIL": "#d73027", "UNDECIDED": "#2171b5", "RUNNING": "#e08214",
               "NO VERDICT": "#737373"}
# a marker (the grid's squares and the chart's points) per verdict
VERDICT_MARKS = {"PASS": "✓", "FAIL": "✗", "UNDECIDED": "?", "RUNNING": "…", "NO VERDICT": "–"}

STATUS_KINDS = {name: s.kind for name, s in STATUSES.items()}         # read from the statuses table
KIND_ORDER = ("pending", "early", "fail", "undecided", "pass")
KIND_COLOURS = {"pass": "#1a7837", "pending": "#b35806", "early": "#762a83", "undecided": "#2166ac",
                "fail": "#b2182b"}     # ink only
KIND_WORDS = {"pass": "converged", "pending": "running (verdict pending)",
              "early": "decided early (futile, skipped)", "undecided": "undecided (budget or error)",
              "fail": "ended by a rule without passing"}


def status_kind(status_text) -> str | None:
    """The kind (module doc) of a run status or of a cell's status text ("converged ×2, futile");
    None for an empty or missing one."""
    if not isinstance(status_text, str) or not status_text.strip():
        return None
    statuses = [re.sub(r"\s*×\d+$", "", part.strip()) for part in status_text.split(",") if part.strip()]
    kinds = {STATUS_KINDS.get(s, "fail") for s in statuses}
    return next(k for k in KIND_ORDER if k in kinds)


def verdict_css(verdict) -> str:
    """The table-cell CSS of a sanity verdict ("" for anything else)."""
    if verdict not in VERDICT_COLOURS:
        return ""
    fill, ink = VERDICT_COLOURS[verdict]
    return f"background-color: {fill}; color: {ink}; font-weight: 600"


def status_css(status_text) -> str:
    """The table-cell CSS of a status text: its kind's ink, italic when decided early."""
    kind = status_kind(status_text)
    if kind is None:
        return ""
    return f"color: {KIND_COLOURS[kind]}" + ("; font-style: italic" if kind == "early" else "")


def styled(frame: pd.DataFrame, verdict_cols=("sanity",), status_cols=("status",)):
    """A Styler of `frame` with its verdict and status columns coloured (the columns it has)."""
    sty = frame.style
    verdicts = [c for c in verdict_cols if c in frame.columns]
    statuses = [c for c in status_cols if c in frame.columns]
    if verdicts:
        sty = sty.map(verdict_css, subset=verdicts)
    if statuses:
        sty = sty.map(status_css, subset=statuses)
    return sty


def legend_text() -> str:
    """One caption line that names the colours."""
    return ("Sanity: PASS green, FAIL red (a rule decided it), UNDECIDED blue (the budget ran out first), "
            "RUNNING amber (pending). Status: "
            + ", ".join(f"{KIND_WORDS[k]} {name}" for k, name in (("pass", "green"), ("pending", "amber"),
                                                                   ("early", "violet in italics"),
                                                                   ("undecided", "blue"), ("fail", "red")))
            + ".")
