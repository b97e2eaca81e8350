"""The field's corrections (bench/algorithms.py after the paper's seven): each loss and its
gradient against values computed by hand on two sequences (lengths 2 and 1, max_len L = 4,
advantages +1 and −1), and what the registry says of each."""

import math

import pytest
import torch

from bench.algorithms import ALGO_GROUPS, PAPER_ALGORITHMS, SPECS, AlgoConfig
from runners.algos import REGISTRY, LossInputs, bernoulli_kl, get_loss

LN = math.log
CFG = AlgoConfig(max_len=4)
LOGP = [[LN(.5), LN(.5)], [LN(.25), -7.0]]          # π_θ of the sampled tokens (the last one is padding)
MASK = [[1.0, 1.0], [1.0, 0.0]]


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def inputs(*, rho=None, r=None, mu=None, old_ratio=None, adv=(1.0, -1.0)):
    """π_θ = LOGP. π_old = π_θ / old_ratio (default: on-policy, r_t = π_θ/π_old = 1). μ: given as
    probabilities `mu`, or by ρ_t = π_old/μ (`rho`), or by r_t = π_θ/μ (`r`)."""
    logp = t(LOGP).requires_grad_(True)
    old = logp.detach() - (t(old_ratio).log() if old_ratio is not None else 0)
    if mu is not None:
        roll = t(mu).log()
    elif rho is not None:
        roll = old - t(rho).log()
    else:
        roll = logp.detach() - t(r).log()
    # Score Centering's Σ_v sg(μ_v w_v) log π_θ(v): its gradient is 0 where μ = π_θ on the whole vocabulary
    # (the on-policy test below); a constant stands in, and the tests at the end check the term itself
    return LossInputs(logp, old, roll, t(MASK), t(adv), center=torch.zeros_like(logp.detach()))


def run(name, x, cfg=CFG):
    loss, metrics = get_loss(name)(x, cfg)
    loss.backward()
    return loss.item(), x.logp.grad, metrics


def close(g, rows):
    return torch.allclose(g, t(rows), atol=1e-12)


# ------------------------------------------------------------------ IcePop, two rules of one name

def test_icepop_keeps_rho_inside_its_bounds_with_its_weight():
    """ρ = [[2, 8], [0.25]]: 8 > 5 and 0.25 < 0.5 are zeroed, 2 kept with weight 2; r = 1 (on-policy),
    so each kept token's PPO term is A: L = −(2·1 + 0)/2/4."""
    loss, g, m = run("icepop", inputs(rho=[[2, 8], [0.25, 1e6]]))
    assert loss == pytest.approx(-2 / 2 / 4)
    assert close(g, [[-2 / 8, 0], [0, 0]])
    assert m["masked_frac"] == pytest.approx(2 / 3)        # of the three response tokens; padding not counted


def test_icepop_bounds_are_inclusive():
    loss, g, m = run("icepop", inputs(rho=[[1, 1], [1, 1]]), AlgoConfig(max_len=4, icepop_lo=1.0, icepop_hi=1.0))
    assert loss == pytest.approx(-(2 - 1) / 2 / 4) and m["masked_frac"] == 0


def test_icepop_keeps_the_ppo_clip_and_pg_icepop_has_none():
    """Off-policy r_t = π_θ/π_old = 2 (> 1 + 0.28) with μ = π_old (ρ = 1): icepop's clipped term has no
    gradient for A > 0; prime-rl's rule, on r = π_θ/μ = 2 ∈ [0.2, 5] and not detached, has r·A."""
    x = dict(old_ratio=[[2, 2], [2, 2]], rho=[[1, 1], [1, 1]])
    _, g, _ = run("icepop", inputs(**x))
    assert close(g[0], [0, 0])                            # clipped: A > 0 and r above 1.28
    assert g[1, 0] == pytest.approx(2 / 8)                # A < 0: min() takes the unclipped r·A
    loss, g, m = run("pg-icepop", inputs(**x))
    assert loss == pytest.approx(-(2 + 2 - 2) / 2 / 4)
    assert close(g, [[-2 / 8, -2 / 8], [2 / 8, 0]])
    assert m["masked_frac"] == 0


