"""The sampling seeds of a native run's evaluations: independent across the run's seeds.

An evaluation at step t of a run with seed s samples with

    eval_seed(stream, s, t) = stream + t + s · 2³²

(`stream`: SPLIT_EVAL for the split's avg@m, and `split@train` with it; BENCHMARK_EVAL for every
benchmark). Each sample is then seeded by (that seed, its prompt, its index) (bench/engines:
`row_seed`), so two evaluations share their draws only when they share that seed. The map is
one-to-one over (s, t) for t < 2³², so seeds never share a step's draws, and seed 0 keeps the
draws of before (stream + t: stored seed-0 evaluations, the goldens that pin them and
`bench runs verify` of runs stored before stay valid). For seeds s ≥ 1 (below 4,294, steps below
10⁶) the values also lie apart from the other streams': an evaluation is at least 2³², training
rollouts (s·1,000,003 + t) and the calibration (30,000,001 + s) below it. Seed 0's, as before,
equal the training-rollout seeds of seed 10 eleven steps earlier (split) and of seed 20
fifty-seven steps earlier (benchmarks), sampled from other weights.
"""

from __future__ import annotations

SPLIT_EVAL = 10_000_019         # the split's avg@m (and split@train, on the same draws)
BENCHMARK_EVAL = 20_000_003     # every benchmark's avg@n
SEED_STRIDE = 2 ** 32           # one seed's evaluation seeds to the next's


def eval_seed(stream: int, seed: int, step: int) -> int:
    """The sampling seed of an evaluation at `step` of the run with `seed` (module docstring)."""
    return stream + step + seed * SEED_STRIDE
