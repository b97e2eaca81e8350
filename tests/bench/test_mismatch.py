"""Mismatch metrics against hand-computed values."""

import math

import pytest
import torch

from bench.mismatch import (chi2_seq, chi2_token, kl_k1, kl_k1_token, kl_k2, kl_k3, log_ratio_slope, mismatch_metrics,
                            perplexity_stats, prob_diff_stats, ratio_stats)

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
    assert s["prob_abs_diff_max"] == pytest.approx(0.1, abs=1e-6)


def batch23():
    """2 × 3, the last token of row 1 masked (its 0.9 → 0.1 must not count).
    μ = [[.5, .25, .5], [.2, .5, .9]],  π = [[.5, .5, .25], [.4, .5, .1]]
    log π − log μ on the 5 tokens: row 0: 0, ln2, −ln2;  row 1: ln2, 0."""
    mu = torch.log(torch.tensor([[.5, .25, .5], [.2, .5, .9]]))
    pi = torch.log(torch.tensor([[.5, .5, .25], [.4, .5, .1]]))
    return mu, pi, torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_verls_offpolicy_metrics_by_hand():
    mu, pi, mask = batch23()
    L2 = LN(2)
    # per token: mean(log μ − log π) = (0 − ln2 + ln2 − ln2 + 0) / 5;  kl_k1 sums per sequence: (0 + −ln2) / 2
    assert kl_k1_token(mu, pi, mask) == pytest.approx(-L2 / 5, rel=1e-6)
    assert kl_k1(mu, pi, mask) == pytest.approx(-L2 / 2, rel=1e-6)
    # ρ_t = π/μ = 1, 2, ½, 2, 1 → mean ρ² = (1 + 4 + ¼ + 4 + 1) / 5 = 2.05
    assert chi2_token(mu, pi, mask) == pytest.approx(1.05, rel=1e-6)
    # sequence ρ = 1·2·½ = 1 and 2·1 = 2 → mean ρ² = (1 + 4) / 2 = 2.5
    assert chi2_seq(mu, pi, mask) == pytest.approx(1.5, rel=1e-6)
    p = perplexity_stats(mu, pi, mask)
    # ℓπ = mean_t log π: row 0 (−ln2 − ln2 − 2ln2)/3 = −4ln2/3, row 1 (ln .4 + ln .5)/2 = ln(.2)/2
    # ℓμ: row 0 (−ln2 − 2ln2 − ln2)/3 = −4ln2/3, row 1 (ln .2 + ln .5)/2 = ln(.1)/2
    assert p["ppl_training"] == pytest.approx((2 ** (4 / 3) + math.sqrt(5)) / 2, rel=1e-6)
    assert p["log_ppl_training"] == pytest.approx((4 * L2 / 3 + LN(5) / 2) / 2, rel=1e-6)
    assert p["ppl_rollout"] == pytest.approx((2 ** (4 / 3) + math.sqrt(10)) / 2, rel=1e-6)
    assert p["log_ppl_rollout"] == pytest.approx((4 * L2 / 3 + LN(10) / 2) / 2, rel=1e-6)
    # d = ℓμ − ℓπ = 0 and (ln .1 − ln .2)/2 = −ln2/2
    assert p["log_ppl_diff"] == pytest.approx(-L2 / 4, rel=1e-6)
    assert p["log_ppl_diff"] == pytest.approx(p["log_ppl_training"] - p["log_ppl_rollout"], rel=1e-6)
    assert p["log_ppl_abs_diff"] == pytest.approx(L2 / 4, rel=1e-6)
    assert (p["log_ppl_diff_max"], p["log_ppl_diff_min"]) == pytest.approx((0.0, -L2 / 2), abs=1e-7)
    assert p["ppl_ratio"] == pytest.approx((1 + 2 ** -0.5) / 2, rel=1e-6)    # mean exp(d)
    # |π − μ| = 0, .25, .25, .2, 0: mean .14, max .25, unbiased std √(.067/4)
    s = prob_diff_stats(mu, pi, mask)
    assert s["prob_abs_diff_mean"] == pytest.approx(0.14, rel=1e-6)
    assert s["prob_abs_diff_max"] == pytest.approx(0.25, rel=1e-6)
    assert s["prob_abs_diff_std"] == pytest.approx(math.sqrt(0.067 / 4), rel=1e-6)
    assert (s["prob_diff_max"], s["prob_diff_min"]) == pytest.approx((0.25, -0.25), rel=1e-6)   # signed π − μ
    m = mismatch_metrics(mu, pi, mask)
    assert {k: m[k] for k in p} == pytest.approx(p) and m["kl_k1_token"] == pytest.approx(-L2 / 5, rel=1e-6)
    assert m["chi2_token"] == pytest.approx(1.05, rel=1e-6) and m["chi2_seq"] == pytest.approx(1.5, rel=1e-6)


