"""The seven algorithms, in the order the leaderboard shows them: one spec table (name, one-line
description, what the loss averages over).

A table that neither the trainer nor the app owns: the losses live in runners/algos.py (which
registers exactly these names, refusing any other; a test keeps the two equal) and the
leaderboard reads only the store and this table, so it can show cells that have not been run
yet. The equations are in runners/algos.py and docs/training.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlgoConfig:
    """Hyper-parameters shared by the losses."""

    max_len: int = 64            # L: the Dr.GRPO token-sum normaliser (the max response length)
    C: float = 3.0               # truncation / masking threshold of the IS weights
    eps_lo: float = 0.2          # PPO clip 1 − ε_lo
    eps_hi: float = 0.28         # clip-higher 1 + ε_hi
    gspo_lo: float = 3e-4        # GSPO's sequence clip range
    gspo_hi: float = 4e-4



@dataclass(frozen=True)
class Algorithm:
    name: str
    description: str                # one line, as `bench run --algo list` prints it
    mean_over: str = "sequences"    # what the loss averages over: "sequences" (all B) or "nonempty" (≥ 1 token)


SPECS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("pg-seq-is", "REINFORCE with the sequence IS weight w = π_θ/μ, unclipped (unbiased; Eq. 5)"),
    Algorithm("pg-seq-tis", "REINFORCE with the sequence IS weight truncated at C: min(w, C) (Eq. 6)"),
    Algorithm("pg-seq-mis", "REINFORCE with the sequence IS weight masked above C: w·1{w ≤ C} (Eq. 7)"),
    Algorithm("grpo", "Dr.GRPO: token PPO-clip (ε 0.2 / clip-higher 0.28) against π_old; ignores μ (Eq. 8)"),
    Algorithm("grpo-token-tis", "Dr.GRPO with per-token IS truncation: sg(min(ρ_t, C)) · PPO-clip (Eq. 9)"),
    Algorithm("grpo-seq-mis", "Dr.GRPO with the sequence IS weight ρ masked above C (Eq. 10)"),
    Algorithm("gspo", "GSPO: sequence ratio s = geometric mean of r_t, clipped to [1−3e-4, 1+4e-4]",
              mean_over="nonempty"),
)}

ALGORITHMS = tuple(SPECS)
