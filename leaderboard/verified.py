"""What the pages say about `bench runs verify` (runners/verify.py): a run's latest verification
in words ("verified 3 steps, bit-identical"). Pure functions of `queries.verifications_frame`;
what the verifications establish, run and cell, is bench/verification.py's level."""

from __future__ import annotations

import json

import pandas as pd

NOT_VERIFIED = "not verified"


def latest(verifications: pd.DataFrame) -> dict[str, dict]:
    """The newest verification of each run, by run id."""
    if verifications.empty:
        return {}
    v = verifications.sort_values("created_at", ascending=False, kind="stable").drop_duplicates("run")
    return {r["run"]: r for r in v.to_dict("records")}


def _first(v: dict) -> dict:
    d = v.get("first_difference")
    if isinstance(d, str):
        try:
            d = json.loads(d)
        except ValueError:
            d = None
    return d if isinstance(d, dict) else {}


def run_text(v: dict | None) -> str:
    """"verified 3 steps, bit-identical", "verified 3 steps within rel 1e-3 / abs 1e-6 (…)",
    "verify FAILED at step 2 (reward)" (", re-run on another device or CPU kind" where the run
    recorded another: a looser check, whose failure alone does not show tampering), or "not
    verified"."""
    if not v:
        return NOT_VERIFIED
    steps = int(v["steps"])
    if v["verdict"] == "differs":
        d = _first(v)
        elsewhere = "" if v.get("tolerance") is None else ", re-run on another device or CPU kind"
        return f"verify FAILED at step {d.get('step', '?')} ({d.get('metric', '?')}{elsewhere})"
    if v["verdict"] == "within-tolerance":
        return f"verified {steps} steps within {v.get('tolerance')}"
    return f"verified {steps} steps, bit-identical" + digests_text(v)


def digests_text(v: dict) -> str:
    """"; state digests not comparable (scheme 1)" where a bit-identical re-run could not compare
    the run's state digests (runners/verify_compare.py), else ""."""
    note = v.get("digests")
    return f"; state digests {note}" if isinstance(note, str) and note.startswith("not comparable") else ""