def test_a_sequence_without_tokens_counts_as_verls_masked_mean_does():
    """verl's per-sequence masked_mean of an empty row is 0: ppl 1, log-ppl diff 0, ρ_seq 1."""
    mu, pi, mask = batch23()
    mu3, pi3 = torch.cat([mu, mu[:1]]), torch.cat([pi, pi[:1] - 1.0])
    mask3 = torch.cat([mask, torch.zeros(1, 3)])
    p2, p3 = perplexity_stats(mu, pi, mask), perplexity_stats(mu3, pi3, mask3)
    assert p3["ppl_training"] == pytest.approx((2 * p2["ppl_training"] + 1) / 3, rel=1e-6)
    assert p3["log_ppl_diff"] == pytest.approx(2 * p2["log_ppl_diff"] / 3, rel=1e-6)
    assert p3["ppl_ratio"] == pytest.approx((2 * p2["ppl_ratio"] + 1) / 3, rel=1e-6)
    assert chi2_seq(mu3, pi3, mask3) == pytest.approx((1 + 4 + 1) / 3 - 1, rel=1e-6)
    assert chi2_token(mu3, pi3, mask3) == pytest.approx(1.05, rel=1e-6)
    assert kl_k1_token(mu3, pi3, mask3) == pytest.approx(-LN(2) / 5, rel=1e-6)


def test_chi2_clamps_the_log_ratio_at_20():
    mu = torch.zeros(1, 30)
    pi = torch.full((1, 30), 1.0)                       # Σ log ρ = 30 → clamped to 20; each ρ_t = e
    mask = torch.ones(1, 30)
    assert chi2_seq(mu, pi, mask) == pytest.approx(math.exp(40) - 1, rel=1e-9)
    assert chi2_token(mu, pi, mask) == pytest.approx(math.exp(2) - 1, rel=1e-6)
    assert chi2_token(mu, mu + 25.0, torch.ones(1, 30)) == pytest.approx(math.exp(40) - 1, rel=1e-6)


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
    assert m["kl_k1_token"] == 0 and m["chi2_token"] == 0 and m["chi2_seq"] == 0 and m["prob_abs_diff_max"] == 0
    assert m["log_ppl_diff"] == 0 and m["log_ppl_abs_diff"] == 0 and m["ppl_ratio"] == pytest.approx(1.0)
    assert m["ppl_training"] == pytest.approx(m["ppl_rollout"])


def test_empty_batch():
    m = mismatch_metrics(torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, 4))
    assert m["kl_k1_token"] == 0 and m["chi2_seq"] == 0 and m["ppl_ratio"] == 1 and m["prob_abs_diff_std"] == 0
    m = mismatch_metrics(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(2, 4))   # no response token at all
    assert m["kl_k1_token"] == 0 and m["chi2_token"] == 0 and m["ppl_training"] == 1 and m["log_ppl_diff"] == 0