def test_pg_icepop_masks_r_outside_its_bounds():
    loss, g, m = run("pg-icepop", inputs(r=[[0.1, 6], [4, 1]]))
    assert loss == pytest.approx(-(-4) / 2 / 4)           # only row 1's r = 4 kept: −(4·−1)
    assert close(g, [[0, 0], [4 / 8, 0]])
    assert m["masked_frac"] == pytest.approx(2 / 3)


# ------------------------------------------------------------------ verl's rejections

def test_trm_rejects_a_sequence_with_one_token_outside_the_trust_region():
    """½(ln 16)² = 3.84 > 2.5 rejects row 0 whole; row 1's padding has ρ = 1e6 and does not count."""
    loss, g, m = run("trm", inputs(rho=[[16, 1], [1, 1e6]]))
    assert loss == pytest.approx(1 / 2 / 4)               # row 1: −(−1)
    assert close(g, [[0, 0], [1 / 8, 0]])
    assert m["masked_frac"] == 0.5
    _, _, m = run("trm", inputs(rho=[[8, 1], [1, 1]]))    # ½(ln 8)² = 2.16 ≤ 2.5: kept
    assert m["masked_frac"] == 0


def test_geo_mask_keeps_a_sequence_by_its_geometric_mean():
    """Row 0: both tokens ρ = 1.0005, mean k1 = −ln 1.0005 ∈ [ln 0.999, ln 1.001]: kept; row 1: ρ = 1.01:
    mean k1 = −ln 1.01 < ln 0.999: rejected. Row 0's two tokens one over 1.001 and one under keep it too."""
    loss, g, m = run("grpo-geo-mask", inputs(rho=[[1.0005, 1.0005], [1.01, 1]]))
    assert loss == pytest.approx(-2 / 2 / 4)
    assert close(g, [[-1 / 8, -1 / 8], [0, 0]])
    assert m["masked_frac"] == 0.5
    _, _, m = run("grpo-geo-mask", inputs(rho=[[1.003, 1 / 1.003], [1, 1]]))
    assert m["masked_frac"] == 0


# ------------------------------------------------------------------ DPPO

def test_dppo_tv_masks_tokens_that_left_the_region_in_the_advantages_direction():
    """p = π_θ = [[.5, .5], [.25]], μ = [[.3, .45], [.45]]: row 0 (A > 0) token 0 has p − μ = .2 > .15:
    out; token 1 .05: in, weight p/μ = 10/9; row 1 (A < 0) p − μ = −.2 < −.15: out."""
    loss, g, m = run("dppo-tv", inputs(mu=[[.3, .45], [.45, .5]]))
    assert loss == pytest.approx(-(10 / 9) * LN(.5) / 2 / 4)
    assert close(g, [[0, -(10 / 9) / 8], [0, 0]])
    assert m["masked_frac"] == pytest.approx(2 / 3)


def test_dppo_tv_leaves_a_move_against_the_advantage_and_truncates_the_weight_at_c():
    """Row 0 (A > 0): μ = .9 > p, p − μ = −.4 (the safe side for A > 0) kept, weight .5/.9; row 1
    (A < 0): μ = .01, p − μ = .24 (safe for A < 0) kept, weight 25 truncated at C = 10."""
    loss, g, m = run("dppo-tv", inputs(mu=[[.9, .5], [.01, .5]]))
    assert m["masked_frac"] == 0 and m["truncated_frac"] == pytest.approx(1 / 3)
    assert close(g, [[-(.5 / .9) / 8, -1 / 8], [10 / 8, 0]])


def test_bernoulli_kl_by_hand():
    def kl(q, p):
        return bernoulli_kl(t([q]).log(), t([p]).log()).item()

    assert kl(.3, .5) == pytest.approx(.3 * LN(.3 / .5) + .7 * LN(.7 / .5))
    assert kl(.4, .4) == 0
    assert math.isfinite(kl(.5, 1.0))                   # log(1 − 1 + 1e-8): Stable-RL's guard


def test_dppo_kl_masks_by_the_bernoulli_kl_in_the_advantages_direction():
    """KL_b(.3‖.5) = .0823 > .05 with p > μ, A > 0: out; KL_b(.45‖.5) = .0050: in; row 1 KL_b(.45‖.25) =
    .0939 > .05 with p < μ, A < 0: out. The same tensors as the TV test, the same decisions."""
    loss, g, m = run("dppo-kl", inputs(mu=[[.3, .45], [.45, .5]]))
    assert loss == pytest.approx(-(10 / 9) * LN(.5) / 2 / 4)
    assert m["masked_frac"] == pytest.approx(2 / 3)
    _, _, m = run("dppo-kl", inputs(mu=[[.7, .5], [.1, .5]]))      # far, but on the safe side: kept
    assert m["masked_frac"] == 0


