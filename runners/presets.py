"""Run presets in one place, usable by every trainer. Each knob is declared once, in
`RunConfig` (help, unit, bounds: bench/knobs.py); a preset is only a set of values."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from bench import configdiff
from bench.errors import ConfigError, did_you_mean
from bench.knobs import check, knob

from bench.stop import StopConfig

if TYPE_CHECKING:
    from .algos import AlgoConfig


def _algo_config() -> AlgoConfig:
    """AlgoConfig's defaults; imported here so that reading the knobs (the CLI's options) needs no torch."""
    from .algos import AlgoConfig

    return AlgoConfig()


@dataclass
class Benchmark:
    """An evaluation set scored avg@n with its own sampling."""

    name: str = knob(help="Shown in the store, e.g. synthetic-hard or aime24.", cli=False)
    source: str = knob(help="A problem source (path, packaged name, hub id, synthetic-hard).", cli=False)
    n: int = knob(4, help="Samples per problem (avg@n).", unit="samples", ge=1, cli=False)
    temperature: float = knob(0.6, help="Benchmark sampling temperature.", gt=0, cli=False)
    top_p: float = knob(0.95, help="Benchmark nucleus sampling.", gt=0, le=1, cli=False)
    limit: int | None = knob(None, help="The first N problems (None: all).", unit="problems", ge=1, cli=False)


@dataclass
class RunConfig:
    """Everything a run needs besides the build, the algorithm and the precision pair. Each field
    is a knob (bench/knobs.py): its help, unit and bounds are the `bench run` / `bench sweep`
    option's, checked by `check_run_config` before anything is written."""

    prompts_per_step: int = knob(16, help="B: prompts per rollout batch.", unit="prompts", ge=1)
    samples_per_prompt: int = knob(8, help="G: responses per prompt (leave-one-out advantages need two).",
                                   unit="responses", ge=2)
    updates_per_batch: int = knob(1, help="Mini-batch optimizer steps per rollout batch.", unit="updates", ge=1)
    lr: float = knob(5e-4, help="AdamW learning rate, constant.", gt=0)
    weight_decay: float = knob(0.0, help="AdamW weight decay.", ge=0)
    grad_clip: float = knob(1.0, help="Clip the gradient's global norm to this.", gt=0)
    temperature: float = knob(1.0, help="Rollout sampling temperature: must stay 1 (μ the raw softmax, as π); "
                              "check_run_config refuses anything else.", cli=False)
    top_p: float = knob(1.0, help="Rollout nucleus sampling: must stay 1, as temperature.", cli=False)
    max_tokens: int = knob(64, help="Max response length; also Dr.GRPO's normaliser L.", unit="tokens", ge=1)
    max_steps: int = knob(300, help="Stop after this many training steps (rollout batches; 0: only the step-0 "
                          "evaluation).", unit="steps", ge=0)
    eval_every: int = knob(10, help="Steps between evaluations (split avg@m and the benchmarks).", unit="steps",
                           ge=1)
    eval_split_m: int = knob(4, help="Split accuracy is avg@m over every split problem.", unit="samples", ge=1)
    benchmarks: list[Benchmark] = knob(help="Evaluation sets (the preset's; --benchmark replaces the first's "
                                       "source).", cli=False, default_factory=list)
    checkpoint_every: int = knob(10, help="Steps between checkpoints (the unit of --resume).", unit="steps", ge=1)
    keep_checkpoints: int | None = knob(
        None, help="Also keep the checkpoint of every step that is a multiple of this (under the run's checkpoint "
        "directory, kept/), so `bench runs verify RUN --window A:B` can re-run steps A+1..B from step A instead of "
        "from step 0 (its eval_every keeps one at every evaluation). Each costs one checkpoint: the fp32 weights "
        "and AdamW's two moments, 12 bytes a parameter (8 MB for tiny-math, 18 GB for a 1.5B model). Unset: only "
        "the latest.", unit="steps", ge=1)
    seed: int = knob(0, help="Seed of the rollouts, the draws and the optimizer.", ge=0)
    threads: int | None = knob(1, help="Torch threads (one is often faster on a busy 2-core box; paper: torch's "
                               "default).", unit="threads", ge=1)
    max_tokens_per_microbatch: int | None = knob(
        None, help="Run each mini-batch's forward/backward (and the π_old and calibration forwards) in micro-batches "
        "of at most this many padded prompt+response tokens (rows × longest row), gradients summed into the one "
        "optimizer step: the same step up to float rounding; a longer sequence is a micro-batch of its own. "
        "Unset: no budget (the rows grouped by length, or the whole mini-batch at once with --no-group-by-length).",
        unit="tokens", ge=1)
    group_by_length: bool = knob(
        True, help="Sort each mini-batch's rows by length and cut them into the micro-batches that cost the "
        "fewest padded tokens (plus a forward's fixed cost, within --max-tokens-per-microbatch when set): the "
        "forward/backward skips most pad tokens (verl's dynamic batch size, TRL's group_by_length); the same step "
        "up to float rounding. Off: the rows in their order, one micro-batch unless a budget cuts them.")
    gradient_checkpointing: bool = knob(
        False, help="Recompute each decoder layer's activations in backward: activation memory of one layer "
        "instead of all, about one more forward of compute.")
    rollout_max_batch: int | None = knob(
        None, help="Built-in engine: rows decoded together (unset: 512); its KV cache is rows × (prompt + "
        "max_tokens) × 2·layers·KV width, e.g. 1.5B at 8,192 tokens: 512 rows 114 GiB, 64 rows 14 GiB.",
        unit="rows", ge=1)
    gpu_memory_utilization: float = knob(
        0.5, help="--engine vllm: the fraction of the GPU vLLM may take for its weights and KV cache; on a GPU "
        "shared with the native trainer leave room for the fp32 master, AdamW state, gradients and the compute "
        "copy (docs/gpu.md).", gt=0, le=1)
    loss_scale_init: float = knob(2.0 ** 16, help="fp16 dynamic loss scaling: the initial scale.", gt=0)
    loss_scale_growth_interval: int = knob(400, help="fp16 dynamic loss scaling: double the scale after this many "
                                           "finite steps.", unit="steps", ge=1)
    loss_scale_backoff: float = knob(0.5, help="fp16 dynamic loss scaling: multiply the scale by this on a "
                                     "non-finite step.", gt=0, lt=1)
    max_nonfinite_in_a_row: int = knob(20, help="Diverged: this many optimizer steps in a row skipped for a "
                                       "non-finite loss or gradient (fp16's scale backs off 2^16 → 1 in 16 skips).",
                                       unit="steps", ge=1)
    staleness: int = knob(0, help="K: the rollout engine samples with the weights of K training steps ago "
                          "(min(K, step) early on); π_old is the training engine at those weights, so the "
                          "precision metrics stay precision only and staleness_* measure π_θ vs π_old. 0: "
                          "on-policy. Native trainer only.", unit="steps", ge=0)
    router_replay: bool = knob(False, help="MoE models (R3): the training engine's forwards (π_old and π_θ) use "
                               "the experts the rollout engine chose at every position it ran; the router metrics "
                               "still compare what the trainer would have chosen. Built-in engine, staleness 0, no "
                               "gradient checkpointing.")
    algo: AlgoConfig = knob(help="The losses' hyper-parameters.", cli=False, default_factory=_algo_config)
    stop: StopConfig = knob(help="When a run ends (its switches and the futility rule's settings are options).",
                            cli=False, nested=True, default_factory=StopConfig)