def test_empty_batch_gives_the_documented_neutral_values():
    """Nothing sampled: every divergence 0, every perplexity and ratio 1 (exactly, key by key)."""
    m = mismatch_metrics(torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, 4))
    ones = {"ppl_training", "ppl_rollout", "ppl_ratio"} | {f"is_ratio_{k}_{s}" for k in ("seq", "token")
                                                           for s in ("min", "mean", "max", "ess")}
    assert m == {k: (1.0 if k in ones else 0.0) for k in m}
    assert len(m) == 32


def test_kl_k1_bits_and_standard_error_by_hand():
    # per-sequence Σ(log μ − log π): batch23 row 0: 0 − ln2 + ln2 = 0, row 1: −ln2 + 0 = −ln2
    #   kl_k1 = −ln2/2 nats = −0.5 bits; unbiased std of (0, −ln2) = ln2/√2, / √2 sequences = ln2/2
    mu, pi, mask = batch23()
    m = mismatch_metrics(mu, pi, mask)
    assert m["kl_k1_bits"] == pytest.approx(-0.5, rel=1e-6)
    assert m["kl_k1_stderr"] == pytest.approx(LN(2) / 2, rel=1e-6)
    assert mismatch_metrics(mu[:1], pi[:1], mask[:1])["kl_k1_stderr"] == 0.0        # one sequence: no spread
    # the sequence IS ratios ρ_i = e^{Σ log π − log μ} = 1 and 2 (padding ignored, whatever it holds)
    pi_pad = pi.clone()
    pi_pad[1, 2] = 50.0
    m = mismatch_metrics(mu, pi_pad, mask)
    assert (m["is_ratio_seq_min"], m["is_ratio_seq_mean"], m["is_ratio_seq_max"]) == pytest.approx((1.0, 1.5, 2.0))
    assert m["is_ratio_seq_ess"] == pytest.approx(9 / (2 * 5))                       # (Σw)² / (N Σw²)
    assert m["is_ratio_token_max"] == pytest.approx(2.0) and m["is_ratio_token_min"] == pytest.approx(0.5)


def test_single_token_rows_and_a_single_token():
    # a row with one token: its perplexity is that token's, e.g. π = ¼ → ppl 4 (no clamp bites at 1 token)
    mu, pi = torch.log(torch.tensor([[0.5, 0.5]])), torch.log(torch.tensor([[0.25, 0.9]]))
    mask = torch.tensor([[1.0, 0.0]])
    p = perplexity_stats(mu, pi, mask)
    assert p["ppl_training"] == pytest.approx(4.0) and p["ppl_rollout"] == pytest.approx(2.0)
    # |Δp| of one token has no spread: std 0 (not the NaN of an unbiased std of one value)
    s = prob_diff_stats(mu, pi, mask)
    assert s["prob_abs_diff_std"] == 0.0 and s["prob_abs_diff_mean"] == pytest.approx(0.25)
    # two tokens: |Δp| = 0.25, 0.4 → unbiased std |0.25 − 0.4| / √2
    s = prob_diff_stats(mu, pi, torch.ones(1, 2))
    assert s["prob_abs_diff_std"] == pytest.approx(0.15 / math.sqrt(2), rel=1e-6)


