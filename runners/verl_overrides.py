"""The user's own verl settings: `--verl-override KEY=VALUE` (repeatable) on `bench run` and
`bench sweep` with `--trainer verl`, passed to `python -m verl.trainer.main_ppo` as Hydra overrides
with bench's own.

Every key of bench's command is one of two kinds, and every other key a third:

- **the cell's** (refused): keys bench sets from the cell or from one of its options, or a key
  above one of them (`actor_rollout_ref.actor.optim={lr:1}` would merge into `--lr`'s) — the
  algorithm's loss keys (`--algo` and its thresholds), the precision keys (`--dtype`), the seed keys
  (`--seed`, `--seeds`), the data, model, reward, logger and checkpoint paths of the run's own
  directory, and those a `bench run` option sets (`--lr` is `actor.optim.lr`, ...:
  `verl_runner.OWNERS`). An override of one would make the run something other than the cell it
  is stored as; the message names what sets it.
- **bench's defaults** (replaced): `DEFAULTS`, such as `data.max_prompt_length` and the micro-batch
  sizes. bench's value is only a default: the user's replaces it in place, so the command says
  each key once (a single `+`, Hydra's "add a key", is dropped there: verl's config has them all).
- **verl's own** (appended): any other key, `+key=value` for one verl's config does not have. verl
  itself validates them (`validate_config` on `--dry-run` and at launch).

Each accepted override is a resource or a setting, by the fingerprint rule of bench/fingerprint.py:
a **resource** says where and how fast the same run is computed (parallel sizes, micro-batches,
memory shares, offloading, compilation, checkpoint retention: `RESOURCE_PATTERNS`) and is never
part of the cell, as `--threads` is not (like a micro-batch size, it can change float rounding, not
the run's value); **every other key is a setting**, part of the cell's settings fingerprint. A key
bench does not know counts as a setting: two runs that may compute different things are never
pooled as seeds of one cell. They are stored in the run config as `verl_settings` (when-set: a run
without one keeps its fingerprint) and `verl_resources` (a resource knob).
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

from bench.errors import ConfigError

# bench's command sets these as defaults the user may replace
DEFAULTS = ("data.max_prompt_length", "data.filter_overlong_prompts", "actor_rollout_ref.model.use_remove_padding",
            "actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "trainer.val_before_train")

# keys that say where and how fast the same run is computed (fnmatch patterns of the key)
RESOURCE_PATTERNS = (
    "*micro_batch_size*", "*max_token_len*", "*.use_dynamic_bsz",                       # micro-batching
    "*tensor_model_parallel_size", "*data_parallel_size", "*expert_parallel_size",       # parallelism
    "*pipeline_model_parallel_size", "*context_parallel_size", "*ulysses_sequence_parallel_size",
    "*.fsdp_size", "actor_rollout_ref.actor.strategy",
    "*gpu_memory_utilization", "*_offload", "*.offload_policy", "*.max_num_batched_tokens",   # memory
    "*.max_num_seqs", "*.free_cache_engine", "*.enable_gradient_checkpointing", "*.enable_activation_offload",
    "*.enable_chunked_prefill", "*.enable_prefix_caching", "*.enforce_eager", "*.cudagraph_capture_sizes",  # kernels
    "*.use_torch_compile", "*.use_remove_padding", "*.reshard_after_forward", "*.forward_prefetch",
    "*.entropy_checkpointing", "*.entropy_from_logits_with_chunking", "*.load_format", "*.layered_summon",
    "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep", "trainer.log_val_generations",
    "data.dataloader_num_workers", "ray_kwargs.*", "global_profiler.*", "*.profiler.*", "*.agent.num_workers",
)

_OVERRIDE = re.compile(r"^(\+\+|\+)?([A-Za-z_][\w\-]*(?:\.[\w\-]+)*)=(.*)$", re.S)


def key_of(override: str) -> str:
    """The dotted key of one Hydra override (`+a.b=1`, `++a.b=1` and `a.b=1` are all `a.b`)."""
    m = _OVERRIDE.match(override)
    if m is None:
        raise ConfigError(f"--verl-override {override!r}: give KEY=VALUE (verl's dotted key, `+KEY=VALUE` for a key "
                          "verl's config does not have), e.g. actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    return m.group(2)


def is_resource(key: str) -> bool:
    """Whether verl key `key` says where and how fast the run is computed, not what it computes."""
    return any(fnmatchcase(key, p) for p in RESOURCE_PATTERNS)


def split_overrides(overrides: list[str] | tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(settings, resources): the user's overrides, each checked (KEY=VALUE, no key twice), sorted,
    split by `is_resource`."""
    overrides = [o.strip() for o in overrides]
    keys = [key_of(o) for o in overrides]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"--verl-override gives {', '.join(twice)} more than once")
    settings = tuple(sorted(o for o, k in zip(overrides, keys) if not is_resource(k)))
    resources = tuple(sorted(o for o, k in zip(overrides, keys) if is_resource(k)))
    return settings, resources


def merge(bench_argv: list[str], user: list[str] | tuple[str, ...], owner) -> list[str]:
    """bench's overrides with the user's: a user key bench sets as a default (DEFAULTS) replaces
    bench's value in place, a key of the cell is refused (ConfigError naming what sets it:
    `owner(key)`, e.g. "--lr", or None where bench's command sets it only for some cells), and any
    other key is appended."""
    out = list(bench_argv)
    at = {key_of(a): i for i, a in enumerate(out)}
    for o in user:
        k = key_of(o)
        why = owner(k)
        if k not in DEFAULTS and (why is not None or k in at):
            raise ConfigError(f"--verl-override {o}: bench sets {k} from {why or 'the cell'}, so the run would not be "
                              "the cell it is stored as; give that instead")
        if k in at:
            out[at[k]] = o[1:] if o.startswith("+") and not o.startswith("++") else o
        else:
            out.append(o)
    return out
