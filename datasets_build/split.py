"""Aggregate graded rollouts into per-problem accuracy, bucket each problem, and write the
perfectible split (a `datasets` dataset on disk + parquet + manifest) atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

KEPT, TOO_EASY, TOO_HARD, BAD_GOLD = "kept", "too_easy", "too_hard", "bad_gold"
BUCKETS = (KEPT, TOO_EASY, TOO_HARD, BAD_GOLD)


def bucket(accuracy: float | None, lo: float, hi: float) -> str:
    """kept when lo ≤ accuracy ≤ hi (both ends inclusive); bad_gold when there is no accuracy."""
    if accuracy is None:
        return BAD_GOLD
    if accuracy < lo:
        return TOO_HARD
    if accuracy > hi:
        return TOO_EASY
    return KEPT


@dataclass
class ProblemResult:
    id: str
    problem: str
    answer: str
    position: int
    n_samples: int
    n_correct: int
    accuracy: float | None
    bucket: str


def bucket_counts(results: list[ProblemResult]) -> dict[str, int]:
    return {b: sum(r.bucket == b for r in results) for b in BUCKETS}


def write_split(out_dir: Path, results: list[ProblemResult], k: int, manifest: dict) -> Path:
    """Write `split/` (datasets.save_to_disk), `split.parquet`, `problems.parquet` (every
    problem with its bucket) and `manifest.json` into `out_dir`, replacing it atomically."""
    import datasets
    import pandas as pd

    datasets.disable_progress_bars()          # the build has its own progress bar
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        kept = [r for r in results if r.bucket == KEPT]
        cols = {"id": [r.id for r in kept], "problem": [r.problem for r in kept],
                "answer": [r.answer for r in kept], "accuracy": [float(r.accuracy) for r in kept],
                "k": [k] * len(kept)}
        features = datasets.Features({"id": datasets.Value("string"), "problem": datasets.Value("string"),
                                      "answer": datasets.Value("string"), "accuracy": datasets.Value("float64"),
                                      "k": datasets.Value("int64")})
        ds = datasets.Dataset.from_dict(cols, features=features)
        ds.save_to_disk(str(tmp / "split"))
        ds.to_parquet(str(tmp / "split.parquet"))
        pd.DataFrame([r.__dict__ for r in results]).to_parquet(tmp / "problems.parquet", index=False)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
