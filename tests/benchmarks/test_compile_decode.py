"""benchmarks/compile_decode.py's comparison of two rollouts: the share of samples drawn alike and
the largest |Δ μ| over the tokens both drew alike (a sample's common prefix only: past the first
token that differs, the two samples condition on other text)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("compile_decode", ROOT / "benchmarks" / "compile_decode.py")
cd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cd)


def _s(tokens, logprobs):
    return SimpleNamespace(token_ids=tokens, logprobs=logprobs)


def test_sample_distance_reads_only_the_common_prefix():
    eager = [[_s([1, 2, 3], [-0.1, -0.2, -0.3]), _s([4, 5], [-1.0, -2.0])],
             [_s([7, 8, 9], [-0.5, -0.5, -0.5])]]
    compiled = [[_s([1, 2, 3], [-0.1, -0.25, -0.3]), _s([4, 6], [-1.5, -9.0])],
                [_s([7, 8], [-0.5, -0.5])]]
    same, worst = cd.sample_distance(eager, compiled)
    # one of three samples has the same tokens; the second sample's first token moved by 0.5, and
    # its second (another token: -2.0 against -9.0) is not compared
    assert same == pytest.approx(1 / 3)
    assert worst == pytest.approx(0.5)


def test_sample_distance_stops_at_the_first_token_that_differs_and_takes_either_sign():
    # the tokens meet again at index 2 (3 against 3), but the texts before it differ: not compared;
    # the compiled log-probability above eager's counts as much as one below
    eager = [[_s([1, 2, 3], [-0.3, -0.5, -4.0])]]
    compiled = [[_s([1, 9, 3], [-0.1, -0.6, -1.0])]]
    same, worst = cd.sample_distance(eager, compiled)
    assert same == 0.0
    assert worst == pytest.approx(0.2)


def test_sample_distance_of_a_rollout_with_itself():
    out = [[_s([3, 1], [-0.7, -1.2]), _s([], [])]]
    assert cd.sample_distance(out, out) == (1.0, 0.0)
