"""bench's corrections against each framework's own rule, transcribed from its source at a named
commit, on the same random tensors: per-token terms (after the framework's masks and weights,
before aggregation) and then the loss and its gradient under each side's aggregation.

verl's rules (icepop, trm, grpo-geo-mask, both CISPOs) run live in verl's own environment
(tests/runners/test_verl_crosscheck.py). The frameworks below pull GPU stacks (prime-rl, slime,
Stable-RL) or hide the rule inside a trainer method (TRL's `_compute_loss`), so each rule is
transcribed here as the framework writes it (names as in its source), one function each:

| rule | repository @ commit | file : function |
|---|---|---|
| ipo | PrimeIntellect-ai/prime-rl @ 559b447 | src/prime_rl/trainer/rl/loss.py : ipo_loss_fn |
| pg-icepop | PrimeIntellect-ai/prime-rl PR #2401 @ db60419 | src/prime_rl/trainer/rl/loss.py : icepop loss |
| dppo-tv, -kl | sail-sg/Stable-RL @ c6af1d1 | verl/trainer/ppo/core_algos.py : _compute_token_mask_for_policy_loss |
| (its loss) | sail-sg/Stable-RL @ c6af1d1 | verl/trainer/ppo/core_algos.py : compute_policy_loss_with_mask |
| cispo | huggingface/trl @ f2cd577 | trl/trainer/grpo_trainer.py : _compute_loss (loss_type "cispo") |
| opsm | huggingface/trl @ f2cd577 | trl/trainer/grpo_trainer.py : get_off_policy_mask, _compute_loss ("dapo") |
| opsm-old | THUDM/slime @ 624b824 | slime/utils/ppo_utils.py : compute_opsm_mask, compute_policy_loss |
| icepop | OpenRLHF/OpenRLHF @ 3c3be62 | openrlhf/models/loss.py : PolicyLoss.forward ("icepop") |
| grpo-geo-mask | NovaSky-AI/SkyRL @ a956457 | skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py |

bench divides every loss by B·L (the mean over sequences of a token sum over the fixed max length
L); prime-rl and TRL divide the batch's token sum by its number of response tokens N, so their
loss is bench's times B·L/N, gradient too: the same direction, a batch-dependent step size.
Stable-RL (seq-mean-token-sum-norm with loss_scale_factor L, as its verl base) and slime's
per-token terms aggregated bench's way equal bench's exactly.
"""

import math

import pytest
import torch

from bench.algorithms import AlgoConfig
from runners.algos import LossInputs, get_loss, leave_one_out_advantages

P, G, T, L = 4, 4, 12, 16
B = P * G
CFG = AlgoConfig(max_len=L)


