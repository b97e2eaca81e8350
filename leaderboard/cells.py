"""A leaderboard cell: one algorithm at one precision pair and one staleness K on one build, with
one trainer, one rollout engine and one settings fingerprint, over its seeds. Shared by the
Streamlit pages and `bench report`; pure functions of `runs_frame` (a frame without a
`staleness` column reads as K = 0 throughout; without `config_fp`, the fingerprint of its
`config` column, or of no config at all).

The key (CELL_KEY) is (model, build, algo, precision, trainer, engine, staleness, config_fp):
`config_fp` is bench/fingerprint.py's hash of every stored setting but the seed (and the
bookkeeping it lists), so runs at another learning rate, or from another engine, never share a
cell, and no run stands in for a seed of another cell.

Per cell: passes k/N (a seed passes when its run's verdict, recomputed from its evaluations by
bench/verdicts.py, is PASS) and what they support: `pass_lower`, the one-sided 95%
Clopper–Pearson lower bound on one seed's pass probability (1/1 → 0.05, 3/3 → 0.37, 10/10 →
0.74: "PASS 1/1" is weak evidence). The cell's verdict: FAIL once a seed FAILs (a rule decided
it); PASS when every seed passes; RUNNING while a seed still runs; else UNDECIDED (a seed reached
its budget undecided, or stopped on an error). Peak split accuracy: the mean over seeds with a
two-sided 95% Student-t interval on the logit scale mapped back (bench/stats.py
`logit_t_interval`: inside (0, 1) whatever the spread; none for one seed), and the plain
t-interval on the accuracies (mean ± t(0.975, n−1)·s/√n) kept as `peak_t_lo` / `peak_t_hi`,
which can leave [0, 1]; steps to pass as the median over the passing seeds
with their min–max; the mismatch as the median over seeds of each run's mean KL k3 (last tenth
of the run). A seed counts once: when it ran more than once, its newest run stands for it.
A seed `skipped` because its cell was already decided by a failing seed (runners/sweep.py) is
no seed of the cell's figures: `decided` then says "decided after k of N seeds" (k run, N asked).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pandas as pd

from bench import fingerprint as fingerprints
from bench.fingerprint import fingerprint
from bench import statuses
from bench.stats import clopper_pearson_lower, logit_t_interval, t_interval

CELL_KEY = list(fingerprints.CELL_KEY)      # defined once, in bench/fingerprint.py
LEVEL = 0.95
INTERVAL = "95% Student-t interval over seeds on the logit scale (σ(mean logit ± t(0.975, n−1)·s/√n))"
PASS_BOUND = "one-sided 95% Clopper–Pearson lower bound on a seed's pass probability"


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def _present(series) -> list[float]:
    return [float(v) for v in series if v is not None and v == v]


def verdict(sanities: list[str]) -> str:
    """The cell's verdict from its seeds' verdicts: FAIL once one seed FAILs; PASS when every
    seed passes; RUNNING while one still runs; else UNDECIDED (no seeds, a seed undecided at its
    budget, or one without a verdict)."""
    if any(s == statuses.FAIL for s in sanities):
        return statuses.FAIL
    if sanities and all(s == statuses.PASS for s in sanities):
        return statuses.PASS
    return statuses.RUNNING_VERDICT if statuses.RUNNING_VERDICT in sanities else statuses.UNDECIDED


def pass_evidence(k: int, n: int) -> str:
    """What k of n passing seeds support, in words: "3/3 pass: p ≥ 0.37" (PASS_BOUND)."""
    return f"{k}/{n} pass: p ≥ {clopper_pearson_lower(k, n, LEVEL):.2f}" if n else "no seeds"


def cell_columns() -> list[str]:
    return [*CELL_KEY, "sanity", "passes", "pass_lower", "evidence", "seeds", "status", "pass_rate", "peak_mean",
            "peak_ci_lo", "peak_ci_hi", "peak_t_lo", "peak_t_hi", "peak_sd", "steps_to_pass_median",
            "steps_to_pass_min", "steps_to_pass_max", "kl_k3_median", "router_flip_median", "n_seeds",
            "runs", "decided", "early", "verification"]


def with_staleness(runs: pd.DataFrame) -> pd.DataFrame:
    """A copy of `runs` with an integer `staleness` column (0 where missing)."""
    r = runs.copy()
    r["staleness"] = (r["staleness"].fillna(0) if "staleness" in r.columns else 0)
    r["staleness"] = r["staleness"].astype(int)
    return r


def with_cell_key(runs: pd.DataFrame) -> pd.DataFrame:
    """A copy of `runs` with every CELL_KEY column: `staleness` as in `with_staleness`, `engine`
    None where missing, `config_fp` the fingerprint of `config` where missing."""
    r = with_staleness(runs)
    if "engine" not in r.columns:
        r["engine"] = None
    if "config_fp" not in r.columns:
        r["config_fp"] = [fingerprint(c) for c in r.config] if "config" in r.columns else fingerprint(None)
    return r


def no_cell(status: str | None, config) -> bool:
    """Whether a run is no seed of any cell: a status of NOT_IN_CELLS, or a budget of 0 steps."""
    return status in statuses.NOT_IN_CELLS or (isinstance(config, dict) and config.get("max_steps") == 0)


def seed_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One run per (cell, seed): the newest (a seed rerun after a failure counts once). A run that
    is no seed of a cell (bench/statuses.py NOT_IN_CELLS: `evaluated`, or a run of budget 0 stored
    as max_steps before that status) is left out."""
    if runs.empty:
        return runs
    col = lambda name: runs[name] if name in runs.columns else [None] * len(runs)      # noqa: E731
    r = with_cell_key(runs[[not no_cell(st, cfg) for st, cfg in zip(col("status"), col("config"))]])
    if "seed" not in r.columns:
        r["seed"] = None
    r["_seed"] = r.seed.map(lambda x: -1 if x is None or x != x else int(x))
    r = r.sort_values("created_at", kind="stable") if "created_at" in r.columns else r
    r = r.groupby(CELL_KEY + ["_seed"], dropna=False, sort=False).tail(1)
    return r.drop(columns=["_seed"])


