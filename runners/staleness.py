"""Staleness (`RunConfig.staleness`, K; `bench run --staleness K`): the rollout engine samples
with the weights of K training steps ago (K rollout batches: K × updates_per_batch optimizer
updates), as an asynchronous RL trainer does (verl's
one-step-off and fully-async modes, AReaL's max_head_offpolicyness, prime-rl's
max_async_level, PipelineRL's max_lag), while the precision pair stays what it was. The two
ways a rollout stops matching the policy being trained are then logged apart.

Definitions, at step t (0-based: the step that turns θ_t into θ_{t+1}):
  K_eff  = min(K, t)                    the batch's effective staleness (`staleness_k`)
  μ      = the rollout engine at θ_{t−K_eff}, in the rollout format (the sampler)
  π_old  = the training engine at θ_{t−K_eff}, in the train format: the sampling parameters,
           so ρ = π_old/μ stays pure precision mismatch and the usual mismatch metrics
           (`kl_k3`, `prob_abs_diff_mean`, ...: bench/mismatch.py on π_old vs μ) measure
           precision only
  π_θ    = the training engine at θ_t, the weights being updated
  r = π_θ/π_old is the off-policy (staleness) part; w = π_θ/μ = r·ρ carries both.
Every algorithm reads these through LossInputs (`logp_old` = π_old, `logp_rollout` = μ) as
it always has; at K_eff = 0, π_old is π_θ (before the first of `updates_per_batch` updates).

Per-step metrics of the staleness part, on the batch's sampled response tokens, with the
conventions of bench/mismatch.py's precision metrics (π_old in μ's place, π_θ in π's), so the
two components are comparable number for number:
  staleness_kl_k3   mean over tokens of e^d − 1 − d, d = log π_θ − log π_old (k3 of KL[π_old‖π_θ])
  staleness_abs_dp  mean over tokens of |π_θ − π_old| in probability
Both are 0 at K_eff = 0 (no extra forward then); at K_eff > 0 π_θ costs one forward at the
current weights (the update's own forward when there is one update per batch and no
micro-batches) and π_old one no-grad forward of a second train-format model holding θ_{t−K}.

The queue (`WeightQueue`): the fp32 master weights from before each of the last K training steps,
θ_{t−K_eff}..θ_{t−1} at step t (the newest, θ_t, is the master itself: K copies, not K+1),
kept in host memory (they are only copied from: into the π_old model and the rollout engine).
After step t's update the oldest, θ_{max(0, t+1−K)}, goes to the rollout engine instead of the
master. Evaluations sample the current weights θ_t: the master is pushed for them and the
stale weights restored after, without the engine's sync statistics seeing either push, so
`rollout_weights_moved` / `rollout_update_to_step` still compare consecutive stale weights.
Checkpoints carry the queue, so a resumed run continues exactly. At K = 0 nothing of this
runs: the step is the code path of before, bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
from collections import deque

import torch

from bench.mismatch import kl_k3, prob_diff_stats


def staleness_metrics(logp_old: torch.Tensor, logp_cur: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """`staleness_kl_k3` and `staleness_abs_dp` of π_θ (`logp_cur`) against π_old (`logp_old`)
    on the masked tokens (module docstring)."""
    logp_old, logp_cur, mask = logp_old.detach().float(), logp_cur.detach().float(), mask.float()
    return {"staleness_kl_k3": kl_k3(logp_old, logp_cur, mask),
            "staleness_abs_dp": prob_diff_stats(logp_old, logp_cur, mask)["prob_abs_diff_mean"]}


NO_STALENESS = {"staleness_kl_k3": 0.0, "staleness_abs_dp": 0.0}


class WeightQueue:
    """The last K fp32 master snapshots and the train-format model that scores π_old at the
    oldest of them (module docstring)."""

    def __init__(self, k: int, learner):
        self.k, self.learner = k, learner
        self.snaps: deque[dict[str, torch.Tensor]] = deque()
        # the compute copy's twin (same format, same module tree and parameter order; for an fp32
        # run the compute copy is the master itself); none at K = 0
        self.model = copy.deepcopy(learner.compute).requires_grad_(False) if k else None

    @property
    def effective(self) -> int:
        """K_eff of the next step: how many updates old the rollout engine's weights are."""
        return len(self.snaps)

    def record(self, master: torch.nn.Module) -> None:
        """Before an update: keep θ_t, dropping what is more than K training steps old."""
        if not self.k:
            return
        with torch.no_grad():
            # on the host: the queue is only copied from (K fp32 copies of a 1.5B model are ~6 GB each)
            self.snaps.append({n: p.detach().to("cpu", copy=True) for n, p in master.named_parameters()})
        while len(self.snaps) > self.k:
            self.snaps.popleft()

    def rollout_weights(self, master: torch.nn.Module):
        """What the rollout engine samples the next step with: θ_{t+1−K} (the master at K = 0)."""
        return self.snaps[0].items() if self.snaps else master.named_parameters()

    @torch.no_grad()
    def old_logprobs(self, batch) -> torch.Tensor:
        """π_old: log-probs of `batch`'s response tokens by the train-format model at the oldest
        snapshot, θ_{t−K_eff} (micro-batched as the training engine's own forwards)."""
        for p, t in zip(self.model.parameters(), self.snaps[0].values(), strict=True):
            p.copy_(t)
        return self.learner.logprobs(batch, model=self.model)

    @contextlib.contextmanager
    def current_weights(self, engine, master: torch.nn.Module):
        """The rollout engine at the master's weights inside the block (evaluations), its stale
        weights again after; neither push counts in the engine's sync statistics."""
        if not self.snaps:
            yield
            return
        track = getattr(engine, "track_updates", None)
        stats = getattr(engine, "sync_stats", None)
        if track is not None:
            engine.track_updates = False
        try:
            engine.update_weights(master.named_parameters())
            yield
        finally:
            engine.update_weights(self.snaps[0].items())
            if track is not None:
                engine.track_updates = track
            if stats is not None:
                engine.sync_stats = stats

    # checkpoints
    def state(self) -> list[dict[str, torch.Tensor]]:
        return list(self.snaps)

    def load_state(self, snaps: list[dict[str, torch.Tensor]]) -> None:
        self.snaps = deque({n: t.cpu() for n, t in s.items()} for s in snaps)
