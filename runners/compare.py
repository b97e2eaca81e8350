"""Adaptive comparison of two cells (`bench compare A B`): seeds of both in batches until AdaStop
(Mathieu et al., "AdaStop: adaptive statistical testing for sound comparisons of Deep RL agents",
TMLR 2024; the `adastop` package) decides at the stated level.

AdaStop is a group-sequential permutation test: with n seeds per batch and at most K batches
(max_seeds = n·K per cell), after batch k it compares the statistic
T_k = k·|mean(A) − mean(B)| (over the k·n scores of each) with the boundary b_k taken from the
permutation distribution of the batch-wise mean differences, conditioned on no earlier
rejection, so that the level α is spent as α·k/K up to batch k (a Pocock-like spending). It
rejects equality ("larger" / "smaller": A's mean score is above / below B's) at the first batch
where T_k > b_k; after the K-th batch without rejection the answer is "equal" (no difference
shown at that level with max_seeds seeds; not a proof of equality). The family-wise error of a
false "larger"/"smaller" is at most α.

Scores per seed (`metric`): peak — the run's peak split accuracy; steps-to-pass — the steps to
converged, a run that did not pass scored at its max_steps (the most it was allowed: censored,
so a failing seed counts as the slowest possible). Seeds are 0, 1, 2, ... of each cell; finished
runs of a (cell, seed) are reused (runners/sweep.py), only the missing ones are run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bench import statuses
from bench.errors import ConfigError

METRICS = ("peak", "steps-to-pass")
PERMUTATIONS = 10_000          # AdaStop's B: permutations sampled when there are more than this


@dataclass
class Comparison:
    """AdaStop over two score sequences, fed one batch at a time (`add`)."""

    n: int                      # seeds per batch
    K: int                      # batches at most
    alpha: float = 0.05
    seed: int = 0               # of AdaStop's permutation sampling
    names: tuple[str, str] = ("A", "B")
    scores: dict[str, list[float]] = field(default_factory=dict)
    batches: int = 0
    decision: str = "continue"  # continue | larger | smaller | equal

    def __post_init__(self):
        from adastop import MultipleAgentsComparator

        if self.n < 1 or self.K < 1:
            raise ConfigError("a comparison needs at least one seed per batch and one batch")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"--level must be in (0, 1), got {self.alpha!r}")
        self._test = MultipleAgentsComparator(n=self.n, K=self.K, B=PERMUTATIONS, alpha=self.alpha, seed=self.seed)
        self.scores = {name: [] for name in self.names}

    @property
    def finished(self) -> bool:
        return self.decision != "continue"

    def add(self, a: list[float], b: list[float]) -> str:
        """Feed the next batch (n scores of each cell); returns the decision after it."""
        if self.finished:
            raise ValueError("the comparison has decided already")
        if len(a) != self.n or len(b) != self.n:
            raise ValueError(f"a batch is {self.n} scores of each cell, got {len(a)} and {len(b)}")
        self.scores[self.names[0]] += [float(x) for x in a]
        self.scores[self.names[1]] += [float(x) for x in b]
        self._test.partial_compare({k: np.array(v) for k, v in self.scores.items()}, verbose=False)
        self.batches += 1
        self.decision = next(iter(self._test.decisions.values()))
        return self.decision


def decide(a: list[float], b: list[float], n: int, K: int, alpha: float = 0.05, seed: int = 0) -> tuple[str, int]:
    """(decision, batches used) of AdaStop on the score sequences `a` and `b` (at least n·K each,
    or as many as it takes), fed n at a time."""
    c = Comparison(n, K, alpha, seed)
    while not c.finished:
        k = c.batches
        c.add(a[k * n:(k + 1) * n], b[k * n:(k + 1) * n])
    return c.decision, c.batches


def score(run, metric: str) -> float:
    """A run's score (module doc): peak split accuracy, or steps to pass (max_steps if it did not)."""
    if metric == "peak":
        return float(run.peak_accuracy if run.peak_accuracy is not None else 0.0)
    if run.status == statuses.CONVERGED and run.steps_to_target is not None:
        return float(run.steps_to_target)
    return float((run.config or {}).get("max_steps", run.step))


