"""Every loss and its gradient against values computed by hand on tiny tensors."""

import math

import pytest
import torch

from runners.algos import REGISTRY, AlgoConfig, LossInputs, get_loss, leave_one_out_advantages

LN = math.log
CFG = AlgoConfig(max_len=4, C=3.0)


def pg_inputs(adv=(1.0, -1.0)):
    """Two sequences (lengths 2 and 1), on-policy, w = 2 and w = 4."""
    logp = torch.tensor([[LN(.5), LN(.5)], [LN(.25), -7.0]], dtype=torch.float64, requires_grad=True)
    roll = torch.tensor([[LN(.25), LN(.5)], [LN(1 / 16), -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    return LossInputs(logp, logp.detach().clone(), roll, mask, torch.tensor(adv, dtype=torch.float64),
                      center=ZERO_CENTER(logp))


def ZERO_CENTER(logp):
    """Score Centering's term Σ_v sg(μ_v w_v) log π_θ(v) where its gradient is 0 (μ = π_θ on the whole
    vocabulary: Σ_v p_v ∇log p_v = ∇Σ_v p_v = 0), as a constant; the other losses ignore it.
    tests/runners/test_corrections.py checks the term itself."""
    return torch.zeros_like(logp.detach())


def grad_of(name, x, cfg=CFG):
    loss, metrics = get_loss(name)(x, cfg)
    loss.backward()
    return loss.item(), x.logp.grad, metrics


S = 2 * LN(.5)          # Σ_t logp of both sequences (= LN(.25))


def test_pg_seq_is_by_hand():
    loss, g, m = grad_of("pg-seq-is", pg_inputs())
    assert loss == pytest.approx(((-2 * 1 * S) + (-4 * -1 * S)) / 2 / 4)
    assert torch.allclose(g, torch.tensor([[-0.25, -0.25], [0.5, 0.0]], dtype=g.dtype))
    assert m["is_weight_max"] == pytest.approx(4) and m["is_weight_min"] == pytest.approx(2)
    assert m["is_weight_ess"] == pytest.approx(36 / (2 * 20))


def test_pg_seq_tis_truncates_at_c():
    loss, g, m = grad_of("pg-seq-tis", pg_inputs())
    assert loss == pytest.approx(((-2 * S) + (-3 * -1 * S)) / 2 / 4)
    assert torch.allclose(g, torch.tensor([[-0.25, -0.25], [0.375, 0.0]], dtype=g.dtype))
    assert m["truncated_frac"] == 0.5


def test_pg_seq_mis_masks_above_c():
    loss, g, m = grad_of("pg-seq-mis", pg_inputs())
    assert loss == pytest.approx((-2 * S) / 2 / 4)
    assert torch.allclose(g, torch.tensor([[-0.25, -0.25], [0.0, 0.0]], dtype=g.dtype))
    assert m["masked_frac"] == 0.5


def test_weight_exactly_at_c_is_kept_by_mis_and_untouched_by_tis():
    x = pg_inputs()
    x.logp_rollout = x.logp.detach().clone()            # w = 1 exactly
    cfg = AlgoConfig(max_len=4, C=1.0)
    for name in ("pg-seq-tis", "pg-seq-mis"):
        x.logp.grad = None
        loss, g, m = grad_of(name, x, cfg)
        assert loss == pytest.approx((-S + S) / 2 / 4)
        assert torch.allclose(g, torch.tensor([[-0.125, -0.125], [0.125, 0.0]], dtype=g.dtype))
        assert m.get("masked_frac", 0) == 0 and m.get("truncated_frac", 0) == 0


def ppo_inputs(r=(1.5, 0.9), adv=1.0, rho=(1.0, 1.0)):
    old = torch.tensor([[LN(.4), LN(.3)]], dtype=torch.float64)
    logp = (old + torch.log(torch.tensor([r], dtype=torch.float64))).requires_grad_(True)
    roll = old - torch.log(torch.tensor([rho], dtype=torch.float64))
    return LossInputs(logp, old, roll, torch.ones(1, 2, dtype=torch.float64), torch.tensor([adv], dtype=torch.float64))


def test_grpo_clip_higher_by_hand():
    loss, g, m = grad_of("grpo", ppo_inputs())
    assert loss == pytest.approx(-(1.28 + 0.9) / 4)
    assert torch.allclose(g, torch.tensor([[0.0, -0.9 / 4]], dtype=g.dtype))
    assert m["clip_frac"] == 0.5
    loss, g, m = grad_of("grpo", ppo_inputs(r=(1.5, 0.5), adv=-1.0))
    assert loss == pytest.approx((1.5 + 0.8) / 4)
    assert torch.allclose(g, torch.tensor([[1.5 / 4, 0.0]], dtype=g.dtype))


def test_grpo_ignores_rollout_logprobs():
    a, _, _ = grad_of("grpo", ppo_inputs())
    b, _, _ = grad_of("grpo", ppo_inputs(rho=(9.0, 0.1)))
    assert a == pytest.approx(b)


def test_grpo_token_tis_by_hand():
    loss, g, m = grad_of("grpo-token-tis", ppo_inputs(rho=(4.0, 0.5)))
    assert loss == pytest.approx(-(3 * 1.28 + 0.5 * 0.9) / 4)
    assert torch.allclose(g, torch.tensor([[0.0, -0.5 * 0.9 / 4]], dtype=g.dtype))
    assert m["truncated_frac"] == 0.5


def test_grpo_seq_mis_by_hand():
    loss, g, m = grad_of("grpo-seq-mis", ppo_inputs(rho=(4.0, 0.5)))       # ρ = 2 ≤ 3
    assert loss == pytest.approx(-2 * (1.28 + 0.9) / 4)
    assert torch.allclose(g, torch.tensor([[0.0, -2 * 0.9 / 4]], dtype=g.dtype))
    loss, g, m = grad_of("grpo-seq-mis", ppo_inputs(rho=(4.0, 1.0)))       # ρ = 4 > 3: masked
    assert loss == 0 and torch.all(g == 0) and m["masked_frac"] == 1.0


def test_gspo_by_hand():
    old = torch.zeros(2, 2, dtype=torch.float64)
    logp = torch.tensor([[0.001, 0.001], [0.0002, 0.0]], dtype=torch.float64, requires_grad=True)
    x = LossInputs(logp, old, old, torch.ones(2, 2, dtype=torch.float64),
                   torch.tensor([1.0, -1.0], dtype=torch.float64))
    loss, g, m = grad_of("gspo", x)
    s2 = math.exp(0.0001)
    assert loss == pytest.approx(-(1.0004 - s2) / 2)
    assert torch.allclose(g, torch.tensor([[0.0, 0.0], [s2 / 4, s2 / 4]], dtype=g.dtype))
    assert m["clip_frac"] == 0.5


def test_leave_one_out_advantages():
    a = leave_one_out_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    assert torch.allclose(a, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0.0, 0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError):
        leave_one_out_advantages(torch.ones(3, 1))


@pytest.mark.parametrize("name", [n for n in REGISTRY if n != "ipo"])   # IPO's (log r)² penalty needs no advantage
def test_all_equal_rewards_give_zero_loss_and_gradient(name):
    x = pg_inputs(adv=(0.0, 0.0))
    loss, g, _ = grad_of(name, x)
    assert loss == 0 and torch.all(g == 0)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_fully_masked_batch_is_finite_zero(name):
    x = pg_inputs()
    x.mask = torch.zeros_like(x.mask)
    loss, g, m = grad_of(name, x)
    assert loss == 0 and torch.all(g == 0)
    assert all(math.isfinite(v) for v in m.values())


@pytest.mark.parametrize("name", list(REGISTRY))
def test_length_one_responses(name):
    logp = torch.tensor([[LN(.5)], [LN(.2)]], dtype=torch.float64, requires_grad=True)
    x = LossInputs(logp, logp.detach().clone(), logp.detach().clone(), torch.ones(2, 1, dtype=torch.float64),
                   torch.tensor([1.0, -1.0], dtype=torch.float64), center=ZERO_CENTER(logp))
    loss, g, _ = grad_of(name, x)
    # on-policy with no mismatch every estimator is plain REINFORCE: gradient −A/(B·norm),
    # norm = L for the Dr.GRPO-normalised losses and T = 1 for GSPO's per-sequence mean
    norm = 1 if name == "gspo" else CFG.max_len
    assert torch.allclose(g, torch.tensor([[-0.5 / norm], [0.5 / norm]], dtype=torch.float64))


def test_unknown_algorithm_lists_the_valid_ones():
    with pytest.raises(ValueError, match="pg-seq-is"):
        get_loss("ppo")


def test_the_apps_algorithm_list_is_the_registry():
    """The leaderboard takes the names from bench.algorithms, never from runners/."""
    import pathlib

    from bench.algorithms import ALGORITHMS

    assert list(ALGORITHMS) == list(REGISTRY)
    app = pathlib.Path(__file__).parents[2] / "leaderboard"
    offenders = [str(p) for p in app.rglob("*.py")
                 if "from runners" in p.read_text() or "import runners" in p.read_text()]
    assert not offenders, f"the app imports the trainer's modules: {offenders}"


def test_a_loss_needs_its_spec():
    from bench.algorithms import SPECS
    from runners.algos import register_loss

    with pytest.raises(KeyError, match="SPECS"):
        register_loss("ppo")
    assert [n for n, s in SPECS.items() if s.mean_over == "nonempty"] == ["gspo"]


def test_gspo_clips_below_for_a_negative_advantage():
    """s = e^−0.001 = 0.9990 < 1 − 3e-4 with A = −1: the clipped term (1 − 3e-4)·A is the smaller, a
    constant: no gradient; the second sequence, s = e^0.00005 inside the range, keeps its own."""
    old = torch.zeros(2, 2, dtype=torch.float64)
    logp = torch.tensor([[-0.001, -0.001], [0.0001, 0.0]], dtype=torch.float64, requires_grad=True)
    x = LossInputs(logp, old, old, torch.ones(2, 2, dtype=torch.float64),
                   torch.tensor([-1.0, 1.0], dtype=torch.float64))
    loss, g, m = grad_of("gspo", x)
    s2 = math.exp(0.00005)
    assert loss == pytest.approx((0.9997 - s2) / 2)
    assert torch.allclose(g, torch.tensor([[0.0, 0.0], [-s2 / 4, -s2 / 4]], dtype=g.dtype))
    assert m["clip_frac"] == 0.5


def test_sequences_in_mean_counts_empty_rows_for_all_but_gspo():
    from runners.algos import sequences_in_mean

    # 3 rows (one empty) × 5 tokens; 3 of the columns hold a token, so rows and columns differ
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0], [0.0] * 5, [1.0, 0.0, 0.0, 0.0, 0.0]])
    assert sequences_in_mean("gspo", mask) == 2
    assert all(sequences_in_mean(a, mask) == 3 for a in REGISTRY if a != "gspo")


