"""Run presets in one place, usable by every trainer. Each knob is documented once, in
`RunConfig`; a preset is only a set of values."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench import configdiff

from .algos import AlgoConfig
from .stop import StopConfig


@dataclass
class Benchmark:
    """An evaluation set scored avg@n with its own sampling."""

    name: str                   # shown in the store, e.g. "synthetic-hard" or "aime24"
    source: str                 # a problem source (path, packaged name, hub id, synthetic-hard)
    n: int = 4                  # samples per problem (avg@n)
    temperature: float = 0.6
    top_p: float = 0.95
    limit: int | None = None    # first N problems


@dataclass
class RunConfig:
    """Everything a run needs besides the build, the algorithm and the precision pair."""

    prompts_per_step: int = 16          # B: prompts per rollout batch
    samples_per_prompt: int = 8         # G: responses per prompt (leave-one-out needs >= 2)
    updates_per_batch: int = 1          # mini-batch optimizer steps per rollout batch
    lr: float = 5e-4                    # AdamW, constant
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    temperature: float = 1.0            # rollout sampling: must stay 1.0 / 1.0 (μ the raw softmax, as π);
    top_p: float = 1.0                  #   check_run_config refuses anything else
    max_tokens: int = 64                # max response length; also Dr.GRPO's normaliser L
    max_steps: int = 300
    eval_every: int = 10                # steps between evaluations (split avg@m + benchmarks)
    eval_split_m: int = 4               # split accuracy is avg@m over every split problem
    benchmarks: list[Benchmark] = field(default_factory=list)
    checkpoint_every: int = 10
    seed: int = 0
    threads: int | None = 1             # torch threads (one is often faster on a busy 2-core box)
    max_tokens_per_microbatch: int | None = None
                                        # run each mini-batch's forward/backward (and the π_old and
                                        #   calibration forwards) in micro-batches of at most this many
                                        #   padded prompt+response tokens (rows × longest row), summing
                                        #   the gradients into the one optimizer step: the same step as
                                        #   the whole mini-batch's, up to float rounding (each micro-batch's
                                        #   loss weighted by its share of the sequences the loss averages
                                        #   over). A longer sequence is a micro-batch of its own. None: the
                                        #   whole mini-batch in one forward/backward (the same bits as before)
    gradient_checkpointing: bool = False
                                        # recompute each decoder layer's activations in backward
                                        #   (transformers' gradient_checkpointing_enable on the training
                                        #   compute model): activation memory of one layer instead of all,
                                        #   about one more forward of compute
    rollout_max_batch: int | None = None
                                        # built-in engine: rows decoded together (None: 512); its KV
                                        #   cache is rows × (prompt + max_tokens) × 2·layers·KV width,
                                        #   e.g. 1.5B at 8,192 tokens: 512 rows 114 GiB, 64 rows 14 GiB
    gpu_memory_utilization: float = 0.5 # --engine vllm: the fraction of the GPU vLLM may take for its
                                        #   weights and KV cache; on one GPU shared with the native trainer
                                        #   leave room for the fp32 master, AdamW state, gradients and the
                                        #   compute copy (docs/gpu.md)
    loss_scale_init: float = 2.0 ** 16  # fp16 dynamic loss scaling
    loss_scale_growth_interval: int = 400
    loss_scale_backoff: float = 0.5
    max_nonfinite_in_a_row: int = 20    # diverged: this many optimizer steps in a row skipped for a
                                        #   non-finite loss or gradient (any dtype; fp16's scale backs
                                        #   off 2^16 -> 1 in 16 skips)
    staleness: int = 0                  # K: the rollout engine samples with the weights of K training
                                        #   steps ago (min(K, step) early on); π_old is the training
                                        #   engine at those same weights, so the precision metrics stay
                                        #   precision only and `staleness_*` measure π_θ vs π_old
                                        #   (runners/staleness.py). 0: on-policy, the code path of before
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    stop: StopConfig = field(default_factory=StopConfig)


def tiny() -> RunConfig:
    """tiny-math on CPU: 64 prompts × 8 per step, lr 1e-3, an evaluation every 5 steps, at most
    150 steps (30 evaluations). Measured, pg-seq-is fp16, default build (177 problems), seed 0,
    split accuracy avg@4 at steps 0/10/20/30/40/45/60: 0.482 / 0.709 / 0.840 / 0.888 / 0.927 /
    0.952 / 0.955, ~4 s a step on one thread. Searched on the same cell (peak by step 60):
    B 16 lr 5e-4 needs ~250 steps; B 32 lr 1e-3 0.82; B 32 × G 16 0.75 at step 20 (B 64 × 8:
    0.84); lr 1.5e-3 and 2e-3 fall first (0.48 / 0.39 at step 5) and trail lr 1e-3 after; two
    updates per batch no faster (0.93 at step 35)."""
    return RunConfig(prompts_per_step=64, lr=1e-3, eval_every=5, max_steps=150,
                     benchmarks=[Benchmark("synthetic-hard", "synthetic-hard", n=4, limit=64)])


def paper() -> RunConfig:
    """The paper's sanity recipe (Oat scripts): 64 prompts × 8, 4 updates per rollout batch,
    lr 1e-6, T=1, top-p 1, 8,192 tokens, AIME24 avg@32 at T=0.6 / top-p 0.95 every 32 steps,
    clip-higher 0.28, C=3. AIME24 is the packaged copy (`aime24`: bench/data, works offline);
    `--benchmark` reads it from another source instead (a file, or the hub's
    `HuggingFaceH4/aime_2024:train`)."""
    return RunConfig(prompts_per_step=64, samples_per_prompt=8, updates_per_batch=4, lr=1e-6,
                     max_tokens=8192, max_steps=1000, eval_every=32, eval_split_m=1, checkpoint_every=32,
                     threads=None, benchmarks=[Benchmark("aime24", "aime24", n=32)],
                     algo=AlgoConfig(max_len=8192, C=3.0, eps_lo=0.2, eps_hi=0.28))


PRESETS = {"tiny": tiny, "paper": paper}


def check_run_config(cfg: RunConfig) -> RunConfig:
    """Refuse settings that make the run measure something other than what it reports."""
    if cfg.temperature != 1.0 or cfg.top_p != 1.0:
        raise ValueError(
            f"training rollouts sample at temperature 1 and top-p 1 only (got temperature={cfg.temperature:g}, "
            f"top_p={cfg.top_p:g}): otherwise μ is the log-probability of the processed distribution while π is "
            "the raw softmax, and every mismatch metric and importance weight measures that difference instead "
            "of precision (benchmarks keep their own sampling)")
    if cfg.max_nonfinite_in_a_row < 1:
        raise ValueError("max_nonfinite_in_a_row must be >= 1")
    if cfg.max_tokens_per_microbatch is not None and cfg.max_tokens_per_microbatch < 1:
        raise ValueError("max_tokens_per_microbatch must be >= 1 (or unset: the whole mini-batch at once)")
    if cfg.rollout_max_batch is not None and cfg.rollout_max_batch < 1:
        raise ValueError("rollout_max_batch must be >= 1 (or unset: 512)")
    if not 0 < cfg.gpu_memory_utilization <= 1:
        raise ValueError("gpu_memory_utilization must lie in (0, 1]")
    if isinstance(cfg.staleness, bool) or not isinstance(cfg.staleness, int) or cfg.staleness < 0:
        raise ValueError(f"staleness must be an integer >= 0 (training steps, i.e. rollout batches, the rollout weights lag behind; "
                         f"0: on-policy), got {cfg.staleness!r}")
    return cfg


def get_preset(name: str, benchmark: str | None = None, **overrides) -> RunConfig:
    """The preset with the given RunConfig fields replaced (None values are ignored) and its
    first benchmark read from `benchmark` (a problem source) when given; the Dr.GRPO
    normaliser follows max_tokens."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    cfg = PRESETS[name]()
    if benchmark is not None:
        if not cfg.benchmarks:
            raise ValueError(f"preset {name!r} has no benchmark to replace")
        cfg.benchmarks[0] = replace(cfg.benchmarks[0], source=benchmark)
    for key, value in overrides.items():
        if value is not None:
            setattr(cfg, key, value)
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
