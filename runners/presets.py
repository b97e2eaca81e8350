"""Run presets in one place, usable by every trainer. Each knob is declared once, in
`RunConfig` (bench/runconfig.py: help, unit, bounds); a preset is only a set of values."""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace

from bench import configdiff
from bench.errors import ConfigError, did_you_mean
from bench.knobs import check, cli_knobs, flag_of
from bench.algorithms import ALGO_KNOBS, AlgoConfig
from bench.runconfig import Benchmark, RunConfig
from bench.stop import StopConfig


# what each preset sets of the CLI knobs (the rest keep RunConfig's defaults); their benchmarks
# and loss hyper-parameters are in the functions below
PRESET_KNOBS = {
    "tiny": dict(prompts_per_step=64, lr=1e-3, eval_every=5, max_steps=150),
    "paper": dict(prompts_per_step=64, samples_per_prompt=8, updates_per_batch=4, lr=1e-6, max_tokens=8192,
                  max_steps=1000, eval_every=32, eval_split_m=1, checkpoint_every=32, threads=None),
    "small": dict(prompts_per_step=8, samples_per_prompt=8, lr=1e-5, max_tokens=128, max_steps=200, eval_every=10,
                  eval_split_m=2, checkpoint_every=5, threads=2, max_tokens_per_microbatch=2048,
                  gradient_checkpointing=True),
}


def preset_knobs(name: str) -> dict:
    """{field: value} of every CLI knob of RunConfig in preset `name`, read without building the
    config (no torch import: the CLI's help shows these as each option's default)."""
    return {f.name: PRESET_KNOBS[name].get(f.name, f.default) for _, f in cli_knobs(RunConfig)}


def tiny() -> RunConfig:
    """tiny-math on CPU: 64 prompts × 8 per step, lr 1e-3, an evaluation every 5 steps, at most
    150 steps (30 evaluations). Measured, pg-seq-is fp16, default build (177 problems), seed 0,
    split accuracy avg@4 at steps 0/10/20/30/40/45/60: 0.482 / 0.709 / 0.840 / 0.888 / 0.927 /
    0.952 / 0.955, ~4 s a step on one thread. Searched on the same cell (peak by step 60):
    B 16 lr 5e-4 needs ~250 steps; B 32 lr 1e-3 0.82; B 32 × G 16 0.75 at step 20 (B 64 × 8:
    0.84); lr 1.5e-3 and 2e-3 fall first (0.48 / 0.39 at step 5) and trail lr 1e-3 after; two
    updates per batch no faster (0.93 at step 35)."""
    return RunConfig(**PRESET_KNOBS["tiny"],
                     benchmarks=[Benchmark("synthetic-hard", "synthetic-hard", n=4, limit=64)])


def paper() -> RunConfig:
    """The paper's sanity recipe (Oat scripts): 64 prompts × 8, 4 updates per rollout batch,
    lr 1e-6, T=1, top-p 1, 8,192 tokens, AIME24 avg@32 at T=0.6 / top-p 0.95 every 32 steps,
    clip-higher 0.28, C=3. AIME24 is the packaged copy (`aime24`: bench/data, works offline);
    `--benchmark` reads it from another source instead (a file, or the hub's
    `HuggingFaceH4/aime_2024:train`)."""
    return RunConfig(**PRESET_KNOBS["paper"], benchmarks=[Benchmark("aime24", "aime24", n=32)],
                     algo=replace(AlgoConfig(), max_len=8192, C=3.0, eps_lo=0.2, eps_hi=0.28))


def small() -> RunConfig:
    """A small real model (smollm2-135m, gemma3-270m) on a CPU: 8 prompts × 8 per step, lr 1e-5,
    128 response tokens, split avg@2 every 10 steps, at most 200 steps, two threads, micro-batches
    of at most 2,048 padded tokens (the logits of a 49,152-token vocabulary over one micro-batch
    are 0.4 GB in fp32, over the whole batch ~2.4 GB a copy), gradient checkpointing (SmolLM2's
    peak 9.4 → 5.7 GiB at fp16 where the CPU emulates it, 7.0 → 5.3 at native bf16, no step time
    measured lost: benchmarks/run_memory.py), checkpoints every 5 steps (a cell outlasts a
    session). Benchmark: the first 16 of MATH-500, avg@2 (a 135M model solves ~2% of them: it
    tells whether training on arithmetic moved anything else). Not yet tuned by a measured search
    (docs/results.md says what has been run)."""
    return RunConfig(**PRESET_KNOBS["small"], benchmarks=[Benchmark("math500", "math500", n=2, limit=16)])


