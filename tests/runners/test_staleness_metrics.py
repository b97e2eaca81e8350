"""The staleness metrics by hand (runners/staleness.py: k3 of KL[π_old‖π_θ] and mean |π_θ − π_old|
over the sampled tokens), on two tokens whose k3 differs by direction, a third masked out."""

import math

import pytest
import torch

from runners.staleness import NO_STALENESS, staleness_metrics


def test_staleness_metrics_by_hand():
    # token 1: π_old 0.5 → π_θ 0.25, d = log π_θ − log π_old = −ln 2:
    #   k3 = e^d − 1 − d = 0.5 − 1 + 0.693147 = 0.193147 (the reverse direction, d = +ln 2: 0.306853)
    # token 2: π_old = π_θ = 0.2, d = 0: k3 = 0, |Δp| = 0
    # token 3: masked out (π_old 0.9, π_θ 0.1)
    logp_old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    logp_cur = torch.log(torch.tensor([[0.25, 0.2, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    m = staleness_metrics(logp_old, logp_cur, mask)
    assert m["staleness_kl_k3"] == pytest.approx((0.5 - 1 + math.log(2)) / 2, rel=1e-6)     # 0.096574
    assert m["staleness_abs_dp"] == pytest.approx((0.5 - 0.25) / 2, rel=1e-6)               # 0.125
    assert m.keys() == NO_STALENESS.keys()
    # no staleness, no metric
    assert staleness_metrics(logp_old, logp_old, mask) == NO_STALENESS


def test_staleness_metrics_ignore_gradients_and_16_bit_inputs():
    logp_old = torch.log(torch.tensor([[0.5, 0.2]])).to(torch.bfloat16)
    logp_cur = torch.log(torch.tensor([[0.25, 0.2]])).requires_grad_(True)
    m = staleness_metrics(logp_old, logp_cur, torch.ones(1, 2, dtype=torch.bool))
    # bf16 log 0.5 = −0.69140625, log 0.2 = −1.609375: d = −0.69315 + 0.69141 = −0.00174, 0.000063
    d = [math.log(0.25) - float(torch.tensor(math.log(0.5)).bfloat16()),
         math.log(0.2) - float(torch.tensor(math.log(0.2)).bfloat16())]
    assert m["staleness_kl_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 2, rel=1e-4)
    assert isinstance(m["staleness_kl_k3"], float) and isinstance(m["staleness_abs_dp"], float)
