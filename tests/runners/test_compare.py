"""`bench compare`: AdaStop's decisions on given score arrays (hand-derived from its permutation
boundaries), the scores of a run, and a comparison that reuses finished runs of a real store."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from typer.testing import CliRunner

from bench.cli import app
from bench.store import Run, open_store, session
from conftest import add_model_and_build
from runners.compare import Comparison, decide, parse_cell, score


def test_adastop_decisions_by_hand():
    # n = 2, K = 2, α = 0.05. Batch 1, A = [3, 4], B = [1, 2]: the 6 splits of {1, 2, 3, 4} give
    #   mean differences 2, −1, 0, 0, 1, −2; level α·1/2 = 0.025 < 1/6 admits only the largest, 2,
    #   as the boundary, and T = |3.5 − 1.5| = 2 is not above it: continue. Batch 2, A = [7, 8],
    #   B = [5, 6]: the 36 sums of two batches' differences, largest 4 (once), then 3 (twice); at
    #   level 0.05 the boundary is the second largest, 3 (P(T > 3) = 1/36 <= 0.05), and
    #   T = 2·|5.5 − 3.5| = 4 > 3: A larger, after 2 batches (4 seeds each).
    c = Comparison(2, 2, 0.05)
    assert c.add([3, 4], [1, 2]) == "continue" and not c.finished
    assert c.add([7, 8], [5, 6]) == "larger" and c.batches == 2
    assert decide([1, 2, 5, 6], [3, 4, 7, 8], 2, 2) == ("smaller", 2)
    # one batch of two cannot show anything at 5%: the observed split is 1 of 6 (p = 1/6)
    assert decide([3, 4], [1, 2], 2, 1) == ("equal", 1)
    # n = 5, K = 2: C(10, 5) = 252 splits, level 0.025 admits the 6 largest (6/252 = 0.0238); fully
    #   separated scores give the largest difference, above the 6th largest: larger at batch 1
    a, b = [0.95, 0.96, 0.97, 0.955, 0.965], [0.90, 0.91, 0.92, 0.905, 0.915]
    assert decide(a * 2, b * 2, 5, 2) == ("larger", 1)
    # the same scores in both cells: no split is above the observed 0, never rejected: equal at the end
    assert decide(a * 2, a * 2, 5, 2) == ("equal", 2)
    with pytest.raises(ValueError, match="decided already"):
        c.add([1, 2], [3, 4])


def test_scores_and_cell_specs():
    run = Run(status="converged", steps_to_target=45, peak_accuracy=0.97, step=45, config={"max_steps": 150})
    assert score(run, "peak") == 0.97 and score(run, "steps-to-pass") == 45
    failed = Run(status="plateaued", steps_to_target=30, peak_accuracy=0.91, step=120, config={"max_steps": 150})
    assert score(failed, "steps-to-pass") == 150          # censored at max_steps, not its single reading
    assert parse_cell("grpo:rollout=nvfp4,train=fp16") == ("grpo", "rollout=nvfp4,train=fp16")
    from bench.errors import ConfigError

    for bad in ("pg-seq-is", "nope:fp16", "pg-seq-is:fp17"):
        with pytest.raises(Exception) as e:
            parse_cell(bad)
        assert isinstance(e.value, (ConfigError, ValueError)), bad


def _finished(s, model_id, run_id, dtype, seed, peak):
    from runners.presets import get_preset

    s.add(Run(id=run_id, model_id=model_id, build_id="b0", algo="pg-seq-is", rollout_dtype=dtype, train_dtype=dtype,
              trainer="native", engine="torch", status="converged" if peak >= 0.95 else "max_steps", step=60,
              peak_accuracy=peak, steps_to_target=60 if peak >= 0.95 else None,
              config={"preset": "tiny", **asdict(get_preset("tiny", seed=seed))}))


def test_a_comparison_reuses_finished_runs(tmp_path):
    """Five finished seeds of each cell in the store: `bench compare` runs nothing, decides at
    the first batch, and names the runs it used; a sixth seed would have to be run."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    with session(open_store(url)) as s:
        mid = add_model_and_build(s, "b0")
        for i in range(5):
            _finished(s, mid, f"a{i}", "fp16", i, 0.96 + 0.004 * i)
            _finished(s, mid, f"b{i}", "bf16", i, 0.90 + 0.004 * i)
    r = CliRunner().invoke(app, ["compare", "pg-seq-is:fp16", "pg-seq-is:bf16", "--max-seeds", "10", "--batch", "5",
                                 "--device", "cpu", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["decision"], out["seeds_used"], out["batches"], out["level"]) == ("larger", 5, 1, 0.05)
    assert out["runs"] == {"pg-seq-is:fp16": [f"a{i}" for i in range(5)], "pg-seq-is:bf16": [f"b{i}" for i in range(5)]}
    assert out["means"]["pg-seq-is:fp16"] == pytest.approx(0.968)
    assert "skip pg-seq-is fp16 seed 4: finished as run a4" in r.stderr
    r = CliRunner().invoke(app, ["compare", "pg-seq-is:fp16", "pg-seq-is:bf16", "--device", "cpu", "--db", url])
    assert r.exit_code == 0 and "has the larger mean peak split accuracy" in r.stdout and "level 0.05" in r.stdout
    for args, needle in ((["pg-seq-is", "pg-seq-is:bf16"], "ALGO:DTYPE"), (["pg-seq-is:fp16"] * 2, "two different"),
                         (["pg-seq-is:fp16", "pg-seq-is:bf16", "--metric", "mean"], "--metric"),
                         (["pg-seq-is:fp16", "pg-seq-is:bf16", "--batch", "6", "--max-seeds", "5"], "--max-seeds")):
        r = CliRunner().invoke(app, ["compare", *args, "--device", "cpu", "--db", url])
        assert r.exit_code == 2 and needle in r.output, (args, r.output)
