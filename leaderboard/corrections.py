"""The rescue table: on one build, which algorithms turn a failing precision pair into a PASS.

A pair *fails* when a cell of one of the FP16 paper's seven algorithms (bench/algorithms.py
PAPER_ALGORITHMS) at that pair has the verdict FAIL (a rule decided it: futile, collapsed,
diverged, the step-0 gate). For each such pair every algorithm's cell is a row: its verdict over
its seeds, pass rate, mean peak split accuracy and median steps to pass; `rescues` is True where
that cell PASSes (every seed converged) on a pair where a paper cell FAILs. Cells come from
leaderboard/cells.py `cells_frame` (one trainer, engine and settings: the page narrows them)."""

from __future__ import annotations

import pandas as pd

from bench.algorithms import ALGORITHMS, PAPER_ALGORITHMS, SPECS

COLUMNS = ["algo", "group", "precision", "sanity", "passes", "pass_rate", "peak_mean", "steps_to_pass_median",
           "n_seeds", "rescues"]


def failing_pairs(cells: pd.DataFrame) -> list[str]:
    """The precision pairs (as cells name them, "mxfp4→fp16") where a paper algorithm's cell FAILs,
    in the order they first appear."""
    paper = cells[cells.algo.isin(PAPER_ALGORITHMS) & (cells.sanity == "FAIL")]
    return list(dict.fromkeys(paper.precision))


def rescue_frame(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per (algorithm, failing pair), every algorithm of ALGORITHMS in its order whether run
    or not (an unrun cell has no verdict: sanity None)."""
    pairs = failing_pairs(cells)
    rows = []
    for pair in pairs:
        at = cells[cells.precision == pair].set_index("algo")
        for algo in ALGORITHMS:
            c = at.loc[algo] if algo in at.index else None
            if isinstance(c, pd.DataFrame):            # several cells of one algorithm: the page narrows first
                raise ValueError(f"{algo} {pair}: {len(c)} cells; narrow to one trainer, engine and settings")
            rows.append({"algo": algo, "group": "paper" if algo in PAPER_ALGORITHMS else "correction",
                         "precision": pair,
                         **({k: c[k] for k in ("sanity", "passes", "pass_rate", "peak_mean", "steps_to_pass_median",
                                               "n_seeds")} if c is not None else
                            {"sanity": None, "passes": None, "pass_rate": float("nan"), "peak_mean": float("nan"),
                             "steps_to_pass_median": float("nan"), "n_seeds": 0}),
                         "rescues": c is not None and c["sanity"] == "PASS"})
    return pd.DataFrame(rows, columns=COLUMNS)


def describe(algo: str) -> str:
    """What the algorithm's correction is, in the four words of bench/algorithms.py."""
    s = SPECS[algo]
    return f"{s.anchor}, {s.unit}, {s.kind}"