PRESETS = {"tiny": tiny, "paper": paper, "small": small}
EMBEDDED_ONLY = ("tiny",)       # presets made for the embedded tiny-math models, refused for any other
# the StopConfig fields a `get_preset` override (a flat CLI knob name) sets on cfg.stop
STOP_KNOBS = frozenset(f.name for f in fields(StopConfig))


def check_run_config(cfg: RunConfig) -> RunConfig:
    """Refuse a knob out of its bounds (ConfigError naming the flag and the bound), and settings
    that make the run measure something other than what it reports."""
    if cfg.temperature != 1.0 or cfg.top_p != 1.0:
        raise ConfigError(
            f"training rollouts sample at temperature 1 and top-p 1 only (got temperature={cfg.temperature:g}, "
            f"top_p={cfg.top_p:g}): otherwise μ is the log-probability of the processed distribution while π is "
            "the raw softmax, and every mismatch metric and importance weight measures that difference instead "
            "of precision (benchmarks keep their own sampling)")
    if cfg.router_replay and (cfg.staleness or cfg.gradient_checkpointing):
        raise ConfigError("--router-replay needs --staleness 0 and --no-gradient-checkpointing (the small preset "
                          "sets it): the routes replayed are the rollout's at the current weights, and a recomputed "
                          "layer would route on its own")
    check(cfg)                         # each knob in its bounds first, then the rules between them
    for lo, hi in (("icepop_lo", "icepop_hi"), ("pg_icepop_lo", "pg_icepop_hi"), ("geo_lo", "geo_hi")):
        if getattr(cfg.algo, lo) > getattr(cfg.algo, hi):
            raise ConfigError(f"--{flag_of(lo)} {getattr(cfg.algo, lo):g} is above --{flag_of(hi)} "
                              f"{getattr(cfg.algo, hi):g}: the band would keep nothing")
    return cfg


def get_preset(name: str, benchmark: str | None = None, **overrides) -> RunConfig:
    """The preset with the given RunConfig fields replaced (None values are ignored) and its
    first benchmark read from `benchmark` (a problem source) when given; the Dr.GRPO
    normaliser follows max_tokens."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}{did_you_mean(name, PRESETS)}; choose one of "
                          f"{', '.join(PRESETS)}")
    cfg = PRESETS[name]()
    if benchmark is not None:
        if not cfg.benchmarks:
            raise ConfigError(f"preset {name!r} has no benchmark to replace")
        cfg.benchmarks[0] = replace(cfg.benchmarks[0], source=benchmark)
    for key, value in overrides.items():
        if value is not None:
            setattr(cfg.stop if key in STOP_KNOBS else cfg.algo if key in ALGO_KNOBS else cfg, key, value)
    cfg.algo.max_len = cfg.max_tokens
    return check_run_config(cfg)


def config_diff(config: dict | None) -> tuple[str | None, list[tuple[str, object, object]] | None]:
    """(preset name, [(key, preset default, run value), ...]) for every setting of a stored run
    config (`{"preset": name, **asdict(RunConfig)}`) that differs from its preset's defaults;
    the list is None when the config names no known preset. The verl job description and the
    preset name itself are not settings and are left out."""
    config = config or {}
    name = config.get("preset")
    if name not in PRESETS:
        return name, None
    return name, configdiff.diff(preset_defaults(name), config)


def preset_defaults(name: str) -> dict:
    """The preset's RunConfig as a run stores it (JSON types); runs keep a copy in their
    provenance so the app can show what else changed without importing the presets."""
    return json.loads(json.dumps(asdict(PRESETS[name]())))