# what each preset sets of the CLI knobs (the rest keep RunConfig's defaults); their benchmarks
# and loss hyper-parameters are in the functions below
PRESET_KNOBS = {
    "tiny": dict(prompts_per_step=64, lr=1e-3, eval_every=5, max_steps=150),
    "paper": dict(prompts_per_step=64, samples_per_prompt=8, updates_per_batch=4, lr=1e-6, max_tokens=8192,
                  max_steps=1000, eval_every=32, eval_split_m=1, checkpoint_every=32, threads=None),
    "small": dict(prompts_per_step=8, samples_per_prompt=8, lr=1e-5, max_tokens=128, max_steps=200, eval_every=10,
                  eval_split_m=2, checkpoint_every=5, threads=2, max_tokens_per_microbatch=2048),
}


def preset_knobs(name: str) -> dict:
    """{field: value} of every CLI knob of RunConfig in preset `name`, read without building the
    config (no torch import: the CLI's help shows these as each option's default)."""
    from bench.knobs import cli_knobs

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
                     algo=replace(_algo_config(), max_len=8192, C=3.0, eps_lo=0.2, eps_hi=0.28))


def small() -> RunConfig:
    """A small real model (smollm2-135m, gemma3-270m) on a CPU: 8 prompts × 8 per step, lr 1e-5,
    128 response tokens, split avg@2 every 10 steps, at most 200 steps, two threads, micro-batches
    of at most 2,048 padded tokens (the logits of a 49,152-token vocabulary over one micro-batch
    are 0.4 GB in fp32, over the whole batch ~2.4 GB a copy), checkpoints every 5 steps (a cell
    outlasts a session). Benchmark: the first 16 of MATH-500, avg@2 (a 135M model solves ~2% of
    them: it tells whether training on arithmetic moved anything else). Not yet tuned by a
    measured search (docs/results.md says what has been run)."""
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
        raise ConfigError("--router-replay needs --staleness 0 and no --gradient-checkpointing: the routes replayed "
                          "are the rollout's at the current weights, and a recomputed layer would route on its own")
    return check(cfg)


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
            setattr(cfg.stop if key in STOP_KNOBS else cfg, key, value)
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
    import json
    from dataclasses import asdict

    return json.loads(json.dumps(asdict(PRESETS[name]())))
