"""Where a real model's run spends its memory: the native trainer at the small preset (8 prompts × 8,
128 tokens, micro-batches of 2,048 padded tokens) on a model's build problems, one precision pair,
a few steps; each resident part's size beside the process's peak resident set.

    python benchmarks/run_memory.py [--model smollm2-135m-warm] [--dtype fp16] [--steps 2] [--threads 2]
                                    [--evaluate] [--rollout-max-batch N] [--no-trim]
                                    [--[no-]gradient-checkpointing] [--microbatch-tokens N]

`--evaluate` adds one evaluation after the steps (the split avg@2 and the preset's MATH-500
problems: a larger batch for the rollout engine than a step's); `--rollout-max-batch` overrides
the preset's rows decoded together. Each step prints the resident set it keeps (`rss_mb`, after
the trainer hands the C heap's free pages back) and the peak so far; `--no-trim` leaves the
free pages with glibc, as before bench/device.py `release_free_memory`, to show what the trim
saves (run each in its own process: the peak never decreases). `--[no-]gradient-checkpointing`
(the small preset sets it) and `--microbatch-tokens` set the run's knobs of those names (resource
knobs: the same run's arithmetic).

The parts are counted from the tensors themselves: the fp32 master, its gradients and AdamW's two
moments, the training engine's compute copy in its format, the rollout engine's copy (and its
preallocated KV cache where it keeps one). What the peak holds beyond them and the process before
the models were loaded (Python, torch, transformers) is the step's transients: activations kept
for the backward pass, a micro-batch's logits, the rollout's KV cache, the allocator's slack.
"""

from __future__ import annotations

import argparse
import logging
import tempfile

import torch

from bench.device import peak_memory_mb, resident_mb
from bench.models import build_defaults, resolve_model
from bench.precision import Precision
from bench.problems import SourceSpec, load_problems
from bench.provenance import cpu_summary
from bench.store import open_store
import runners.trainer as trainer_module
from runners.plan import RunPlan
from runners.presets import get_preset
from runners.trainer import NativeTrainer

MIB = 2 ** 20


def tensor_mib(tensors) -> float:
    """Bytes of distinct tensor storages (a tied weight counted once), MiB."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total / MIB


def parts(trainer: NativeTrainer) -> tuple[dict[str, float], dict[str, float]]:
    """MiB of each resident part of a trainer after a step (module doc): those loaded with the
    models, and those the first step allocates and keeps."""
    learner, master = trainer.learner, trainer.learner.master
    loaded = {"fp32 master weights": tensor_mib(master.parameters())}
    if learner.compute is not master:
        loaded[f"compute copy ({trainer.precision.train})"] = tensor_mib(learner.compute.parameters())
    engine_model = getattr(trainer.engine, "model", None)
    if isinstance(engine_model, torch.nn.Module):
        loaded[f"rollout engine's copy ({trainer.precision.rollout})"] = tensor_mib(engine_model.parameters())
    state = [v for s in learner.opt.state.values() for v in s.values() if torch.is_tensor(v)]
    kept = {"gradients": tensor_mib(p.grad for p in master.parameters()), "AdamW moments": tensor_mib(state)}
    pool = getattr(trainer.engine, "_cache_pool", None)
    if pool is not None:
        kept["the rollout engine's KV-cache buffers"] = pool.nbytes / MIB
    return loaded, kept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-warm", help="what `bench build --model` takes")
    ap.add_argument("--dtype", default="fp16", help="the precision pair")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--evaluate", action="store_true", help="one evaluation after the steps")
    ap.add_argument("--rollout-max-batch", type=int, default=None)
    ap.add_argument("--no-trim", action="store_true", help="leave the C heap's free pages with glibc")
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                    help="the run knob (the small preset sets it): recompute activations in backward")
    ap.add_argument("--microbatch-tokens", type=int, default=None, help="the run knob --max-tokens-per-microbatch")
    a = ap.parse_args()
    if a.no_trim:
        trainer_module.release_free_memory = lambda device: None
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    ref = resolve_model(a.model)
    problems = load_problems(SourceSpec(build_defaults(ref)["source"], limit=200))
    before = resident_mb()
    cfg = get_preset("small", rollout_max_batch=a.rollout_max_batch, gradient_checkpointing=a.gradient_checkpointing,
                     **({"max_tokens_per_microbatch": a.microbatch_tokens} if a.microbatch_tokens else {}))
    cfg.threads = a.threads
    if not a.evaluate:
        cfg.benchmarks = []
    store = open_store(f"sqlite:///{tempfile.mkdtemp()}/m.db")
    plan = RunPlan("pg-seq-is", Precision.parse(a.dtype), cfg, "mem", "mem", ref, "torch", "cpu")
    trainer = NativeTrainer(store, "mem", plan, problems, None)
    loaded = resident_mb()
    for _ in range(a.steps):
        m = trainer.train_step()
        trainer.step += 1
        print(f"  step {trainer.step:3d}: kept {resident_mb():7.0f} MiB, peak {peak_memory_mb('cpu'):7.0f} MiB, "
              f"{m['response_len']:.0f} tokens a response, rollouts {m['time_rollout']:.1f} s, "
              f"update {m['time_update']:.1f} s", flush=True)
    if a.evaluate:
        trainer._evaluate()              # its scores unrecorded: no run row in this throwaway store
    loaded_parts, kept = parts(trainer)
    peak = peak_memory_mb("cpu")
    trim = (", no trim" if a.no_trim else "") + ("" if cfg.gradient_checkpointing else ", no gradient checkpointing")
    print(f"{ref.name}, pair {a.dtype}{trim}, small preset ({cfg.prompts_per_step} × {cfg.samples_per_prompt}, "
          f"≤{cfg.max_tokens} tokens, micro-batches of {cfg.max_tokens_per_microbatch} tokens, rows decoded together "
          f"{cfg.rollout_max_batch or 512}), {a.steps} steps{' and an evaluation' if a.evaluate else ''}, "
          f"{a.threads} thread(s); {cpu_summary()}")
    rows = [("process before the models (Python, torch, transformers)", before),
            ("loading the models, tokenizer and grader", loaded - before),
            *((f"  of which {name}", mib) for name, mib in loaded_parts.items()),
            *((f"kept from the first step: {name}", mib) for name, mib in kept.items()),
            ("a step's transients (activations, logits, KV cache, slack)", peak - loaded - sum(kept.values())),
            ("peak resident set", peak)]
    for name, mib in rows:
        print(f"  {name:60s} {mib:8.0f} MiB")
    print(f"  = {peak / 1024:.2f} GiB at the peak")
    trainer.close()


if __name__ == "__main__":
    main()