def make_inputs(seed=0):
    """Right-padded responses; π_old = π_θ + small noise (PPO ratios clip, slime's OPSM drift);
    μ = π_old + noise (IS weights, probability gaps both sides of every threshold), and four rows
    with μ far above π_θ (TRL's OPSM drift > 0.5)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths.unsqueeze(-1)).double()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 1.5 - 0.8
    logp[1::4, 2] = -3.0                                                # μ = e^-0.5 below: r = e^-2.5 < 0.2
    logp_old = logp + 0.15 * torch.randn(B, T, generator=g, dtype=torch.float64)
    logp_mu = logp_old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    logp_mu[::3] = logp[::3] + 0.6 + 0.05 * torch.randn(len(range(0, B, 3)), T, generator=g, dtype=torch.float64)
    logp_mu[1::4, 2] = -0.5
    logp_mu[2::4, 3] = logp[2::4, 3] - 2.0                              # r = e^2 > 5
    logp_mu = logp_mu.clamp(max=-1e-6)                                   # probabilities ≤ 1
    rewards = torch.randint(0, 2, (P, G), generator=g).double()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0                            # every prompt has both signs of A
    return {"logp": logp, "logp_old": logp_old, "logp_mu": logp_mu, "mask": mask,
            "adv": leave_one_out_advantages(rewards).flatten()}


@pytest.fixture(scope="module")
def x():
    return make_inputs()


def bench(x, algo, cfg=CFG):
    logp = x["logp"].clone().requires_grad_(True)
    loss, metrics = get_loss(algo)(LossInputs(logp, x["logp_old"], x["logp_mu"], x["mask"], x["adv"]), cfg)
    loss.backward()
    return loss.detach(), logp.grad, metrics


def theirs(x, per_token_fn, normaliser):
    """(framework loss, its gradient, bench-aggregated loss, its gradient) of per-token terms."""
    logp = x["logp"].clone().requires_grad_(True)
    per = per_token_fn(logp) * x["mask"]
    own = per.sum() / normaliser
    (g_own,) = torch.autograd.grad(own, logp, retain_graph=True)
    ours = per.sum() / (B * L)
    (g_ours,) = torch.autograd.grad(ours, logp)
    return own.detach(), g_own, ours.detach(), g_ours


def close(a, b):
    return torch.allclose(a, b, rtol=1e-10, atol=1e-13)


def assert_same(x, algo, per_token_fn, normaliser, cfg=CFG):
    loss, grad, metrics = bench(x, algo, cfg)
    own, g_own, ours, g_ours = theirs(x, per_token_fn, normaliser)
    assert close(loss, ours) and close(grad, g_ours), (algo, loss, ours)
    scale = B * L / normaliser
    assert close(own, loss * scale) and close(g_own, grad * scale)
    return metrics



def adv(x):
    return x["adv"].unsqueeze(-1).expand(B, T)


# ------------------------------------------------------------------ prime-rl

def prime_rl_ipo(log_probs, inference_logprobs, advantages, loss_mask, ipo_threshold=0.1, kl_tau=1e-3, adv_tau=1.0):
    """prime-rl 559b447, src/prime_rl/trainer/rl/loss.py, ipo_loss_fn (per token, before the
    division by the step's loss-mask token count)."""
    log_ratio = log_probs - inference_logprobs
    ratio = torch.exp(log_ratio)
    is_masked = (torch.exp(log_probs) - torch.exp(inference_logprobs)).abs() > ipo_threshold
    keep = loss_mask.bool() & ~is_masked
    return -(keep * adv_tau * advantages * ratio) + kl_tau * loss_mask * log_ratio ** 2


def prime_rl_icepop(log_probs, inference_logprobs, advantages, loss_mask, icepop_ratio_low=0.2,
                    icepop_ratio_high=5.0):
    """prime-rl PR #2401 @ db60419 (the IcePop loss; #3526 merged it, tested in log space): the
    mask on the detached ratio, no PPO clip, no KL term."""
    ratio = torch.exp(log_probs - inference_logprobs)
    is_masked = (ratio.detach() < icepop_ratio_low) | (ratio.detach() > icepop_ratio_high)
    keep = loss_mask.bool() & ~is_masked
    return -(keep * advantages * ratio)


def test_ipo_is_prime_rls(x):
    m = assert_same(x, "ipo", lambda lp: prime_rl_ipo(lp, x["logp_mu"], adv(x), x["mask"]), x["mask"].sum())
    assert 0.05 < m["masked_frac"] < 0.95


def test_pg_icepop_is_prime_rls(x):
    m = assert_same(x, "pg-icepop", lambda lp: prime_rl_icepop(lp, x["logp_mu"], adv(x), x["mask"]),
                    x["mask"].sum())
    assert 0 < m["masked_frac"] < 0.5


# ------------------------------------------------------------------ Stable-RL (DPPO)

def stable_rl_dppo(log_prob, rollout_log_prob, advantages, response_mask, mode, delta_low, delta_high,
                   clip_ratio_c=10.0):
    """sail-sg/Stable-RL c6af1d1, verl/trainer/ppo/core_algos.py: _compute_token_mask_for_policy_loss
    (dppo_binary_tv / dppo_binary_kl, anchored on the rollout policy) and compute_policy_loss_with_mask."""
    p, q = torch.exp(log_prob), torch.exp(rollout_log_prob)
    if mode == "binary_tv":
        invalid_pos, invalid_neg = (p - q) > delta_high, (p - q) < -delta_low
    else:
        bkl = q * (rollout_log_prob - log_prob) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
        invalid_pos, invalid_neg = (bkl > delta_high) & (p > q), (bkl > delta_low) & (p < q)
    invalid = torch.where(advantages > 0, invalid_pos, invalid_neg)
    mask = (1 - invalid.double()).detach() * response_mask
    ratio = torch.exp(torch.clamp(log_prob - rollout_log_prob, max=20.0)).clamp(max=clip_ratio_c).detach()
    return -advantages * ratio * mask * log_prob


@pytest.mark.parametrize("algo, mode, delta", [("dppo-tv", "binary_tv", 0.15), ("dppo-kl", "binary_kl", 0.05)])
def test_dppo_is_stable_rls(x, algo, mode, delta):
    """seq-mean-token-sum-norm with loss_scale_factor L over the B sequences: bench's own aggregation."""
    m = assert_same(x, algo, lambda lp: stable_rl_dppo(lp, x["logp_mu"], adv(x), x["mask"], mode, delta, delta),
                    B * L)
    assert 0.02 < m["masked_frac"] < 0.9


# ------------------------------------------------------------------ TRL

def trl_cispo(per_token_logps, old_per_token_logps, advantages, epsilon_high=5.0):
    """huggingface/trl f2cd577, trl/trainer/grpo_trainer.py, _compute_loss, loss_type "cispo"."""
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()
    return -clamped_ratios * advantages * per_token_logps


def trl_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
    """huggingface/trl f2cd577, trl/trainer/grpo_trainer.py, get_off_policy_mask: [B, 1]."""
    kl_div = sampling_per_token_logps - per_token_logps.detach()
    seq_kl = (kl_div * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    is_pos_adv = advantages >= 0
    is_low_kl = seq_kl <= off_policy_threshold
    return (is_pos_adv | is_low_kl).to(dtype=mask.dtype)


def ppo_clip_per_token(logp, logp_old, advantages, eps_low=0.2, eps_high=0.28):
    """The clipped token surrogate as TRL's "dapo"/"grpo" and slime's compute_policy_loss write it."""
    coef_1 = torch.exp(logp - logp_old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    return -torch.min(coef_1 * advantages, coef_2 * advantages)


def test_cispo_is_trls(x):
    x = {**x, "logp_old": x["logp"] - 1.8 * (torch.arange(T) % 3 == 0).double()}     # r = e^1.8 > 5 on some tokens
    m = assert_same(x, "cispo", lambda lp: trl_cispo(lp, x["logp_old"], adv(x)), x["mask"].sum())
    assert 0 < m["clip_frac"] < 1


def test_opsm_is_trls(x):
    def per_token(lp):
        keep = trl_off_policy_mask(x["adv"].unsqueeze(-1), lp, x["logp_mu"], x["mask"], 0.5)
        return ppo_clip_per_token(lp, x["logp_old"], adv(x)) * keep

    m = assert_same(x, "opsm", per_token, x["mask"].sum())
    assert 0 < m["masked_frac"] < 0.5


# ------------------------------------------------------------------ slime

def slime_opsm_mask(advantages, log_probs, old_log_probs, loss_mask, opsm_delta=1e-4):
    """THUDM/slime 624b824, slime/utils/ppo_utils.py, compute_opsm_mask (π_old: `old_log_probs`
    without --use-rollout-logprobs)."""
    seq_kl = ((old_log_probs - log_probs.detach()) * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)
    return (~((advantages < 0) & (seq_kl > opsm_delta))).double().unsqueeze(-1)


def test_opsm_old_is_slimes(x):
    def per_token(lp):
        return ppo_clip_per_token(lp, x["logp_old"], adv(x)) * slime_opsm_mask(x["adv"], lp, x["logp_old"], x["mask"])

    m = assert_same(x, "opsm-old", per_token, B * L)
    assert 0 < m["masked_frac"] < 0.6


def test_the_inputs_decide_both_ways_where_it_matters(x):
    """Every threshold sees tokens or sequences on both of its sides (the metric assertions above),
    and no log-ratio reaches bench's ±20 clamp (where bench and the unclamped rules would part)."""
    assert ((x["logp"] - x["logp_mu"]).abs() < 20).all() and ((x["logp"] - x["logp_old"]).abs() < 20).all()
    drift = ((x["logp_mu"] - x["logp"]) * x["mask"]).sum(-1) / x["mask"].sum(-1)
    assert ((drift > 0.5) & (x["adv"] < 0)).any() and ((drift > 0.5) & (x["adv"] > 0)).any()
    assert math.isfinite(float(drift.sum()))


# ------------------------------------------------------------------ OpenRLHF, SkyRL

def openrlhf_icepop(log_probs, old_log_probs, rollout_log_probs, advantages, low=0.5, high=5.0, eps_low=0.2,
                    eps_high=0.28):
    """OpenRLHF/OpenRLHF 3c3be62, openrlhf/models/loss.py, PolicyLoss.forward with
    is_correction_type "icepop": ρ = π_old/μ per token (no clamp), ρ·1{low ≤ ρ ≤ high} (inclusive,
    detached) times the PPO-clipped per-token loss."""
    ratio = torch.exp(torch.clamp(log_probs - old_log_probs, -20, 20))
    loss = -torch.min(ratio * advantages, ratio.clamp(1 - eps_low, 1 + eps_high) * advantages)
    vllm_is = torch.exp(old_log_probs - rollout_log_probs).detach()
    vllm_is = vllm_is * ((vllm_is >= low) & (vllm_is <= high))
    return vllm_is * loss


def test_icepop_is_openrlhfs(x):
    """OpenRLHF's token mean over the step's response tokens: bench's loss times B·L/N."""
    m = assert_same(x, "icepop", lambda lp: openrlhf_icepop(lp, x["logp_old"], x["logp_mu"], adv(x)),
                    x["mask"].sum())
    assert 0 < m["masked_frac"] < 0.5


def skyrl_sequence_mask(old_log_probs, rollout_logprobs, loss_mask, geo_mask_low=0.99, geo_mask_high=1.01):
    """NovaSky-AI/SkyRL a956457, skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py,
    compute_sequence_mask with sequence_mask_metric "geometric": the geometric mean of π_old/μ."""
    n = loss_mask.sum(-1, keepdim=True).clamp(min=1)
    g = torch.exp(torch.clamp(((old_log_probs - rollout_logprobs) * loss_mask).sum(-1, keepdim=True) / n, -20, 20))
    return (~(g > geo_mask_high) & ~(g < geo_mask_low)).double()


def test_skyrls_geometric_mask_is_grpo_geo_mask_with_its_bounds_inverted(x):
    """SkyRL bounds the geometric mean of ρ = π_old/μ, verl (and bench) that of μ/π_old: SkyRL's
    [0.99, 1.01] is bench's --geo-lo 1/1.01 --geo-hi 1/0.99. SkyRL multiplies the mask into the loss
    mask but divides by the mini-batch's original tokens (baked into the advantages), so its loss is
    bench's times B·L/N."""
    x = {**x, "logp_mu": x["logp_old"] - 0.04 * torch.randn(x["logp_old"].shape, generator=torch.Generator()
                                                                .manual_seed(5), dtype=torch.float64)}
    cfg = AlgoConfig(max_len=L, geo_lo=1 / 1.01, geo_hi=1 / 0.99)

    def per_token(lp):
        return ppo_clip_per_token(lp, x["logp_old"], adv(x)) * skyrl_sequence_mask(x["logp_old"], x["logp_mu"],
                                                                                   x["mask"])

    m = assert_same(x, "grpo-geo-mask", per_token, x["mask"].sum(), cfg)
    assert 0.1 < m["masked_frac"] < 0.9
