"""The closing summary of `bench report`: which cells pass, why each run ended (stop reason,
the step of the KL early warning), and the mismatch ratios — median KL k3 of the bf16 cell
over the fp16 cell of the same algorithm on the same build (with the same trainer, engine,
staleness and settings fingerprint: the two cells differ only by their precision pair), and
the same ratio from the offline reports of `bench mismatch` measured under the same conditions
when the store has both. Pure functions of the frames `bench report` already reads
(`cells_frame`, `runs_frame`, `mismatch_frame`), except `report_data`, which reads them once for
`bench report` and the static site alike."""

from __future__ import annotations

import json
import math

import pandas as pd

RATIO = ("bf16", "fp16")        # numerator, denominator: the paper's contrast


def _num(x) -> float | None:
    """A finite float, else None (NaN, None and pandas' NA read as missing)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _int(x) -> int | None:
    x = _num(x)
    return None if x is None else int(x)


def _text(x) -> str | None:
    return x if isinstance(x, str) and x else None


def _ratio(a, b) -> float | None:
    a, b = _num(a), _num(b)
    return a / b if a is not None and b is not None and b > 0 and a >= 0 else None


def _ended(runs: pd.DataFrame, run_ids: list[str]) -> list[dict]:
    by_id = runs.set_index("run") if not runs.empty else runs
    out = []
    for rid in run_ids:
        if rid not in by_id.index:
            continue
        r = by_id.loc[rid]
        out.append({"run": rid, "seed": _int(r.get("seed")), "status": _text(r.get("status")),
                    "verdict": _text(r.get("sanity")), "decided_by": _text(r.get("decided_by")),
                    "decided_step": _int(r.get("decided_step")),
                    "stop_reason": _text(r.get("stop_reason")), "steps": _int(r.get("steps")),
                    "steps_to_pass": _int(r.get("steps_to_target")) if r.get("sanity") == "PASS" else None,
                    "kl_warning_step": _int(r.get("kl_warning_step")),
                    "projection": _text(r.get("projection")), "evidence_problem": _text(r.get("evidence_problem"))})
    return out


def mismatch_ratios(cells: pd.DataFrame) -> list[dict]:
    """bf16 over fp16 median KL k3 for every (model, build, trainer, engine, staleness K, settings
    fingerprint, algorithm) with both cells: the two cells differ only by their precision pair."""
    if cells.empty:
        return []
    num, den = RATIO
    out = []
    cells = cells.assign(staleness=cells.staleness if "staleness" in cells.columns else 0,
                         engine=cells.engine if "engine" in cells.columns else None,
                         config_fp=cells.config_fp if "config_fp" in cells.columns else None)
    keys = ["model", "build", "trainer", "engine", "staleness", "config_fp", "algo"]
    for (model, build, trainer, engine, k, fp, algo), g in cells.groupby(keys, sort=True, dropna=False):
        kl = dict(zip(g.precision, g.kl_k3_median))
        if num in kl and den in kl:
            out.append({"model": model, "build": build, "trainer": trainer, "engine": _text(engine),
                        "staleness": int(k), "config_fp": _text(fp), "algo": algo,
                        f"kl_k3_{num}": _num(kl[num]), f"kl_k3_{den}": _num(kl[den]),
                        "ratio": _ratio(kl[num], kl[den])})
    return out


# what an offline report's numbers depend on besides its pair (runners/offline_mismatch.conditions)
CONDITIONS = ("model", "source", "engine", "limit", "n", "max_tokens", "device", "cpu_16bit", "attention")


def _condition(v):
    """A condition's value as JSON gives it: None for a missing one, an int for a count."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return int(v) if isinstance(v, float) and v.is_integer() else (v.item() if hasattr(v, "item") else v)