# ------------------------------------------------------------------ CISPO, one-sided and two-sided

def test_cispo_truncates_the_weight_above_only():
    """r = π_θ/π_old = [[8, .5], [2]]: TRL's weights [[5, .5], [2]] (no lower bound), verl's clamp to
    [0.8, 1.28]; L = mean_i [−A_i Σ_t w_t log π_θ] / 4."""
    x = dict(old_ratio=[[8, .5], [2, 1]], rho=[[1, 1], [1, 1]])
    loss, g, m = run("cispo", inputs(**x))
    assert loss == pytest.approx((-(5 + .5) * LN(.5) + 2 * LN(.25)) / 2 / 4)
    assert close(g, [[-5 / 8, -.5 / 8], [2 / 8, 0]])
    assert m["clip_frac"] == pytest.approx(1 / 3)
    loss, g, m = run("cispo-two-sided", inputs(**x))
    assert close(g, [[-1.28 / 8, -.8 / 8], [1.28 / 8, 0]])
    assert m["clip_frac"] == 1


# ------------------------------------------------------------------ IPO

def test_ipo_masks_by_probability_distance_and_adds_the_log_ratio_penalty():
    """μ = [[.45, .3], [.3]]: |p − μ| = .05 (in), .2 (out), .05 (in); r = p/μ not detached:
    per token −keep·r·A + 1e-3·(ln r)², its gradient −keep·r·A + 2e-3·ln r."""
    mu = [[.45, .3], [.3, .5]]
    loss, g, m = run("ipo", inputs(mu=mu))
    r = [[.5 / .45, .5 / .3], [.25 / .3]]
    b = 1e-3
    want = (-r[0][0] + b * LN(r[0][0]) ** 2 + b * LN(r[0][1]) ** 2) + (r[1][0] + b * LN(r[1][0]) ** 2)
    assert loss == pytest.approx(want / 2 / 4)
    assert close(g, [[(-r[0][0] + 2 * b * LN(r[0][0])) / 8, 2 * b * LN(r[0][1]) / 8],
                     [(r[1][0] + 2 * b * LN(r[1][0])) / 8, 0]])
    assert m["masked_frac"] == pytest.approx(1 / 3)


# ------------------------------------------------------------------ OPSM, two anchors

def test_opsm_drops_negative_sequences_that_drifted_from_mu():
    """mean_t log(μ/π_θ) = 0.6 > 0.5 on both rows: row 1 (A < 0) dropped, row 0 (A > 0) kept."""
    loss, g, m = run("opsm", inputs(r=[[math.exp(-.6)] * 2, [math.exp(-.6), 1]]))
    assert loss == pytest.approx(-2 / 2 / 4)
    assert close(g, [[-1 / 8, -1 / 8], [0, 0]])
    assert m["masked_frac"] == 0.5


def test_opsm_old_is_anchored_on_pi_old_and_is_idle_at_the_first_update():
    mu_far = dict(r=[[math.exp(-.6)] * 2, [math.exp(-.6), 1]])
    _, _, m = run("opsm-old", inputs(**mu_far))           # π_old = π_θ: drift 0 whatever μ is
    assert m["masked_frac"] == 0
    _, g, m = run("opsm-old", inputs(old_ratio=[[1, 1], [math.exp(-1e-3), 1]], rho=[[1, 1], [1, 1]]))
    assert m["masked_frac"] == 0.5 and close(g[1], [0, 0])


# ------------------------------------------------------------------ the registry

def test_every_algorithm_says_what_it_is():
    for spec in SPECS.values():
        assert spec.anchor in ("μ", "π_old", "-") and spec.unit in ("token", "sequence")
        assert spec.kind in ("weight", "mask", "weight+mask", "clip")
        assert set(spec.thresholds) <= set(vars(AlgoConfig()))
    assert list(ALGO_GROUPS["all"]) == list(REGISTRY) == [*PAPER_ALGORITHMS, *ALGO_GROUPS["corrections"]]
    assert len(PAPER_ALGORITHMS) == 7 and "gspo" in PAPER_ALGORITHMS


