"""benchmarks/equivalence.py's rules against hand-made rows: a number of the offline table holds
within its standard error or ±15%, the bf16 ÷ fp16 ratio within ±15%, a cell's seeds by an exact
permutation test and an unchanged verdict; a revision that names nothing is bad input."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("equivalence", ROOT / "benchmarks" / "equivalence.py")
eq = importlib.util.module_from_spec(_spec)
sys.modules["equivalence"] = eq
_spec.loader.exec_module(eq)


def test_a_number_holds_within_its_standard_error_or_15_percent():
    assert eq.moved_ok(1.0, 1.15, se=0.0)                  # +15%: on the line, holds
    assert not eq.moved_ok(1.0, 1.16, se=0.0)              # +16%
    assert eq.moved_ok(1.0, 1.3, se=0.31)                  # 30% but inside one standard error
    assert not eq.moved_ok(1.0, 1.3, se=0.3)               # exactly one standard error is not less
    assert eq.moved_ok(-2.0, -1.75, se=0.0)                # the tolerance is on |before|
    assert eq.moved_ok(0.0, 1e-14, se=2e-14) and not eq.moved_ok(0.0, 1e-14, se=0.0)


def _row(rollout, train, k1, se, k3):
    return {"rollout": rollout, "train": train, "kl_k1": k1, "kl_k1_stderr": se, "kl_k3": k3}


def test_the_offline_table_moves_pair_by_pair_and_the_ratio_within_15_percent():
    before = [_row("bf16", "bf16", 1e-4, 1e-5, 5.6e-6), _row("fp16", "fp16", 2e-6, 1e-6, 1e-7),
              _row("fp8", "fp16", 3e-3, 1e-4, 2e-4)]
    after = [_row("bf16", "bf16", 1.2e-4, 1e-5, 6.0e-6), _row("fp16", "fp16", 3.5e-6, 2e-6, 1.1e-7),
             _row("nvfp4", "fp16", 1e-2, 1e-3, 9e-3)]
    rows = {r["check"]: r for r in eq.mismatch_moves(before, after)}
    # bf16: +20% > 15% and 2e-5 ≥ the larger se 1e-5 → moved
    assert rows["mismatch bf16/bf16"]["ok"] is False and rows["mismatch bf16/bf16"]["se"] == 1e-5
    # fp16: +75%, but 1.5e-6 < se 2e-6 (after's, the larger) → holds
    assert rows["mismatch fp16/fp16"]["ok"] is True
    # a pair on one side only fails, whichever side
    assert rows["mismatch fp8/fp16"]["ok"] is False and rows["mismatch nvfp4/fp16"]["ok"] is False
    # k3 ratio 56 → 54.5454…: −2.6% holds
    ratio = rows["mismatch bf16÷fp16 k3"]
    assert ratio["before"] == pytest.approx(56.0) and ratio["after"] == pytest.approx(6.0 / 0.11) and ratio["ok"]
    after[0]["kl_k3"] = 7.0e-6                               # 7e-6 / 1.1e-7 = 63.6: +13.6% holds
    assert {r["check"]: r for r in eq.mismatch_moves(before, after)}["mismatch bf16÷fp16 k3"]["ok"]
    after[0]["kl_k3"] = 7.2e-6                               # 65.5: +16.9% does not
    assert not {r["check"]: r for r in eq.mismatch_moves(before, after)}["mismatch bf16÷fp16 k3"]["ok"]


def _runs(precision, steps, peaks):
    return [{"precision": precision, "steps": s, "peak_accuracy": p} for s, p in zip(steps, peaks)]


def test_a_cells_seeds_hold_by_a_permutation_test_and_its_verdict():
    fp16_b = _runs("fp16", [55, 60, 50, 65, 55], [0.96, 0.955, 0.962, 0.958, 0.96])
    fp16_a = _runs("fp16", [60, 55, 55, 60, 50], [0.958, 0.96, 0.957, 0.962, 0.959])   # single seeds moved
    nv_b = _runs("nvfp4→fp16", [95, 90, 100, 95, 90], [0.90, 0.91, 0.89, 0.905, 0.90])
    nv_a = _runs("nvfp4→fp16", [140, 145, 150, 150, 145], [0.90, 0.91, 0.89, 0.905, 0.90])  # decides later
    rows = {r["check"]: r for r in eq.seed_cells(fp16_b + nv_b, fp16_a + nv_a,
                                                 ({"fp16": "PASS", "nvfp4→fp16": "FAIL"},
                                                  {"fp16": "PASS", "nvfp4→fp16": "UNDECIDED"}))}
    assert all(rows[f"seeds fp16 {k}"]["ok"] for k in ("steps", "peak_accuracy", "verdict"))
    # every after-seed ran longer than every before-seed: p = 2/252 < 0.05
    assert rows["seeds nvfp4→fp16 steps"]["p"] == pytest.approx(2 / 252) and not rows["seeds nvfp4→fp16 steps"]["ok"]
    assert rows["seeds nvfp4→fp16 peak_accuracy"]["p"] == 1.0                      # the same peaks
    assert rows["seeds nvfp4→fp16 verdict"] == {"check": "seeds nvfp4→fp16 verdict", "ok": False,
                                                "before": "FAIL", "after": "UNDECIDED"}
    # a cell with no finished run on one side holds nothing
    only = {r["check"]: r for r in eq.seed_cells(fp16_b, [], ({"fp16": "PASS"}, {}))}
    assert not any(r["ok"] for r in only.values())


def test_a_revision_that_names_nothing_is_bad_input(tmp_path, capsys):
    assert eq.main(["HEAD", "no-such-revision-xyz", "--out", str(tmp_path / "eq")]) == 2
    assert "'no-such-revision-xyz' is neither a revision" in capsys.readouterr().err
    assert eq.main(["HEAD", "HEAD", "--parts", "calibration,speed", "--out", str(tmp_path / "eq")]) == 2
    assert eq.main(["HEAD", "HEAD", "--parts", "seeds", "--seeds", "1", "--out", str(tmp_path / "eq")]) == 2
    assert not (tmp_path / "eq").exists()                   # nothing written