def offline_ratios(mismatch: pd.DataFrame | None) -> list[dict]:
    """bf16/bf16 over fp16/fp16 from the newest offline report of each set of conditions (model,
    source, engine, limit, n, max_tokens, device, CPU 16-bit kernel path, decode attention): two
    reports pair only when every condition is the same. Reports that recorded no conditions (from before they were
    stored: no engine) are never paired."""
    if mismatch is None or mismatch.empty or "kl_k3" not in mismatch.columns or "engine" not in mismatch.columns:
        return []
    num, den = RATIO
    if "attention" not in mismatch.columns:             # a frame from before the decode attention was recorded
        mismatch = mismatch.assign(attention=None)
    m = mismatch[(mismatch.rollout_dtype == mismatch.train_dtype) & mismatch.rollout_dtype.isin(RATIO)
                 & mismatch.engine.notna()]
    if "created_at" in m.columns:
        m = m.sort_values("created_at", kind="stable")
    out = []
    for key, g in m.groupby(list(CONDITIONS), sort=True, dropna=False):
        newest = g.groupby("rollout_dtype").tail(1).set_index("rollout_dtype")
        if num in newest.index and den in newest.index:
            a, b = newest.loc[num], newest.loc[den]
            row = {**{c: _condition(v) for c, v in zip(CONDITIONS, key)},
                   f"kl_k3_{num}": _num(a.kl_k3), f"kl_k3_{den}": _num(b.kl_k3), "ratio": _ratio(a.kl_k3, b.kl_k3)}
            if "kl_k1" in newest.columns:
                row.update({f"kl_k1_{num}": _num(a.kl_k1), f"kl_k1_{den}": _num(b.kl_k1),
                            "ratio_k1": _ratio(a.kl_k1, b.kl_k1)})
            out.append(row)
    return out


def report_data(store, frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, dict, dict]:
    """What `bench report` and the static site show of the runs `frame` (`runs_frame`) of `store`:
    the ranked cells, the ranked runs, the summary and the paper's published rows for the same cells."""
    from bench.problems import paper_reference

    from .cells import by_staleness, cells_frame, ranked_cells
    from .queries import mismatch_frame, ranked, report_columns
    from .reference import matching_rows, paper_offline_mismatch

    cells = by_staleness(ranked_cells(cells_frame(frame)))
    try:
        mismatch = mismatch_frame(store)
    except Exception:                 # a store from before mismatch reports: no offline ratios
        mismatch = None
    ref = paper_reference()
    hit, others = matching_rows(zip(cells.algo, cells.precision))
    reference = {"source": ref.get("source"), "rows": hit, "others": others,
                 "offline_mismatch": paper_offline_mismatch(ref)}
    runs = by_staleness(ranked(frame)[report_columns()]) if not frame.empty else frame
    return cells, runs, report_summary(cells, frame, mismatch), reference


def records(df: pd.DataFrame) -> list[dict]:
    """A frame as JSON records (15 significant digits), [] for an empty one."""
    return json.loads(df.to_json(orient="records", double_precision=15)) if not df.empty else []


def report_summary(cells: pd.DataFrame, runs: pd.DataFrame, mismatch: pd.DataFrame | None = None) -> dict:
    """{"cells", "pass", "fail", "undecided", "running": counts; "per_cell": verdict, passes and
    what they support, status and each run's ending; "mismatch_ratios"; "offline_mismatch_ratios"}
    for the ranked cells."""
    per_cell = [{"algo": c.algo, "precision": c.precision, "build": c.build, "trainer": c.trainer,
                 "engine": _text(getattr(c, "engine", None)), "config_fp": _text(getattr(c, "config_fp", None)),
                 "staleness": _int(getattr(c, "staleness", 0)) or 0,
                 "sanity": c.sanity, "passes": c.passes, "pass_lower": _num(getattr(c, "pass_lower", None)),
                 "evidence": _text(getattr(c, "evidence", None)), "status": c.status,
                 "decided": getattr(c, "decided", None),
                 "steps_to_pass_median": _num(c.steps_to_pass_median),
                 "kl_k3_median": _num(c.kl_k3_median), "runs": _ended(runs, list(c.runs))}
                for c in cells.itertuples()]
    verdicts = [c["sanity"] for c in per_cell]
    return {"cells": len(per_cell), "pass": verdicts.count("PASS"), "fail": verdicts.count("FAIL"),
            "undecided": verdicts.count("UNDECIDED"), "running": verdicts.count("RUNNING"), "per_cell": per_cell,
            "mismatch_ratios": mismatch_ratios(cells), "offline_mismatch_ratios": offline_ratios(mismatch)}


def conditions_text(row: dict) -> str:
    """An offline ratio's conditions in words: "torch, 100 problems × n 32, ≤64 tokens, cpu (16-bit
    path none)"."""
    limit = "all problems" if row.get("limit") is None else f"{row['limit']} problems"
    where = str(row.get("device"))
    if row.get("cpu_16bit") is not None:
        where += f" (16-bit path {row['cpu_16bit']})"
    engine = row.get("engine")
    if row.get("attention") is not None:
        engine = f"{engine} ({row['attention']} attention)"
    return f"{engine}, {limit} × n {row.get('n')}, ≤{row.get('max_tokens')} tokens, {where}"


def ratio_text(r: float | None) -> str:
    return "–" if r is None else f"{r:.3g}×"