def test_the_corrections_thresholds_are_when_set_knobs():
    """Added after runs were stored: at their default they leave every stored cell as it was."""
    import dataclasses

    from bench.fingerprint import WHEN_SET

    paper = {k for a in PAPER_ALGORITHMS for k in SPECS[a].thresholds} | {"max_len"}
    for f in dataclasses.fields(AlgoConfig):
        assert f.metadata["fingerprint"] == ("setting" if f.name in paper else "when-set"), f.name
        assert (f"algo.{f.name}" in WHEN_SET) == (f.name not in paper)


def test_a_stored_run_before_the_corrections_keeps_its_fingerprint():
    from dataclasses import asdict

    from bench.fingerprint import fingerprint
    from runners.presets import get_preset

    new = {"preset": "tiny", **asdict(get_preset("tiny"))}
    old = {**new, "algo": {k: new["algo"][k] for k in ("max_len", "C", "eps_lo", "eps_hi", "gspo_lo", "gspo_hi")}}
    assert fingerprint(new) == fingerprint(old)
    moved = {"preset": "tiny", **asdict(get_preset("tiny", icepop_hi=2.0))}
    assert moved["algo"]["icepop_hi"] == 2.0 and fingerprint(moved) != fingerprint(old)


@pytest.mark.parametrize("name", [n for n in REGISTRY if n not in PAPER_ALGORITHMS])
def test_a_correction_on_policy_without_mismatch_is_the_plain_policy_gradient(name):
    """μ = π_old = π_θ: no weight moves off 1 and no mask fires, so every correction's gradient is
    −A_i/(B·L) on each response token (IPO's penalty is 0 at r = 1)."""
    _, g, m = run(name, inputs(rho=[[1, 1], [1, 1]]))
    assert close(g, [[-1 / 8, -1 / 8], [1 / 8, 0]]), name
    assert m.get("masked_frac", 0) == 0


TWINS = {"grpo": ("cispo", "cispo-two-sided", "opsm-old"), "pg-seq-mis": ("grpo-seq-mis",)}


@pytest.mark.parametrize("first,twin", [(a, b) for a, bs in TWINS.items() for b in bs])
def test_at_one_update_per_batch_twins_take_the_same_step_whatever_mu_is(first, twin):
    """π_old = π_θ (one update per batch: the tiny and small presets', not paper's 4; no staleness)
    and a mismatch that masks one sequence (ρ = π_old/μ = 4 > C = 3 on the second, 1/2 on the first):
    r_t = 1, so GRPO's clip, CISPO's truncation (one- or two-sided) and OPSM-old's drift are idle and
    each gives −A_i/(B·L) per token; pg-seq-mis (w = π_θ/μ) and grpo-seq-mis (ρ = π_old/μ) weigh each
    sequence by the same number, and both mask the second. docs/results.md ("Tolerances on
    tiny-math") gives twins one tolerance."""
    rho = dict(rho=[[.5, 1], [4, 1]])
    _, g_first, _ = run(first, inputs(**rho), AlgoConfig(max_len=4, C=3.0))
    _, g_twin, _ = run(twin, inputs(**rho), AlgoConfig(max_len=4, C=3.0))
    assert torch.equal(g_first, g_twin), (first, twin)
    expected = [[-1 / 8, -1 / 8], [1 / 8, 0]] if first == "grpo" else [[-1 / 16, -1 / 16], [0, 0]]
    assert close(g_first, expected)


# ------------------------------------------------------------------ Score Centering

def centered(logits, logq, hi):
    """(log π of token 0, the centering term) of one position, the training forward's own function."""
    from runners.logprobs import _chunk_logprobs_centered

    return _chunk_logprobs_centered(lambda h: h, logits, torch.zeros(logits.shape[:2], dtype=torch.long), logq, hi)


