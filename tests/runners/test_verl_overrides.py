"""The user's verl overrides (runners/verl_overrides.py): parsed, split into settings and
resources by the fingerprint rule, merged into bench's command (a default replaced in place, a
new key appended, a key of the cell refused), and the seed in every one of verl's seeds."""

import re
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.algorithms import ALGORITHMS, PAPER_ALGORITHMS
from bench.errors import ConfigError
from bench.fingerprint import fingerprint
from bench.precision import CLASSIC_PAIRS, Precision
from runners.presets import get_preset
from runners.verl_overrides import DEFAULTS, is_resource, key_of, merge, split_overrides
from runners.verl_runner import NOT_ON_VERL, SEED_KEYS, VerlJob, owner, verl_command

JOB = VerlJob("/m", Path("/r/train.parquet"), Path("/r/val.parquet"), Path("/r/reward.py"), Path("/r/metrics.jsonl"),
              "bench", "run1", checkpoint_dir=Path("/r/checkpoints"))


def words(algo="grpo", p=Precision("bf16", "bf16"), **knobs):
    return verl_command(algo, p, get_preset("paper", **knobs), JOB)[0][3:]


def test_keys_and_the_split():
    assert key_of("a.b_c=1") == key_of("+a.b_c=1") == key_of("++a.b_c=x=y") == "a.b_c"
    for bad in ("a.b", "=1", "~a.b", "a b=1", "a..b=1"):
        with pytest.raises(ConfigError, match="give KEY=VALUE"):
            key_of(bad)
    settings, resources = split_overrides([" data.max_prompt_length=2048", "actor_rollout_ref.rollout.n_whatever=1",
                                           "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
                                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                           "actor_rollout_ref.rollout.gpu_memory_utilization=0.7"])
    assert settings == ("actor_rollout_ref.rollout.n_whatever=1", "data.max_prompt_length=2048")   # sorted
    assert resources == ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                         "actor_rollout_ref.rollout.gpu_memory_utilization=0.7",
                         "actor_rollout_ref.rollout.tensor_model_parallel_size=4")
    with pytest.raises(ConfigError, match="gives data.seed_x more than once"):
        split_overrides(["data.seed_x=1", "+data.seed_x=2"])
    # a key bench does not know is a setting: two runs that may differ are never pooled
    assert not is_resource("actor_rollout_ref.actor.optim.weight_decay") and not is_resource("x.y")
    assert is_resource("actor_rollout_ref.actor.fsdp_config.param_offload") and is_resource("ray_kwargs.ray_init.x")


def test_merge_replaces_a_default_appends_a_new_key_and_refuses_the_cells():
    bench = words()
    merged = merge(bench, ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "+x.y=1",
                           "+data.max_prompt_length=2048"], owner)
    assert len(merged) == len(bench) + 1 and merged[-1] == "+x.y=1"
    i = bench.index("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    assert merged[i] == "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"      # in place: each key once
    assert merged[bench.index("data.max_prompt_length=1024")] == "data.max_prompt_length=2048"   # verl has it: no +
    for o, why in (("actor_rollout_ref.actor.optim.lr=1e-6", "--lr"), ("trainer.n_gpus_per_node=8", "--gpus"),
                   ("data.seed=3", "--seed / --seeds"), ("actor_rollout_ref.rollout.dtype=float16", "--dtype"),
                   ("+actor_rollout_ref.rollout.quantization=fp8", "--dtype"),      # not in a bf16 cell's command
                   ("algorithm.rollout_correction.rollout_is=token", "--algo"),       # nor in grpo's
                   ("trainer.logger=[console]", "the run's own directory"),
                   ("actor_rollout_ref.actor.clip_ratio_high=0.5", "--algo"),
                   # a key above one of the cell's: Hydra would merge it into the cell's key
                   ("actor_rollout_ref.actor.optim={lr:1.0}", "--lr"), ("data={seed:7}", "the run's own directory"),
                   ("actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp16}", "--dtype"),
                   ("actor_rollout_ref.actor.fsdp_config={model_dtype:bf16}", "--seed / --seeds (its key"),
                   ("algorithm={adv_estimator:gae}", "--algo"),
                   ("actor_rollout_ref.rollout.kv_cache_dtype=fp8", "--dtype"),
                   ("actor_rollout_ref.rollout.response_length=99", "--max-tokens")):
        with pytest.raises(ConfigError, match=f"bench sets {re.escape(key_of(o))} from {re.escape(why)}"):
            merge(bench, [o], owner)


def test_every_key_of_benchs_command_is_a_default_or_says_what_sets_it():
    """So a refused override always names the option to give instead; checked on every cell verl runs."""
    for a in (a for a in ALGORITHMS if a not in NOT_ON_VERL):
        for p in CLASSIC_PAIRS if a in PAPER_ALGORITHMS else [Precision("bf16", "bf16"), Precision("fp8", "bf16")]:
            for w in words(a, p):
                k = key_of(w)
                assert k in DEFAULTS or owner(k), (a, p.name, k)
                assert not (k in DEFAULTS and owner(k)), k


def test_the_seed_is_every_one_of_verls_seeds_and_the_overrides_follow_benchs():
    w = words(seed=7, verl_settings=("data.max_prompt_length=4096",),
              verl_resources=("actor_rollout_ref.rollout.tensor_model_parallel_size=2",))
    assert [x for x in w if key_of(x) in SEED_KEYS] == [f"{k}=7" for k in SEED_KEYS]
    assert "data.max_prompt_length=4096" in w and "data.max_prompt_length=1024" not in w
    assert w[-1] == "actor_rollout_ref.rollout.tensor_model_parallel_size=2"


def test_settings_are_part_of_the_cell_resources_are_not():
    plain = {"preset": "paper", **asdict(get_preset("paper"))}
    stored_before = {k: v for k, v in plain.items() if k not in ("verl_settings", "verl_resources")}
    assert fingerprint(plain) == fingerprint(stored_before)             # the knobs split no stored cell
    res = {**plain, "verl_resources": ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"]}
    assert fingerprint(res) == fingerprint(plain)
    setting = {**plain, "verl_settings": ["data.max_prompt_length=4096"]}
    assert fingerprint(setting) != fingerprint(plain)
