"""The algorithms, in the order the leaderboard shows them: one spec table (name, one-line
description, what its correction is: anchor, unit, kind, thresholds; who ships it) and the
losses' hyper-parameters (`AlgoConfig`, knobs).

A table that neither the trainer nor the app owns: the losses live in runners/algos.py (which
registers exactly these names, refusing any other; a test keeps the two equal) and the
leaderboard reads only the store and this table, so it can show cells that have not been run
yet. The equations are in runners/algos.py and docs/algorithms.md.

What a correction is, in four words (`bench run --algo list`, docs/algorithms.md):
- anchor: the distribution its correction ratio divides by: "μ" (the rollout engine's) or
  "π_old" (the trainer's recompute at the sampling weights); "-" for none;
- unit: "token" or "sequence" (what one weight or one mask decision covers);
- kind: "weight" (an IS weight multiplies the term), "mask" (a 0/1 decision), "weight+mask" (a
  weight kept only inside bounds), "clip" (PPO-style clipping of the ratio, no μ correction);
- thresholds: the AlgoConfig knobs it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from bench.knobs import knob


@dataclass
class AlgoConfig:
    """Hyper-parameters of the losses. The first six are stored in every run's config; those
    after them were added later and are `fingerprint="when-set"` (bench/fingerprint.py): a
    threshold at its default leaves stored cells as they were."""

    max_len: int = knob(64, help="L: the Dr.GRPO token-sum normaliser (follows --max-tokens).", unit="tokens",
                        ge=1, cli=False)
    C: float = knob(3.0, help="Truncation / masking threshold of the IS weights (pg-seq-tis, pg-seq-mis, "
                    "grpo-token-tis, grpo-seq-mis).", gt=0, cli=False)
    eps_lo: float = knob(0.2, help="PPO clip 1 − ε_lo (every algorithm on the clipped GRPO surrogate).", gt=0,
                         lt=1, cli=False)
    eps_hi: float = knob(0.28, help="PPO clip-higher 1 + ε_hi.", gt=0, cli=False)
    gspo_lo: float = knob(3e-4, help="GSPO's sequence clip 1 − lo.", gt=0, lt=1, cli=False)
    gspo_hi: float = knob(4e-4, help="GSPO's sequence clip 1 + hi.", gt=0, cli=False)
    icepop_lo: float = knob(0.5, help="icepop: keep a token's ρ_t = π_old/μ only at or above this (verl's "
                            "decoupled_token_icepop).", ge=0, fingerprint="when-set", verl=True)
    icepop_hi: float = knob(5.0, help="icepop: keep a token's ρ_t only at or below this.", gt=0,
                            fingerprint="when-set", verl=True)
    pg_icepop_lo: float = knob(0.2, help="pg-icepop: keep a token's r_t = π_θ/μ only at or above this "
                               "(prime-rl's ratio_low).", ge=0, fingerprint="when-set")
    pg_icepop_hi: float = knob(5.0, help="pg-icepop: keep a token's r_t only at or below this (ratio_high).", gt=0,
                               fingerprint="when-set")
    trm_k2: float = knob(2.5, help="trm: reject a sequence when any token's k2 = ½(log π_old − log μ)² exceeds "
                         "this (verl's seq_max_k2; its documented example).", gt=0, fingerprint="when-set",
                         verl=True)
    geo_lo: float = knob(0.999, help="grpo-geo-mask: keep a sequence whose geometric-mean μ/π_old is at or "
                         "above this (verl's *_geo_rs).", gt=0, fingerprint="when-set", verl=True)
    geo_hi: float = knob(1.001, help="grpo-geo-mask: ... and at or below this.", gt=0, fingerprint="when-set",
                         verl=True)
    dppo_tv_delta: float = knob(0.15, help="dppo-tv: the binary-TV trust region δ on π_θ − μ (token "
                                "probabilities; verl's example).", gt=0, fingerprint="when-set")
    dppo_kl_delta: float = knob(0.05, help="dppo-kl: the binary-KL trust region δ (verl's example).", gt=0,
                                fingerprint="when-set")
    dppo_c: float = knob(10.0, help="dppo-tv, dppo-kl: truncate the IS weight π_θ/μ at this (Stable-RL's "
                         "clip_ratio_c).", gt=0, fingerprint="when-set")
    cispo_eps_hi: float = knob(5.0, help="cispo: the IS weight π_θ/π_old truncated above at this (TRL's "
                               "epsilon_high for cispo).", gt=0, fingerprint="when-set", verl=True)
    ipo_eps: float = knob(0.1, help="ipo: mask a token when |π_θ − μ| (probabilities) exceeds this (prime-rl's "
                          "default).", gt=0, le=1, fingerprint="when-set")
    ipo_kl_coef: float = knob(1e-3, help="ipo: the coefficient of the Σ_t (log π_θ/μ)² penalty.", ge=0,
                              fingerprint="when-set")
    opsm_delta: float = knob(0.5, help="opsm: drop a sequence with A < 0 whose mean_t(log μ − log π_θ) exceeds "
                             "this (TRL's off_policy_mask_threshold, its docs' example).", ge=0,
                             fingerprint="when-set")
    opsm_old_delta: float = knob(1e-4, help="opsm-old: drop a sequence with A < 0 whose mean_t(log π_old − "
                                 "log π_θ) exceeds this (slime's --opsm-delta).", ge=0, fingerprint="when-set")
    sc_tis_hi: float = knob(2.0, help="sc: the vocabulary IS weights w_v = π_θ(v)/μ(v) truncated at this (vime's "
                            "TIS upper bound in its lab settings).", gt=0, fingerprint="when-set")


ALGO_KNOBS = frozenset(f.name for f in fields(AlgoConfig))
PPO = ("eps_lo", "eps_hi")           # the clipped GRPO surrogate's thresholds


@dataclass(frozen=True)
class Algorithm:
    name: str
    description: str                # one line, as `bench run --algo list` prints it
    anchor: str = "μ"               # the correction ratio's denominator: "μ", "π_old" or "-"
    unit: str = "sequence"          # "token" or "sequence"
    kind: str = "weight"            # "weight", "mask", "weight+mask" or "clip"
    thresholds: tuple[str, ...] = ()     # AlgoConfig knobs it reads
    source: str = "FP16 paper"      # who ships this rule (docs/algorithms.md has the file and commit)
    mean_over: str = "sequences"    # what the loss averages over: "sequences" (all B) or "nonempty" (≥ 1 token)
    needs_distribution: bool = False    # reads μ's whole distribution at every position (the built-in engine's)


SPECS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("pg-seq-is", "REINFORCE with the sequence IS weight w = π_θ/μ, unclipped (unbiased; Eq. 5)"),
    Algorithm("pg-seq-tis", "REINFORCE with the sequence IS weight truncated at C: min(w, C) (Eq. 6)",
              thresholds=("C",)),
    Algorithm("pg-seq-mis", "REINFORCE with the sequence IS weight masked above C: w·1{w ≤ C} (Eq. 7)",
              kind="weight+mask", thresholds=("C",)),
    Algorithm("grpo", "Dr.GRPO: token PPO-clip (ε 0.2 / clip-higher 0.28) against π_old; ignores μ (Eq. 8)",
              anchor="π_old", unit="token", kind="clip", thresholds=PPO),
    Algorithm("grpo-token-tis", "Dr.GRPO with per-token IS truncation: sg(min(ρ_t, C)) · PPO-clip (Eq. 9)",
              unit="token", thresholds=("C", *PPO)),
    Algorithm("grpo-seq-mis", "Dr.GRPO with the sequence IS weight ρ masked above C (Eq. 10)",
              kind="weight+mask", thresholds=("C", *PPO)),
    Algorithm("gspo", "GSPO: sequence ratio s = geometric mean of r_t, clipped to [1−3e-4, 1+4e-4]",
              anchor="π_old", kind="clip", thresholds=("gspo_lo", "gspo_hi"), source="GSPO (verl, TRL)",
              mean_over="nonempty"),
    Algorithm("icepop", "IcePop (verl): sg(ρ_t·1{lo ≤ ρ_t ≤ hi}) · PPO-clip, ρ_t = π_old/μ per token, [0.5, 5]",
              unit="token", kind="weight+mask", thresholds=("icepop_lo", "icepop_hi", *PPO),
              source="verl, slime/Miles, OpenRLHF, NeMo-RL"),
    Algorithm("pg-icepop", "IcePop (prime-rl): −1{lo ≤ r_t ≤ hi}·r_t·A, r_t = π_θ/μ not detached, no clip, "
              "[0.2, 5]", unit="token", kind="weight+mask", thresholds=("pg_icepop_lo", "pg_icepop_hi"),
              source="prime-rl"),
    Algorithm("trm", "Trust-region masking: PPO-clip, a sequence rejected when any token's ½ℓ_t² > 2.5 "
              "(verl's seq_max_k2)", kind="mask", thresholds=("trm_k2", *PPO), source="verl (rollout_rs)"),
    Algorithm("grpo-geo-mask", "PPO-clip, a sequence kept when the geometric mean of μ/π_old is in "
              "[0.999, 1.001] (verl's seq_mean_k1)", kind="mask", thresholds=("geo_lo", "geo_hi", *PPO),
              source="verl (rollout_rs geo presets)"),
    Algorithm("dppo-tv", "DPPO binary-TV: −A·sg(min(π_θ/μ, C))·M_t·log π_θ, M_t drops a token whose π_θ − μ "
              "left δ 0.15 in A's direction", unit="token", kind="weight+mask",
              thresholds=("dppo_tv_delta", "dppo_c"), source="DPPO (Stable-RL, verl example)"),
    Algorithm("dppo-kl", "DPPO binary-KL: as dppo-tv with the Bernoulli KL(μ‖π_θ) > δ 0.05 in A's direction",
              unit="token", kind="weight+mask", thresholds=("dppo_kl_delta", "dppo_c"),
              source="DPPO (Stable-RL, verl example)"),
    Algorithm("cispo", "CISPO (TRL): −sg(min(r_t, 5))·A·log π_θ, r_t = π_θ/π_old truncated above only",
              anchor="π_old", unit="token", kind="weight", thresholds=("cispo_eps_hi",), source="TRL, MiniMax-M1"),
    Algorithm("cispo-two-sided", "CISPO (verl): −sg(clamp(r_t, 1−ε_lo, 1+ε_hi))·A·log π_θ", anchor="π_old",
              unit="token", kind="weight", thresholds=PPO, source="verl"),
    Algorithm("ipo", "IPO (prime-rl's default): −1{|π_θ − μ| ≤ 0.1}·r_t·A + 1e-3·(log r_t)², r_t = π_θ/μ not "
              "detached", unit="token", kind="mask", thresholds=("ipo_eps", "ipo_kl_coef"), source="prime-rl"),
    Algorithm("opsm", "Off-policy sequence masking (TRL, DeepSeek-V3.2): PPO-clip, drop a sequence with A < 0 "
              "and mean_t log(μ/π_θ) > 0.5", kind="mask", thresholds=("opsm_delta", *PPO), source="TRL"),
    Algorithm("opsm-old", "Off-policy sequence masking (slime): PPO-clip, drop a sequence with A < 0 and "
              "mean_t log(π_old/π_θ) > 1e-4", anchor="π_old", kind="mask", thresholds=("opsm_old_delta", *PPO),
              source="slime/Miles"),
    Algorithm("sc", "Score Centering: REINFORCE with the score centred by its expectation under μ's whole "
              "distribution, −A·[sg(w_a) log π_θ(a) − Σ_v sg(μ_v w_v) log π_θ(v)], w = min(π_θ/μ, 2)",
              unit="token", kind="weight", thresholds=("sc_tis_hi",), source="vime (arXiv 2609.20807)",
              needs_distribution=True),
)}

ALGORITHMS = tuple(SPECS)
PAPER_ALGORITHMS = ALGORITHMS[:7]        # the FP16 paper's seven (docs/algorithms.md, Eqs. 5-10 and GSPO)
ALGO_GROUPS = {"paper": PAPER_ALGORITHMS, "corrections": ALGORITHMS[7:], "all": ALGORITHMS}   # bench sweep --algo