def _early(g: pd.DataFrame) -> str | None:
    """The seeds' verdicts given early by a stop rule, with the rule and step ("seed 0: FAIL by
    futile at step 95; ..."), or None when no seed ended so. The rule and step are those the
    evidence gives (`decided_by`, `decided_step` of runs_frame) where the frame has them."""
    from leaderboard.queries import early_verdict

    if "decided_by" in g.columns:
        rules, steps = g.decided_by, g.decided_step
    else:
        rules, steps = g.status, (g.steps if "steps" in g.columns else [None] * len(g))
    texts = [(seed, early_verdict(rule, step)) for seed, rule, step in zip(g.seed, rules, steps)]
    parts = [("" if seed is None or seed != seed else f"seed {int(seed)}: ") + t for seed, t in texts if t]
    return "; ".join(parts) or None


def _verification(g: pd.DataFrame) -> str | None:
    """The cell's seeds' verification levels in words (bench/verification.py), where the frame
    has them."""
    if "verification_level" not in g:
        return None
    from bench.verification import Level, cell_text

    return cell_text([Level(lv, t, bool(v)) for lv, t, v in zip(g.verification_level, g.verification, g.verified)])


def cells_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (see the module docstring), in no particular order (`ranked_cells`)."""
    if runs.empty:
        return pd.DataFrame(columns=cell_columns())
    rows = []
    for key, g in seed_runs(runs).groupby(CELL_KEY, dropna=False, sort=False):
        g = g.assign(_s=g.seed.map(lambda x: math.inf if x is None or x != x else x)).sort_values("_s", kind="stable")
        asked = len(g)
        g = g[g.status != "skipped"]
        if g.empty:
            continue
        decided = f"decided after {len(g)} of {asked} seeds" if len(g) < asked else None
        sanities = list(g.sanity)
        k, n = sanities.count("PASS"), len(sanities)
        mean, lo, hi = logit_t_interval(g.peak_accuracy, LEVEL)
        _, t_lo, t_hi = t_interval(g.peak_accuracy, LEVEL)
        peaks = _present(g.peak_accuracy)
        sd = (math.sqrt(sum((x - mean) ** 2 for x in peaks) / (len(peaks) - 1)) if len(peaks) > 1 else math.nan)
        steps = _present(g.steps_to_target[g.sanity == "PASS"])
        statuses = Counter(g.status)
        rows.append({**dict(zip(CELL_KEY, key)), "sanity": verdict(sanities), "passes": f"{k}/{n}",
                     "pass_lower": clopper_pearson_lower(k, n, LEVEL), "evidence": pass_evidence(k, n),
                     "seeds": [None if x is None or x != x else int(x) for x in g.seed],
                     "status": ", ".join(st if c == 1 else f"{st} ×{c}" for st, c in statuses.items()),
                     "pass_rate": k / n, "peak_mean": mean, "peak_ci_lo": lo, "peak_ci_hi": hi,
                     "peak_t_lo": t_lo, "peak_t_hi": t_hi, "peak_sd": sd,
                     "steps_to_pass_median": _median(steps), "steps_to_pass_min": min(steps) if steps else math.nan,
                     "steps_to_pass_max": max(steps) if steps else math.nan,
                     "kl_k3_median": _median(_present(g.mean_kl)) if "mean_kl" in g else math.nan,
                     "router_flip_median": (_median(_present(g.mean_router_flip_frac))
                                            if "mean_router_flip_frac" in g else math.nan),
                     "n_seeds": n, "runs": list(g.run), "decided": decided,
                     "early": _early(g), "verification": _verification(g)})
    return pd.DataFrame(rows, columns=cell_columns())


def ranked_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Best first: cells that pass on every seed by median steps to pass, then the rest by pass
    rate and mean peak accuracy."""
    if cells.empty:
        return cells
    c = cells.copy()
    c["_pass"] = c.sanity == "PASS"
    c["_steps"] = c.steps_to_pass_median.where(c._pass)
    c = c.sort_values(["_pass", "_steps", "pass_rate", "peak_mean"], ascending=[False, True, False, False],
                      na_position="last", kind="stable")
    return c.drop(columns=["_pass", "_steps"]).reset_index(drop=True)


