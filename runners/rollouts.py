"""One training step's rollouts: G responses to each prompt from the rollout engine, packed for
the training engine, with μ's log-probability of every sampled token and, for an algorithm that
reads it (Score Centering: bench/algorithms.py `needs_distribution`), μ's whole log-distribution
at every response position, which the built-in engine records while it samples."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

from bench.engines import Sampling, make_engine
from bench.errors import ConfigError

from .train_engine import Batch


def engine_batch(cfg) -> dict:
    """The built-in engine's decode batch of run config `cfg`: `max_batch` where `rollout_max_batch`
    is set, else the engine's default."""
    return {"max_batch": cfg.rollout_max_batch} if cfg.rollout_max_batch else {}


def start_engine(plan, master, tok, **torch_kw):
    """The rollout engine of RunPlan `plan` (runners/plan.py) at the weights of `master` (the fp32
    model, copied: the engine converts its copy to the rollout format) with tokenizer `tok`, at
    the run's decode batch (`rollout_max_batch`) and decode attention (`cascade_attention`);
    `torch_kw`: the built-in engine's other options. vLLM loads the model from its path."""
    kw = ({"model": copy.deepcopy(master), "tokenizer": tok, "device": str(plan.device), **engine_batch(plan.cfg),
           "cascade_attention": plan.cfg.cascade_attention, **torch_kw}
          if plan.engine == "torch" else {"gpu_memory_utilization": plan.cfg.gpu_memory_utilization})
    return make_engine(plan.engine, plan.model.path, plan.precision.rollout, **kw)


@contextmanager
def recording_distributions(engine, on: bool):
    """The built-in engine records μ's distributions while the block samples, when `on`; never for
    the evaluations (their distributions would be split × m × T × V values)."""
    if not on:
        yield
        return
    if not hasattr(engine, "record_distributions"):
        raise ConfigError(f"this algorithm reads μ's whole distribution at every position, which the "
                          f"{getattr(engine, 'name', 'rollout')} engine does not return: use --engine torch")
    engine.record_distributions = True
    try:
        yield
    finally:
        engine.record_distributions = False


def sampled_logprobs(samples: list, t_max: int) -> torch.Tensor:
    """log μ of each sample's tokens as the rollout engine reported them [N, t_max] (0 beyond a
    sample's length)."""
    mu = torch.zeros(len(samples), t_max)
    for k, s in enumerate(samples):
        mu[k, :len(s.logprobs)] = torch.tensor(s.logprobs)
    return mu


def draw(engine, prompts: list[str], prompt_ids: list[list[int]], g: int, sp: Sampling, pad: int, device,
         distributions: bool = False):
    """(samples per prompt, the packed batch on `device`, μ of the sampled tokens [N, T] on the CPU,
    μ's log-distributions [N, T, V] on `device` or None): N = len(prompts)·g rows, prompt-major;
    the distributions are 0 past each response's end (where the batch's mask is 0)."""
    with recording_distributions(engine, distributions):
        samples = engine.generate(prompts, g, sp)
    flat = [s for row in samples for s in row]
    batch = Batch.pack([p for p in prompt_ids for _ in range(g)], [s.token_ids for s in flat], pad, device)
    logp_mu = sampled_logprobs(flat, batch.mask.shape[1])
    logq = None
    if distributions:
        logq = torch.zeros((*batch.mask.shape, flat[0].distributions.shape[-1]))
        for i, s in enumerate(flat):
            logq[i, :len(s.token_ids)] = s.distributions
        logq = logq.to(device)
    return samples, batch, logp_mu, logq