def parse_cell(text: str) -> tuple[str, str]:
    """`ALGO:DTYPE` (pg-seq-is:fp16, grpo:rollout=nvfp4,train=fp16) → (algo, dtype), checked."""
    from bench.precision import Precision

    from .algos import check_algo

    algo, sep, dtype = text.partition(":")
    if not sep or not algo or not dtype:
        raise ConfigError(f"bad cell {text!r}: write ALGO:DTYPE, e.g. pg-seq-is:fp16 or "
                          "grpo:rollout=nvfp4,train=fp16")
    check_algo(algo, f" in {text!r}")
    Precision.parse(dtype)
    return algo, dtype


def in_words(decision: str, names: tuple[str, str], metric: str) -> str:
    a, b = names
    what = "peak split accuracy" if metric == "peak" else "steps to pass"
    if decision == "larger":
        return f"{a} has the larger mean {what} than {b}"
    if decision == "smaller":
        return f"{a} has the smaller mean {what} than {b}"
    return f"no difference in mean {what} shown between {a} and {b}"


def run_comparison(store, cells: list[tuple[str, str]], metric: str, max_seeds: int, batch: int,
                   alpha: float, build_id, engine: str, preset: str, overrides: dict, jobs: int = 1,
                   log=print, device: str = "cpu", ckpt_root=None) -> dict:
    """Compare two cells (module doc): run (or reuse) seeds in batches of `batch` per cell until
    AdaStop decides or max_seeds are used. Returns decision, words, seeds used, level, scores."""
    from bench.precision import Precision
    from bench.store import Run, session

    from .plan import RunError
    from .sweep import run_grid

    if metric not in METRICS:
        raise ConfigError(f"--metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if batch < 1 or max_seeds < batch:
        raise ConfigError(f"--max-seeds ({max_seeds}) must be at least --batch ({batch}) >= 1")
    if "seed" in overrides:
        raise ConfigError("bench compare picks the seeds (0, 1, ...): give no --seed")
    names = tuple(f"{a}:{d}" for a, d in cells)
    if names[0] == names[1]:
        raise ConfigError("compare two different cells")
    comp = Comparison(batch, max_seeds // batch, alpha, names=names)
    runs: dict[str, list[str]] = {n: [] for n in names}
    while not comp.finished:
        seeds = list(range(comp.batches * batch, (comp.batches + 1) * batch))
        batch_scores = []
        for (algo, dtype), name in zip(cells, names):
            results = run_grid(store, [algo], [Precision.parse(dtype)], build_id, engine, preset, overrides,
                               jobs, log=log, seeds=seeds, device=device, ckpt_root=ckpt_root, decide_early=False)
            with session(store) as s:
                got = []
                for r in results:
                    run = s.get(Run, r["run"]) if r["run"] else None
                    if run is None or run.status not in statuses.FINISHED:
                        raise RunError(f"{name} seed {r.get('seed')} did not finish ({r['status']}); rerun "
                                       "`bench compare` to retry it (finished seeds are reused)")
                    got.append(score(run, metric))
                    runs[name].append(run.id)
            batch_scores.append(got)
        comp.add(*batch_scores)
        log(f"batch {comp.batches}: {names[0]} {np.mean(comp.scores[names[0]]):.4g}, {names[1]} "
            f"{np.mean(comp.scores[names[1]]):.4g} over {len(comp.scores[names[0]])} seeds each: {comp.decision}")
    return {"cells": list(names), "metric": metric, "decision": comp.decision,
            "in_words": in_words(comp.decision, names, metric), "level": alpha, "batch": batch,
            "max_seeds": max_seeds, "batches": comp.batches, "seeds_used": len(comp.scores[names[0]]),
            "scores": comp.scores, "means": {n: float(np.mean(v)) for n, v in comp.scores.items()}, "runs": runs}