def test_sc_centering_term_by_hand():
    """p = softmax(0, ln 2, ln 3) = (1/6, 2/6, 3/6), μ uniform: w = p/q = (.5, 1, 1.5). Untruncated
    (hi 2) the weights give back p, center = Σ p log p = −H(p), and its gradient in the logits
    c − p·Σc is 0; truncated at 1.2 it is c − 0.9·p = (1/60, 1/30, −1/20)."""
    q = t([[[1 / 3] * 3]]).log()
    z = t([[[0.0, LN(2), LN(3)]]]).requires_grad_(True)
    p = torch.tensor([1 / 6, 2 / 6, 3 / 6], dtype=torch.float64)
    lp, center = centered(z.float(), q.float(), 2.0)
    assert lp.item() == pytest.approx(LN(1 / 6), rel=1e-6)
    assert center.item() == pytest.approx((p * p.log()).sum().item(), rel=1e-6)
    center64 = centered(z, q, 2.0)[1]
    (g,) = torch.autograd.grad(center64.sum(), z)                      # the forward's log-softmax is fp32
    assert torch.allclose(g, torch.zeros_like(g), atol=1e-7)
    (g,) = torch.autograd.grad(centered(z, q, 1.2)[1].sum(), z)
    assert torch.allclose(g[0, 0], t([1 / 60, 1 / 30, -1 / 20]), atol=1e-7)


def test_sc_loss_and_gradient_by_hand():
    """L = mean_i [−A_i Σ_t (sg(w_t) log π_θ,t − center_t)] / L with w_t = min(π_θ/μ, 2): r = [[4, 1],
    [0.5]] gives w = [[2, 1], [0.5]]; the center enters with its own gradient (here a leaf)."""
    x = inputs(r=[[4, 1], [0.5, 1]])
    x.center = t([[0.1, 0.2], [0.3, 9.0]]).requires_grad_(True)
    loss, metrics = get_loss("sc")(x, CFG)
    loss.backward()
    want = (-(2 * LN(.5) - 0.1 + 1 * LN(.5) - 0.2) + (0.5 * LN(.25) - 0.3)) / 2 / 4
    assert loss.item() == pytest.approx(want)
    assert close(x.logp.grad, [[-2 / 8, -1 / 8], [0.5 / 8, 0]])
    assert close(x.center.grad, [[1 / 8, 1 / 8], [-1 / 8, 0]])
    assert metrics["truncated_frac"] == pytest.approx(1 / 3)


def test_sc_gradient_is_the_score_centred_under_mu():
    """Through the training forward's term: the gradient in the logits of one position is
    −A · (w_a (e_a − p) − Σ_v q_v w_v (e_v − p)) / (B·L), the score of the sampled token minus its
    μ-weighted expectation (vime's derivation), here for B = 1, L = 4, A = 1, a = token 0."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(1, 1, 5, generator=g, dtype=torch.float64).requires_grad_(True)
    logq = torch.log_softmax(torch.randn(1, 1, 5, generator=g, dtype=torch.float64), -1)
    lp, center = centered(z, logq, 2.0)
    x = LossInputs(lp, lp.detach(), logq[..., 0], torch.ones(1, 1, dtype=torch.float64),
                   torch.ones(1, dtype=torch.float64), center=center)
    loss, _ = get_loss("sc")(x, CFG)
    (grad,) = torch.autograd.grad(loss, z)
    p, q = torch.softmax(z.detach(), -1)[0, 0], logq.exp()[0, 0]
    w = (p / q).clamp(max=2.0)
    e = torch.eye(5, dtype=torch.float64)
    want = -(w[0] * (e[0] - p) - sum(q[v] * w[v] * (e[v] - p) for v in range(5))) / 4
    assert torch.allclose(grad[0, 0], want, atol=1e-7)                  # the forward's log-softmax is fp32


def vime_score_centering(log_probs, rollout_log_probs_topk, topk_ids, sampled_log_prob, sampled_rollout_log_prob,
                         advantages, tis_clip=2.0, tis_clip_low=0.0):
    """vllm-project/vime 2b83ea2, vime/utils/score_centering.py, score_centering_correction with its
    TIS weights (vime/utils/ppo_utils.py, importance_weights): the head H = the recorded top-k of μ,
    the tail modelled as α·p. Per position: log_probs [V] (the trainer's, with grad)."""
    p = log_probs.exp()
    f = lambda ratio: ratio.clamp(tis_clip_low, tis_clip)                  # noqa: E731 (the TIS weight)
    lp_h, q_h = log_probs[topk_ids], rollout_log_probs_topk.exp()
    p_h = p[topk_ids].detach()
    P_H, Q_H = p_h.sum(), q_h.sum()
    rho_tail = (1 - Q_H).clamp(min=1e-6) / (1 - P_H).clamp(min=1e-6)
    alpha = rho_tail * f(1 / rho_tail)
    w_a = f((sampled_log_prob.detach() - sampled_rollout_log_prob).exp())
    centering = ((q_h * f(p_h / q_h) - alpha * p_h).detach() * lp_h).sum()
    return -advantages * (w_a * sampled_log_prob - centering)


def test_sc_gradient_is_vimes_with_the_whole_vocabulary_as_its_head():
    """vime keeps μ's top-128 and models the tail; with every token in the head its gradient is bench's
    exact one (its loss value differs by α·Σ_v p_v log p_v, whose gradient is 0)."""
    g = torch.Generator().manual_seed(4)
    V = 7
    z = torch.randn(V, generator=g, dtype=torch.float64).requires_grad_(True)
    logq = torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64) * 2, -1)
    a, adv = 2, -0.75
    lp = torch.log_softmax(z, -1)
    theirs = vime_score_centering(lp, logq, torch.arange(V), lp[a], logq[a], adv)
    (g_theirs,) = torch.autograd.grad(theirs, z)
    lp_b, center = centered(z.view(1, 1, V), logq.view(1, 1, V), 2.0)
    lp_b = torch.log_softmax(z, -1)[a].view(1, 1)          # the sampled token's log-prob, token a
    x = LossInputs(lp_b, lp_b.detach(), logq[a].view(1, 1), torch.ones(1, 1, dtype=torch.float64),
                   torch.tensor([adv], dtype=torch.float64), center=center)
    loss, _ = get_loss("sc")(x, AlgoConfig(max_len=1))
    (g_ours,) = torch.autograd.grad(loss, z)
    assert torch.allclose(g_ours, g_theirs, atol=1e-7)                   # bench's forward: fp32 log-softmax


