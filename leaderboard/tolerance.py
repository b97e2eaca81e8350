"""The tolerance table: on one build, how far down the precision ladder (bench/ladder.py: rollouts
at each rung, fp32 training) each algorithm's cells still PASS.

A ladder cell is a cell (leaderboard/cells.py) whose training format is fp32 and whose rollout
format is fp32 or a rung. `ladder_frame` gives one row per (algorithm, rung) run; `tolerances`
one row per algorithm: its tolerance, the coarsest rung whose cell PASSes on every seed (as
`bench tolerance` answers it: runners/tolerance.py), the first rung run above it with that cell's
seeds, and the mismatch it survived there: the per-token k3 of KL[μ‖π] averaged over each run's
steps (`mean_kl`), the median over the cell's seeds."""

from __future__ import annotations

import math

import pandas as pd

from bench.fingerprint import fingerprint
from bench.formats import LADDER
from bench.precision import Precision

COLUMNS = ["algo", "rung", "index", "sanity", "passes", "pass_rate", "peak_mean", "kl_k3_median", "n_seeds"]
SUMMARY = ["algo", "tolerance", "passes", "k3", "above", "above_passes", "rungs_run"]


def rung_of(precision: str) -> str | None:
    """The ladder rung of a cell's pair (`e8m3→fp32` → e8m3, `fp32` → fp32), None off the ladder."""
    p = Precision.parse(precision)
    return p.rollout if p.train == "fp32" and p.rollout in LADDER else None


def with_search_key(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` (`runs_frame`) with `config_fp` the settings fingerprint without the step budget
    (`max_steps`), the key a search's cells share. A search extends a rung that ends UNDECIDED
    (`--extend-to`: `bench runs extend` raises the run's max_steps), and the extended seed is still a
    seed of its rung's cell, not a cell of its own."""
    if runs.empty:
        return runs
    return runs.assign(config_fp=[fingerprint({k: v for k, v in (c or {}).items() if k != "max_steps"})
                                  for c in runs.config])


def search_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """The cells (leaderboard/cells.py) of `runs` (`runs_frame`) as a search pools them: keyed by
    `with_search_key`'s fingerprint."""
    from leaderboard.cells import cells_frame

    return cells_frame(with_search_key(runs))


def ladder_tables(frame: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame, pd.DataFrame]]:
    """The tolerance tables among the native, non-stale runs of `frame` (`runs_frame`): per (build,
    engine, config_fp) with ladder cells (`search_cells`, so config_fp is the fingerprint without
    max_steps), that key, its ladder (`ladder_frame`) and its `tolerances`."""
    from leaderboard.cells import with_staleness

    if frame.empty:
        return []
    runs = with_staleness(frame[frame.trainer == "native"])
    out = []
    for key, g in search_cells(runs[runs.staleness == 0]).groupby(["build", "engine", "config_fp"], sort=False):
        ladder = ladder_frame(g)
        if not ladder.empty:
            out.append((key, ladder, tolerances(ladder)))
    return out


def ladder_frame(cells: pd.DataFrame) -> pd.DataFrame:
    """The ladder cells, one row each, by algorithm then rung (finest first)."""
    rows = []
    for c in cells.itertuples(index=False):
        rung = rung_of(c.precision)
        if rung is not None:
            rows.append({"algo": c.algo, "rung": rung, "index": LADDER.index(rung), "sanity": c.sanity,
                         "passes": c.passes, "pass_rate": c.pass_rate, "peak_mean": c.peak_mean,
                         "kl_k3_median": getattr(c, "kl_k3_median", math.nan), "n_seeds": c.n_seeds})
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(["algo", "index"], kind="stable").reset_index(drop=True)


def tolerances(ladder: pd.DataFrame) -> pd.DataFrame:
    """One row per algorithm of `ladder` (ladder_frame): the coarsest rung whose cell PASSes (None
    when none does), its seeds and k3 there, and the first rung run above it with its seeds (None
    when it is the coarsest run)."""
    rows = []
    for algo, g in ladder.groupby("algo", sort=False):
        passed = g[g.sanity == "PASS"]
        tol = passed.iloc[-1] if not passed.empty else None
        above = g[g["index"] > (tol["index"] if tol is not None else -1)]
        nxt = above.iloc[0] if not above.empty else None
        rows.append({"algo": algo, "tolerance": None if tol is None else tol.rung,
                     "passes": None if tol is None else tol.passes,
                     "k3": math.nan if tol is None else tol.kl_k3_median,
                     "above": None if nxt is None else nxt.rung, "above_passes": None if nxt is None else nxt.passes,
                     "rungs_run": len(g)})
    return pd.DataFrame(rows, columns=SUMMARY)
