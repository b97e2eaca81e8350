"""Mismatch metrics against hand-computed values."""

import math

import pytest
import torch

from bench.mismatch import kl_k1, kl_k2, kl_k3, log_ratio_slope, mismatch_metrics, prob_diff_stats, ratio_stats

LN = math.log


def batch():
    mu = torch.tensor([[LN(.5), LN(.4)], [LN(.2), LN(.9)]])
    pi = torch.tensor([[LN(.6), LN(.4)], [LN(.1), LN(.5)]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return mu, pi, mask


def test_kl_estimators_by_hand():
    mu, pi, mask = batch()
    assert kl_k1(mu, pi, mask) == pytest.approx(((LN(.5) - LN(.6)) + (LN(.2) - LN(.1))) / 2, rel=1e-5)
    d = [LN(.6 / .5), 0.0, LN(.1 / .2)]
    assert kl_k2(mu, pi, mask) == pytest.approx(sum(0.5 * x * x for x in d) / 3, rel=1e-5)
    assert kl_k3(mu, pi, mask) == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 3, rel=1e-5)


def test_prob_diff_signed_pi_minus_mu():
    s = prob_diff_stats(*batch())
    assert s["prob_diff_max"] == pytest.approx(0.1, abs=1e-6)
    assert s["prob_diff_min"] == pytest.approx(-0.1, abs=1e-6)
    assert s["prob_abs_diff_mean"] == pytest.approx(0.2 / 3, abs=1e-6)   # masked 0.9 → 0.5 ignored


def test_log_ratio_slope_recovers_a_line():
    lengths = torch.tensor([10, 20, 30, 40])
    mask = (torch.arange(40).unsqueeze(0) < lengths.unsqueeze(1)).float()
    mu = torch.zeros(4, 40)
    pi = torch.full((4, 40), -0.002)                    # −0.002 per token → −2 per 1k tokens
    slope, se = log_ratio_slope(mu, pi, mask)
    assert slope == pytest.approx(-2.0, rel=1e-4) and se == pytest.approx(0.0, abs=1e-6)
    assert log_ratio_slope(mu[:2], pi[:2], torch.ones(2, 40)) == (0.0, 0.0)


def test_ratio_stats_and_ess():
    s = ratio_stats(torch.log(torch.tensor([1.0, 3.0])), "w")
    assert (s["w_min"], s["w_mean"], s["w_max"]) == pytest.approx((1, 2, 3))
    assert s["w_ess"] == pytest.approx(16 / (2 * 10))


def test_identical_engines_give_zero_mismatch():
    mu = torch.log(torch.rand(3, 5))
    m = mismatch_metrics(mu, mu.clone(), torch.ones(3, 5))
    assert m["kl_k1"] == 0 and m["kl_k3"] == 0 and m["prob_abs_diff_mean"] == 0
    assert m["is_ratio_seq_ess"] == pytest.approx(1.0)
    assert m["kl_k1_bits"] == 0