def test_sc_is_refused_where_mu_has_no_whole_distribution_or_it_would_not_fit():
    from bench.errors import BenchError
    from bench.models import resolve_model
    from runners.plan import check_distribution
    from runners.presets import get_preset

    ref = resolve_model("tiny-math")
    check_distribution("sc", "torch", get_preset("tiny"), ref)             # 64·8 rows × 64 × 85: 11 MiB
    check_distribution("grpo", "vllm", get_preset("tiny"), ref)            # reads μ's sampled tokens only
    with pytest.raises(BenchError, match="only the built-in engine records"):
        check_distribution("sc", "vllm", get_preset("tiny"), ref)
    with pytest.raises(BenchError, match=r"GiB, over 4 GiB: lower --prompts-per-step"):
        check_distribution("sc", "torch", get_preset("tiny", prompts_per_step=100_000), ref)


def test_bands_keep_something():
    """--icepop-lo above --icepop-hi keeps nothing: refused."""
    from bench.errors import ConfigError
    from runners.presets import get_preset

    with pytest.raises(ConfigError, match="--icepop-lo 6 is above --icepop-hi 5"):
        get_preset("tiny", icepop_lo=6.0)
    with pytest.raises(ConfigError, match="--geo-lo"):
        get_preset("tiny", geo_lo=1.01)


@pytest.mark.vllm
def test_groups_leave_out_what_the_engine_cannot_run(tmp_path):
    """`bench sweep --algo corrections --engine vllm` leaves Score Centering out and says why (then
    stops here: the store has no build). Needs vLLM importable (the engine is resolved first), so it
    runs where `./bench.sh test` installed it, not in the quick lane."""
    from typer.testing import CliRunner

    from bench.cli import app

    r = CliRunner().invoke(app, ["sweep", "--algo", "corrections", "--engine", "vllm", "--dtype", "fp16",
                                 "--db", f"sqlite:///{tmp_path / 's.db'}"])
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "leaves out sc: it reads μ's whole distribution" in text and "no build" in text


def test_a_threshold_is_refused_for_an_algorithm_that_does_not_read_it(tmp_path):
    from typer.testing import CliRunner

    from bench.cli import app

    url = f"sqlite:///{tmp_path / 's.db'}"
    for args in (["run", "--algo", "grpo", "--icepop-hi", "2"],
                 ["sweep", "--algo", "icepop,grpo", "--dtype", "fp16", "--icepop-hi", "2"]):
        r = CliRunner().invoke(app, [*args, "--db", url])
        text = " ".join(r.output.split())
        assert r.exit_code == 2 and "--icepop-hi is a threshold of icepop; grpo does not read it" in text, r.output
    assert not (tmp_path / "s.db").exists()                 # refused before the store is opened