def by_staleness(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (cells or runs, ranked) grouped by staleness K, smallest first, each group in its
    ranked order (unchanged when every row has one K)."""
    if frame.empty or "staleness" not in frame.columns:
        return frame
    return frame.sort_values("staleness", kind="stable").reset_index(drop=True)


def fingerprint_configs(runs: pd.DataFrame) -> dict[str, dict]:
    """Settings fingerprint → the config of its newest run in `runs` (every run of a fingerprint has
    the same settings; they differ only in what the fingerprint leaves out)."""
    if runs.empty or "config" not in runs.columns:
        return {}
    r = with_cell_key(runs)
    r = r.sort_values("created_at", kind="stable") if "created_at" in r.columns else r
    return {fp: cfg for fp, cfg in zip(r.config_fp, r.config)}


def settings_spread(configs: dict[str, dict]) -> list[tuple[str, dict[str, object]]]:
    """The settings on which the named configs differ: `bench.configdiff.spread` without what
    the fingerprint leaves out (the seed, K, bookkeeping), so exactly what tells the cells apart."""
    from bench import configdiff
    from bench.fingerprint import NOT_SETTINGS

    return configdiff.spread(configs, ignore=NOT_SETTINGS)


def settings_label(fp: str, spread: list[tuple[str, dict[str, object]]], most: int = 3) -> str:
    """A fingerprint as a choice: its short form and its values of the settings that differ
    (`settings_spread` keyed by fingerprint), e.g. "cfg 1a2b3c: lr=0.0005, eval_every=5"."""
    from bench.fingerprint import short

    parts = [f"{k}={values.get(fp)}" for k, values in spread[:most]]
    more = f", +{len(spread) - most} more" if len(spread) > most else ""
    return f"cfg {short(fp)}" + (f": {', '.join(parts)}{more}" if parts else "")