def test_algo_config_defaults():
    assert AlgoConfig() == AlgoConfig(max_len=64, C=3.0, eps_lo=0.2, eps_hi=0.28, gspo_lo=3e-4, gspo_hi=4e-4)


def test_a_fraction_of_nothing_is_zero():
    from runners.algos import _frac

    assert _frac(torch.zeros(0, dtype=torch.bool)) == 0.0
    assert _frac(torch.ones(2, 2, dtype=torch.bool), torch.zeros(2, 2)) == 0.0
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert _frac(torch.tensor([[True, False], [True, True]]), mask) == pytest.approx(2 / 3)
    assert _frac(torch.tensor([[True]]), torch.tensor([[1.0]])) == 1.0


def test_grpo_seq_mis_keeps_a_weight_exactly_at_c():
    # ρ = e^0 = 1 = C exactly: kept, the loss is grpo's −(1.28 + 0.9) / 4
    loss, g, m = grad_of("grpo-seq-mis", ppo_inputs(rho=(1.0, 1.0)), AlgoConfig(max_len=4, C=1.0))
    assert loss == pytest.approx(-(1.28 + 0.9) / 4) and m["masked_frac"] == 0


def test_leave_one_out_with_two_samples_per_prompt():
    assert torch.equal(leave_one_out_advantages(torch.tensor([[1.0, 0.0]])), torch.tensor([[1.0, -1.0]]))


def test_sequence_log_ratio_is_clamped_at_20():
    # one sequence, Σ(log π − log μ) = 25 → w = e^20: L = −e^20 · 1 · Σ logp / L_max, Σ logp = 2 ln ½
    logp = torch.tensor([[LN(.5), LN(.5)]], dtype=torch.float64, requires_grad=True)
    x = LossInputs(logp, logp.detach().clone(), logp.detach() - 12.5, torch.ones(1, 2, dtype=torch.float64),
                   torch.tensor([1.0], dtype=torch.float64))
    loss, _, _ = grad_of("pg-seq-is", x)
    assert loss == pytest.approx(-math.exp(20) * 2 * LN(.5) / 4, rel=1e-12)


def test_token_tis_counts_a_weight_exactly_at_c_as_not_truncated():
    _, _, m = grad_of("grpo-token-tis", ppo_inputs(rho=(1.0, 1.0)), AlgoConfig(max_len=4, C=1.0))
    assert m["truncated_frac"] == 0


def test_gspo_without_any_token_is_zero():
    x = pg_inputs()
    x.mask = torch.zeros_like(x.mask)
    loss, g, m = grad_of("gspo", x)
    assert loss == 0 and torch.all(g == 0) and m == {"clip_frac": 0.0}
