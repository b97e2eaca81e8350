"""The run's knobs, declared once (bench/knobs.py: help, unit, bounds), torch-free: `RunConfig`
(what a run needs besides the build, the algorithm and the precision pair) and `Benchmark` (an
evaluation set). The presets (runners/presets.py) are sets of their values; the CLI's options,
the settings fingerprint's rule (bench/fingerprint.py) and the knobs verl takes are read from
their metadata.

Two metadata keys of a run knob besides its help and bounds:
- `fingerprint`: "setting" (default: part of the cell's settings), "resource" (where and how fast
  the same run is computed: never part of it), "cell" (a column of the cell key of its own: the
  seed, staleness K), or "when-set" (a knob added after runs were stored: part of the settings
  only at a value other than its default, so adding it splits no stored cell);
- `verl`: True where verl's launcher or follower applies the knob (the others are the native
  trainer's; `bench run --trainer verl` warns that it ignores them).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.algorithms import AlgoConfig
from bench.knobs import knob
from bench.stop import StopConfig


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

    prompts_per_step: int = knob(16, help="B: prompts per rollout batch.", unit="prompts", ge=1, verl=True)
    samples_per_prompt: int = knob(8, help="G: responses per prompt (leave-one-out advantages need two).",
                                   unit="responses", ge=2, verl=True)
    updates_per_batch: int = knob(1, help="Mini-batch optimizer steps per rollout batch.", unit="updates", ge=1,
                                  verl=True)
    lr: float = knob(5e-4, help="AdamW learning rate, constant.", gt=0, verl=True)
    weight_decay: float = knob(0.0, help="AdamW weight decay.", ge=0)
    grad_clip: float = knob(1.0, help="Clip the gradient's global norm to this.", gt=0)
    temperature: float = knob(1.0, help="Rollout sampling temperature: must stay 1 (μ the raw softmax, as π); "
                              "check_run_config refuses anything else.", cli=False)
    top_p: float = knob(1.0, help="Rollout nucleus sampling: must stay 1, as temperature.", cli=False)
    max_tokens: int = knob(64, help="Max response length; also Dr.GRPO's normaliser L.", unit="tokens", ge=1,
                           verl=True)
    max_steps: int = knob(300, help="Stop after this many training steps (rollout batches; 0: only the step-0 "
                          "gate and evaluation, status `evaluated`, no leaderboard cell).", unit="steps", ge=0,
                          verl=True)
    eval_every: int = knob(10, help="Steps between evaluations (split avg@m and the benchmarks).", unit="steps",
                           ge=1, verl=True)
    eval_split_m: int = knob(4, help="Split accuracy is avg@m over every split problem.", unit="samples", ge=1)
    benchmarks: list[Benchmark] = knob(help="Evaluation sets (the preset's; --benchmark replaces the first's "
                                       "source).", cli=False, default_factory=list)
    checkpoint_every: int = knob(10, help="Steps between checkpoints (the unit of --resume).", unit="steps", ge=1,
                                 fingerprint="resource", verl=True)
    keep_checkpoints: int | None = knob(
        None, help="Also keep the checkpoint of every step that is a multiple of this (under the run's checkpoint "
        "directory, kept/), so `bench runs verify RUN --window A:B` can re-run steps A+1..B from step A instead of "
        "from step 0 (its eval_every keeps one at every evaluation). Each costs one checkpoint: the fp32 weights "
        "and AdamW's two moments, 12 bytes a parameter (8 MB for tiny-math, 18 GB for a 1.5B model). Unset: only "
        "the latest.", unit="steps", ge=1, fingerprint="resource")
    seed: int = knob(0, help="Seed of the rollouts, the draws and the optimizer.", ge=0, fingerprint="cell")
    threads: int | None = knob(1, help="Torch threads (one is often faster on a busy 2-core box; paper: torch's "
                               "default).", unit="threads", ge=1, fingerprint="resource")
    max_tokens_per_microbatch: int | None = knob(
        None, help="Run each mini-batch's forward/backward (and the π_old and calibration forwards) in micro-batches "
        "of at most this many padded prompt+response tokens (rows × longest row), gradients summed into the one "
        "optimizer step: the same step up to float rounding; a longer sequence is a micro-batch of its own. "
        "Unset: no budget (the rows grouped by length, or the whole mini-batch at once with --no-group-by-length).",
        unit="tokens", ge=1, fingerprint="resource")
    group_by_length: bool = knob(
        True, help="Sort each mini-batch's rows by length and cut them into the micro-batches that cost the "
        "fewest padded tokens (plus a forward's fixed cost, within --max-tokens-per-microbatch when set): the "
        "forward/backward skips most pad tokens (verl's dynamic batch size, TRL's group_by_length); the same step "
        "up to float rounding. Off: the rows in their order, one micro-batch unless a budget cuts them.",
        fingerprint="resource")
    gradient_checkpointing: bool = knob(
        False, help="Recompute each decoder layer's activations in backward: activation memory of one layer "
        "instead of all, about one more forward of compute.", fingerprint="resource")
    rollout_max_batch: int | None = knob(
        None, help="Built-in engine: rows decoded together (unset: 512); its KV cache is rows × (prompt + "
        "max_tokens) × 2·layers·KV width, e.g. 1.5B at 8,192 tokens: 512 rows 114 GiB, 64 rows 14 GiB.",
        unit="rows", ge=1, fingerprint="resource")
    cascade_attention: bool = knob(
        False, help="Built-in engine: decode with the shared-prefix attention (a prompt's keys and values read once "
        "per prompt at every token, not once per sample; bench/engines/cascade.py): FlashAttention's arithmetic "
        "with the keys in two blocks, so μ moves in its last bits; models whose layers are all full attention.",
        fingerprint="when-set")
    gpu_memory_utilization: float = knob(
        0.5, help="--engine vllm: the fraction of the GPU vLLM may take for its weights and KV cache; on a GPU "
        "shared with the native trainer leave room for the fp32 master, AdamW state, gradients and the compute "
        "copy (docs/gpu.md).", gt=0, le=1, fingerprint="resource")
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
                          "on-policy. Native trainer only.", unit="steps", ge=0, fingerprint="cell",
                          verl=True)
    router_replay: bool = knob(False, help="MoE models (R3): the training engine's forwards (π_old and π_θ) use "
                               "the experts the rollout engine chose at every position it ran; the router metrics "
                               "still compare what the trainer would have chosen. Built-in engine, staleness 0, no "
                               "gradient checkpointing.", verl=True)
    verl_settings: tuple[str, ...] = knob(
        (), help="--trainer verl: the user's verl overrides that may change what the run computes (Hydra "
        "KEY=VALUE, sorted; runners/verl_overrides.py): part of the cell.", cli=False, fingerprint="when-set",
        verl=True)
    verl_resources: tuple[str, ...] = knob(
        (), help="--trainer verl: the user's verl overrides of where and how fast the run is computed (parallel "
        "sizes, micro-batches, memory shares; runners/verl_overrides.py): not part of the cell.", cli=False,
        fingerprint="resource", verl=True)
    algo: AlgoConfig = knob(help="The losses' hyper-parameters (its thresholds are options: --icepop-lo, ...).",
                            cli=False, nested=True, default_factory=AlgoConfig)
    stop: StopConfig = knob(help="When a run ends (its switches and the futility rule's settings are options).",
                            cli=False, nested=True, default_factory=StopConfig)