def test_log_ratio_slope_and_its_standard_error_by_hand():
    # lengths x = 1, 2, 3, log-ratios y = 0, 1, 0 (nats, per sequence): slope 0 per token, residuals
    #   −⅓, ⅔, −⅓, Σr² = ⅔, se = √(⅔ / (3 − 2) / 2) = 0.57735 per token → ×1000 per 1k tokens
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 0], [1, 1, 1]])
    mu = torch.zeros(3, 3)
    pi = torch.tensor([[0.0, 0, 0], [0.5, 0.5, 0], [0, 0, 0]])
    slope, se = log_ratio_slope(mu, pi, mask)
    assert slope == pytest.approx(0.0, abs=1e-9) and se == pytest.approx(1000 * math.sqrt(1 / 3), rel=1e-6)
    # y = 0, 1, 3 for x = 1, 2, 3: slope 1.5 per token, residuals 1/6, −1/3, 1/6, se = √(1/6 / 2) = 0.288675
    pi[2] = 1.0
    slope, se = log_ratio_slope(mu, pi, mask)
    assert slope == pytest.approx(1500.0, rel=1e-6) and se == pytest.approx(1000 * math.sqrt(1 / 12), rel=1e-6)
    # the same log-ratios from log μ = −1 everywhere: only π − μ counts
    assert log_ratio_slope(mu - 1.0, pi - 1.0, mask) == pytest.approx((slope, se), rel=1e-6)
    # fewer than 3 sequences, or lengths that do not vary: no slope
    assert log_ratio_slope(mu[1:], pi[1:], mask[1:]) == (0.0, 0.0)
    assert log_ratio_slope(mu, pi, torch.ones(3, 3)) == (0.0, 0.0)
    # 4 sequences, x = 1..4, y = 0, 1, 0, 1: x̄ 2.5, ȳ 0.5, Sxx 5, Sxy 1, slope 0.2; residuals
    #   −0.2, 0.6, −0.6, 0.2, Σr² = 0.8, se = √(0.8 / (4 − 2) / 5) = 0.282843
    mask4 = (torch.arange(4) < torch.arange(1, 5).unsqueeze(1)).float()
    pi4 = torch.zeros(4, 4)
    pi4[1, 0] = pi4[3, 0] = 1.0
    assert log_ratio_slope(torch.zeros(4, 4), pi4, mask4) == pytest.approx((200.0, 1000 * math.sqrt(0.08)), rel=1e-6)


def test_ratio_stats_clamp_the_log_ratio_at_20():
    s = ratio_stats(torch.tensor([25.0, 0.0, -25.0]), "w")
    assert (s["w_max"] == pytest.approx(math.exp(20), rel=1e-12)
            and s["w_min"] == pytest.approx(math.exp(-20), rel=1e-12))


def test_length_buckets_by_hand():
    """Three sequences of lengths 2, 3 and 20 (edges 0, 4, 16): log ρ = log π − log μ per token."""
    import math

    import torch

    from bench.mismatch import length_buckets

    mu = torch.zeros(3, 20)
    pi = torch.zeros(3, 20)
    mask = torch.zeros(3, 20)
    mask[0, :2] = 1
    pi[0, :2] = torch.tensor([0.1, -0.1])           # ℓ = 0
    mask[1, :3] = 1
    pi[1, :3] = torch.tensor([0.2, 0.2, 0.2])       # ℓ = 0.6
    mask[2, :] = 1
    pi[2, :] = -0.05                                # ℓ = -1.0
    pi[0, 5] = 9.0                                  # off the mask: ignored
    got = length_buckets(mu, pi, mask, edges=(0, 4, 16))
    k3 = lambda d: math.expm1(d) - d                # noqa: E731
    assert [(b["min_len"], b["max_len"], b["sequences"], b["tokens"]) for b in got] == [(0, 4, 2, 5), (16, None, 1, 20)]
    a, b = got
    assert math.isclose(a["k3"], (k3(0.1) + k3(-0.1) + 3 * k3(0.2)) / 5, rel_tol=1e-6)   # fp32 inputs
    assert math.isclose(a["seq_log_ratio_mean"], 0.3, rel_tol=1e-6)
    assert math.isclose(a["seq_log_ratio_var"], 0.09, rel_tol=1e-5)        # population variance of {0, 0.6}
    assert math.isclose(a["abs_log_w"], 0.3, rel_tol=1e-6)
    assert math.isclose(b["k3"], k3(-0.05), rel_tol=1e-6)
    assert math.isclose(b["seq_log_ratio_mean"], -1.0, rel_tol=1e-5) and b["seq_log_ratio_var"] == 0.0
    assert length_buckets(mu, pi, torch.zeros(3, 20)) == []                 # empty responses: no bucket
