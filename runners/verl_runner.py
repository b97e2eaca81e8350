"""The verl runner's configuration half: verl's parquet, the reward module, and the
`python -m verl.trainer.main_ppo` overrides for every algorithm × precision pair, as read off
verl 0.9.1's source (its trainer config and ppo modules). `bench run --trainer verl --dry-run` prints them.

Where bench's one definition (docs/algorithms.md) and verl's defaults differ, the overrides choose
bench's, and tests/runners/test_verl_crosscheck.py checks each loss against verl's `core_algos` on the
same tensors: leave-one-out advantages (`rloo`, not `grpo`'s R − mean, which is (G−1)/G of it),
no dual-clip (`clip_ratio_c=1e9`; verl's default 3.0 bounds −r·A for A < 0), the Dr.GRPO
normaliser as an explicit `loss_scale_factor` (else verl divides by each micro-batch's padded
length), GSPO's seq-mean-token-mean (verl 0.9.1 uses the actor's loss_agg_mode, default
token-mean). Left as verl has them: IcePop's lower bound (`'1e-9_C'` also zeroes weights below
1e-9) and GSPO's sequences with no response token (verl's trainer divides by every sequence of
the mini-batch, global_batch_size = ppo_mini_batch_size · rollout.n; bench's GSPO by those with
a token). For the other losses an empty sequence counts in both, so nothing is overridden for it.

Metrics (METRIC_MAP): a verl value is stored under a bench name only where bench's native
meaning is the same; everything else keeps verl's name under `verl/`. verl's off-policy
diagnostics (`rollout_corr/*` from `rollout_corr_helper.compute_offpolicy_metrics`, π_old vs μ
on the whole batch, decoupled mode) are computed natively by bench/mismatch.py exactly as verl
does (tests/runners/test_verl_metrics.py): `rollout_corr/kl` is a per-token mean of log μ − log π, stored
as `kl_k1_token` (bench's `kl_k1` sums each sequence first), `k3_kl` is per-token k3 = `kl_k3`,
then `chi2_token`, `chi2_seq`, `ppl_*`, `log_ppl_*`. `training/rollout_probs_diff_{mean,max,std}`
are of |p_rollout − p_actor| (`prob_abs_diff_*`; bench's prob_diff_max/min are signed π − μ).
verl's `rollout_is_*` describe the *applied* weights at the configured level (truncated at C,
or zeroed outside IcePop's bounds) and are stored as `is_weight_applied_*` (token-weighted;
`_seq_*`: over sequences of each one's token-mean weight), never as bench's raw `is_ratio_*`;
`rollout_is_ratio_fraction_{high,low}` are the fractions of raw ratios (tokens or sequences,
per level) above C / below the lower bound (`is_ratio_frac_*`). `rollout_is_max`/`_min` stay
`verl/…`: verl reports the applied weight at token level but the raw ratio at sequence level.
Bypass mode (the pg-seq-* cells) skips all of that: verl computes the same diagnostics inside
the actor's loss, for π_θ (the policy being updated) against μ, per micro-batch (one sequence
in this command), and logs their mean over micro-batches as `actor/rollout_corr/*`. Their
meaning differs from the batch metrics in two ways — per-token means (kl, k3_kl, chi2_token)
become means over sequences of per-sequence token means, and after the first of
`updates_per_batch` optimizer steps π_θ has moved from π_old, so drift adds to the mismatch —
so they are stored under `bypass/<bench name>` (e.g. `bypass/kl_k3`), never under the native
names; the KL early warning and the step-1 calibration read `bypass/kl_k3` when a run has no
`kl_k3`. Their `_max`/`_min` and IS-weight statistics stay `verl/actor/…`.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from fnmatch import fnmatchcase
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bench.algorithms import PPO, SPECS, AlgoConfig
from bench.errors import BenchError
from bench.models import INSTRUCTION
from bench.precision import Precision
from bench.problems import Problem

from .presets import RunConfig
from .verl_overrides import merge

SUPPORTED_VERL = ("0.9.1",)
RC = "algorithm.rollout_correction"
VERL_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}
ROLLOUT_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "bfloat16"}   # fp8: + quantization

# verl's off-policy diagnostics (without their `rollout_corr/` prefix) → bench's native names
OFFPOLICY_MAP = {
    "kl": "kl_k1_token",                    # per-token mean of log μ − log π (not kl_k1: per-sequence sums)
    "k3_kl": "kl_k3",                       # per-token mean of ρ − 1 − log ρ, ρ = π/μ
    "chi2_token": "chi2_token",
    "chi2_seq": "chi2_seq",
    "training_ppl": "ppl_training",
    "training_log_ppl": "log_ppl_training",
    "rollout_ppl": "ppl_rollout",
    "rollout_log_ppl": "log_ppl_rollout",
    "ppl_ratio": "ppl_ratio",
    "log_ppl_diff": "log_ppl_diff",
    "log_ppl_abs_diff": "log_ppl_abs_diff",
    "log_ppl_diff_max": "log_ppl_diff_max",
    "log_ppl_diff_min": "log_ppl_diff_min",
}
# ... of which bypass mode's micro-batch means (`actor/rollout_corr/*`) are stored too (docstring)
BYPASS_OFFPOLICY = ("kl", "k3_kl", "chi2_token", "chi2_seq", "training_ppl", "training_log_ppl", "rollout_ppl",
                    "rollout_log_ppl", "ppl_ratio", "log_ppl_diff", "log_ppl_abs_diff")
# verl's statistics of the applied (truncated / IcePop-masked) IS weights at the configured level
IS_WEIGHT_MAP = {
    "rollout_is_mean": "is_weight_applied_mean",
    "rollout_is_std": "is_weight_applied_std",
    "rollout_is_eff_sample_size": "is_weight_applied_ess",
    "rollout_is_seq_mean": "is_weight_applied_seq_mean",
    "rollout_is_seq_std": "is_weight_applied_seq_std",
    "rollout_is_seq_max": "is_weight_applied_seq_max",
    "rollout_is_seq_min": "is_weight_applied_seq_min",
    "rollout_is_seq_max_deviation": "is_weight_applied_seq_max_deviation",
    "rollout_is_ratio_fraction_high": "is_ratio_frac_high",     # raw ratio > C (tokens or sequences, per level)
    "rollout_is_ratio_fraction_low": "is_ratio_frac_low",       # raw ratio < the lower bound (1/C unless lo_hi)
    "rollout_is_oob_ratio": "is_ratio_frac_oob",                # IcePop: token share of raw weights outside [lo, hi]
}

# verl metric → bench metric (anything else is kept under verl's name with a "verl/" prefix)
METRIC_MAP = {
    "critic/score/mean": "reward",
    "response_length/mean": "response_len",
    "response_length/max": "response_len_max",
    "response_length/clip_ratio": "truncated_frac",
    **{f"rollout_corr/{k}": v for k, v in OFFPOLICY_MAP.items()},
    **{f"actor/rollout_corr/{k}": f"bypass/{OFFPOLICY_MAP[k]}" for k in BYPASS_OFFPOLICY},
    **{f"rollout_corr/{k}": v for k, v in IS_WEIGHT_MAP.items()},
    "rollout_corr/rollout_rs_seq_masked_fraction": "masked_frac",  # trm, grpo-geo-mask: sequences rejected
    "training/rollout_probs_diff_mean": "prob_abs_diff_mean",     # |p_rollout − p_actor|, a probability
    "training/rollout_probs_diff_max": "prob_abs_diff_max",
    "training/rollout_probs_diff_std": "prob_abs_diff_std",
    "actor/pg_loss": "loss",
    "actor/grad_norm": "grad_norm",
    "actor/pg_clipfrac": "loss/clip_frac",
    "timing_s/gen": "time_rollout",
    "timing_s/update_actor": "time_update",
    "timing_s/testing": "time_eval",
}


class VerlError(BenchError, ValueError):
    pass


# Staleness (runners/staleness.py) on verl: what verl 0.9.1's pip package ships and why bench refuses K > 0
VERL_STALENESS = (
    "--staleness K > 0 runs on the native trainer only (--trainer native): verl 0.9.1's pip package ships "
    "verl.experimental.one_step_off_policy (K=1) and verl.experimental.fully_async_policy, but both force "
    "algorithm.rollout_correction.bypass_mode=True (π_old taken to be μ, so the precision and staleness components "
    "cannot be logged apart) and need rollout GPUs apart from the trainer's (rollout.n_gpus_per_node, no hybrid "
    "engine); one_step_off's config does not compose from the installed package (its Hydra searchpath "
    "file://verl/trainer/config is relative to verl's source tree), so neither validate_config nor "
    "`main_ppo --cfg job` can check it as the other cells are checked; and fully_async's "
    "async_training.staleness_threshold is a fraction of samples (with partial rollouts across weight versions), "
    "not K optimizer steps")


VERL_ROUTER_REPLAY = (
    "--router-replay runs on the native trainer only (--trainer native): verl's router replay (R2/R3, issue #3762) "
    "is for its Megatron backend; bench launches verl's FSDP actor, whose config has no router replay")


VERL_SEQ_MIS = (
    "in bypass mode verl 0.9.1 computes the IcePop sequence mask on each micro-batch of the actor's update, and "
    "when the mask drops every sequence of a micro-batch (a sequence IS weight outside [1e-9, C]: at bench's "
    "micro-batch of one sequence, any such sequence) compute_is_metrics divides by zero computing the effective "
    "sample size, and the run dies mid-way (ZeroDivisionError); a larger micro-batch only makes it rarer")


_DPPO_ANCHOR = ("verl 0.9.1's dppo_tv/dppo_kl losses anchor their trust region on old_log_prob, which is π_old "
                "unless bypass mode sets it to μ, and bypass mode replaces the policy loss with its own "
                "(loss_mode=bypass_mode): bench's {algo} is Stable-RL's, anchored on μ, so verl cannot run it")
NOT_ON_VERL = {
    "pg-seq-mis": VERL_SEQ_MIS,
    "dppo-tv": _DPPO_ANCHOR.format(algo="dppo-tv"),
    "dppo-kl": _DPPO_ANCHOR.format(algo="dppo-kl"),
    "pg-icepop": "verl 0.9.1 has no un-detached, unclipped IcePop (prime-rl's rule: r = π_θ/μ carries the "
                 "gradient); its IcePop is the `icepop` algorithm (a detached weight on the PPO-clip loss)",
    "ipo": "verl 0.9.1 has no IPO loss (prime-rl's: a probability-distance mask and a (log π_θ/μ)² penalty)",
    "opsm": "verl 0.9.1 has no off-policy sequence masking (TRL's and slime's OPSM: a rule on the advantage's "
            "sign and the current policy's drift, which verl's rollout_rs cannot express)",
    "opsm-old": "verl 0.9.1 has no off-policy sequence masking (slime's OPSM: a rule on the advantage's sign "
                "and π_θ's drift from π_old, which verl's rollout_rs cannot express)",
    "sc": "verl 0.9.1 has no Score Centering, and its vLLM rollouts return no whole distribution to centre by",
}


ON_VERL = tuple(a for a in SPECS if a not in NOT_ON_VERL or a == "pg-seq-mis")
"""The algorithms algo_overrides maps onto verl's keys (pg-seq-mis mapped, then refused at launch)."""


def check_algorithm(algo: str) -> None:
    """Refuse an algorithm verl 0.9.1 cannot run to its end or has no rule for, saying why
    (NOT_ON_VERL; bench run --trainer native runs every one)."""
    if algo in NOT_ON_VERL:
        raise VerlError(f"{algo} runs on the native trainer only (--trainer native): {NOT_ON_VERL[algo]}")


def installed_verl_version(python: str | None = None) -> str | None:
    """The verl version importable by `python` (default: this interpreter); None if absent.
    Asked once per interpreter (its path as PATH resolves it) and process: a sweep's or a
    dry-run grid's verl cells ask one subprocess, not one each (~0.4 s apiece)."""
    exe = python or sys.executable
    return _verl_version_of(shutil.which(exe) or exe)


@lru_cache(maxsize=None)
def _verl_version_of(exe: str) -> str | None:
    r = subprocess.run([exe, "-c", "import importlib.metadata as m; print(m.version('verl'))"],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def validate_cells(python: str, cells: list[list[str]]) -> list[str | None]:
    """verl's own checks of each override list (runners/verl_check.py, run by verl's
    interpreter `python`): None where verl accepts the cell, else verl's error."""
    r = subprocess.run([python, str(Path(__file__).with_name("verl_check.py"))], input=json.dumps(cells),
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise VerlError(f"verl's config check did not run: {r.stderr.strip()[-1500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


LAUNCH_MODULES = {"transfer_queue": "TransferQueue (verl's V1 trainer)", "vllm": "vLLM (the rollout engine)"}


def missing_launch_modules(python: str) -> list[str]:
    """What `python -m verl.trainer.main_ppo` imports once Ray is up and a base `pip install
    verl` lacks (`pip install "verl[vllm]"` brings both); checked before launching."""
    code = "import importlib.util as u; print(' '.join(m for m in %r if u.find_spec(m) is None))" % list(LAUNCH_MODULES)
    r = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return [LAUNCH_MODULES[m] for m in r.stdout.split()]


def check_verl_version(version: str | None) -> None:
    if version is None:
        raise VerlError("verl is not installed for that interpreter: pip install 'verl==0.9.1' (after torch), "
                        "in its own environment (it needs transformers < 5.11), and pass --verl-python")
    if version not in SUPPORTED_VERL:
        raise VerlError(f"verl {version} is installed; bench's overrides are written for verl "
                        f"{', '.join(SUPPORTED_VERL)} (keys changed across 0.6–0.9; docs/verl.md)")


def export_parquet(problems: list[Problem], path: Path, data_source: str) -> Path:
    """verl's RL parquet: data_source, chat `prompt` (problem + the paper's instruction),
    ability, reward_model.ground_truth, extra_info (id, index)."""
    import pandas as pd

    rows = [{"data_source": data_source,
             "prompt": [{"role": "user", "content": f"{p.problem}\n{INSTRUCTION}"}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": p.answer},
             "extra_info": {"id": p.id, "index": i}} for i, p in enumerate(problems)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def _dr(max_len: int) -> list[str]:
    """Dr.GRPO aggregation: seq-mean-token-sum-norm with an explicit normaliser."""
    return ["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
            f"actor_rollout_ref.actor.loss_scale_factor={max_len}"]


def _bypass(threshold: str) -> list[str]:
    return [f"{RC}.bypass_mode=True", f"{RC}.loss_type=reinforce", f"{RC}.rollout_is=sequence",
            f"{RC}.rollout_is_threshold={threshold}",
            "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode",
            "+actor_rollout_ref.actor.policy_loss.rollout_correction=${algorithm.rollout_correction}"]


def _lo_hi(lo: float, hi: float) -> str:
    """verl's "lower_upper" threshold string, quoted: unquoted, Hydra reads 1e-9_3 as a number."""
    return f"'{lo:g}_{hi:g}'"


def _rs(mode: str, threshold: str) -> list[str]:
    """verl's rejection (rollout_rs): a rejected token or sequence leaves verl's response_mask."""
    return [f"{RC}.rollout_rs={mode}", f"{RC}.rollout_rs_threshold={threshold}"]


def algo_overrides(algo: str, max_len: int, C: float = 3.0, algo_cfg: AlgoConfig | None = None) -> list[str]:
    """The verl 0.9.1 overrides of one algorithm (docs/verl.md, "Where bench's overrides differ from
    verl's defaults"), its thresholds read from `algo_cfg` (default: AlgoConfig's, C given apart).
    The algorithms of NOT_ON_VERL have none (VerlError)."""
    a = algo_cfg or AlgoConfig()
    table = {
        "grpo": _dr(max_len),
        "grpo-token-tis": _dr(max_len) + [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold={C:g}"],
        "grpo-seq-mis": _dr(max_len) + [f"{RC}.rollout_is=sequence", f"{RC}.rollout_is_threshold='1e-9_{C:g}'"],
        "gspo": ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.clip_ratio_low=3e-4",
                 "actor_rollout_ref.actor.clip_ratio_high=4e-4",
                 "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"],
        "pg-seq-is": _dr(max_len) + _bypass("1e30"),
        "pg-seq-tis": _dr(max_len) + _bypass(f"{C:g}"),
        "pg-seq-mis": _dr(max_len) + _bypass(f"'1e-9_{C:g}'"),
        "icepop": _dr(max_len) + [f"{RC}.rollout_is=token",
                                  f"{RC}.rollout_is_threshold={_lo_hi(a.icepop_lo, a.icepop_hi)}"],
        "trm": _dr(max_len) + _rs("seq_max_k2", f"{a.trm_k2:g}"),
        "grpo-geo-mask": _dr(max_len) + _rs("seq_mean_k1", _lo_hi(a.geo_lo, a.geo_hi)),
        # verl's cispo clamps r to [1 − clip_ratio_low, 1 + clip_ratio_high]: TRL's min(r, ε_high) is
        # clip_ratio_low = 1 (r > 0: no lower bound) and clip_ratio_high = ε_high − 1
        "cispo": _dr(max_len) + ["actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
                                 "actor_rollout_ref.actor.clip_ratio_low=1.0",
                                 f"actor_rollout_ref.actor.clip_ratio_high={a.cispo_eps_hi - 1:g}"],
        "cispo-two-sided": _dr(max_len) + ["actor_rollout_ref.actor.policy_loss.loss_mode=cispo"],
    }
    if algo not in table:
        check_algorithm(algo)         # the algorithms of NOT_ON_VERL say why
        raise VerlError(f"unknown algorithm {algo!r}; choose one of {', '.join(table)}")
    common = ["algorithm.adv_estimator=rloo", "actor_rollout_ref.actor.use_kl_loss=False",
              "actor_rollout_ref.actor.ppo_epochs=1", "actor_rollout_ref.rollout.calculate_log_probs=True"]
    if set(PPO) <= set(SPECS[algo].thresholds):      # it reads ε_lo, ε_hi: verl's clip ratios (PPO, CISPO)
        common += [f"actor_rollout_ref.actor.clip_ratio_low={a.eps_lo:g}",
                   f"actor_rollout_ref.actor.clip_ratio_high={a.eps_hi:g}",
                   "actor_rollout_ref.actor.clip_ratio_c=1e9"]           # no dual-clip, as bench's loss
    return common + table[algo]


def precision_overrides(p: Precision) -> list[str]:
    """Rollout dtype for vLLM; the FSDP engine's autocast dtype (with ShardedGradScaler for
    fp16) via `+…mixed_precision.param_dtype`, which is not in the yaml (hence the `+`).

    Formats below 16 bits and bf16+head32 (bench/formats.py), as far as verl 0.9.1 can say them:
    rollout=fp8 is vLLM in bf16 with `actor_rollout_ref.rollout.quantization=fp8`, verl's online
    fp8, which is *block-wise* (128×128 weight blocks, dynamic per-token-group activations:
    finer scales than bench's per-channel/per-token fp8) and leaves lm_head in bf16. verl 0.9.1
    has no W8A8 int8 or online NVFP4 or MXFP4 rollout, no fp32-head option for its vLLM rollout or its
    FSDP actor, and no fp8 training outside QAT recipes: those cells are refused (VerlError) and run natively."""
    refused = {"int8": "an int8 rollout (vLLM and verl have no W8A8 int8 path)",
               "nvfp4": "an nvfp4 rollout (vLLM runs NVFP4 only from pre-quantized checkpoints)",
               "mxfp4": "an mxfp4 rollout (vLLM runs MXFP4 only from pre-quantized checkpoints)",
               "bf16+head32": "an fp32 lm_head (verl exposes no head dtype for vLLM or FSDP)",
               "bf16+router32": "an fp32 MoE router (verl exposes no router dtype for vLLM or FSDP)",
               "fp16+router32": "an fp32 MoE router (verl exposes no router dtype for vLLM or FSDP)"}
    if p.rollout in refused or p.train in refused or p.train == "fp8":
        what = (refused.get(p.rollout) or refused.get(p.train)
                or "fp8 training (FSDP trains in fp32/bf16/fp16; verl's fp8 is for the rollout only)")
        raise VerlError(f"verl 0.9.1 cannot run {p.name}: it has no {what}; run this cell with the native "
                        f"trainer (drop --trainer verl)")
    out = [f"actor_rollout_ref.rollout.dtype={ROLLOUT_DTYPE[p.rollout]}"]
    if p.rollout == "fp8":
        out.append("actor_rollout_ref.rollout.quantization=fp8")
    return out + [f"+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={VERL_DTYPE[p.train]}",
                  f"+actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype={VERL_DTYPE[p.train]}"]


@dataclass(frozen=True)
class VerlTarget:
    """Where verl runs: the interpreter of the environment that has verl, and the cluster's shape."""

    python: str = "python"
    gpus: int = 1
    nodes: int = 1


@dataclass
class VerlJob:
    model_path: str
    train_file: Path
    val_file: Path | None
    reward_file: Path
    metrics_file: Path
    project: str
    experiment: str
    checkpoint_dir: Path | None = None
    target: VerlTarget = VerlTarget()          # verl's interpreter, GPUs and nodes


# what sets each key of bench's command that is not the algorithm's or the precision's (the cell's
# keys a --verl-override may not replace: runners/verl_overrides.py); DEFAULTS there are bench's defaults
_JOB = "the run's own directory and its exported split, reward and logger (bench follows verl's file logger)"
SEED_KEYS = ("data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.actor.data_loader_seed",
             "actor_rollout_ref.actor.fsdp_config.seed")
OWNERS = {
    **dict.fromkeys(("data.train_files", "data.val_files", "actor_rollout_ref.model.path",
                     "reward.custom_reward_function.path", "reward.custom_reward_function.name", "trainer.logger",
                     "trainer.project_name", "trainer.experiment_name", "trainer.default_local_dir",
                     "trainer.resume_mode", "actor_rollout_ref.rollout.name"), _JOB),
    **dict.fromkeys(SEED_KEYS, "--seed / --seeds"),
    "data.train_batch_size": "--prompts-per-step", "data.max_response_length": "--max-tokens",
    "actor_rollout_ref.actor.optim.lr": "--lr", "actor_rollout_ref.actor.ppo_mini_batch_size": "--updates-per-batch",
    "actor_rollout_ref.rollout.n": "--samples-per-prompt", "actor_rollout_ref.rollout.temperature": "--temperature",
    "actor_rollout_ref.rollout.top_p": "--top-p", "trainer.n_gpus_per_node": "--gpus", "trainer.nnodes": "--nodes",
    "trainer.test_freq": "--eval-every", "trainer.total_training_steps": "--max-steps",
    "trainer.save_freq": "--checkpoint-every", "actor_rollout_ref.rollout.val_kwargs.n": "--benchmark (the preset's)",
    "actor_rollout_ref.rollout.val_kwargs.temperature": "--benchmark (the preset's)",
    "actor_rollout_ref.rollout.val_kwargs.top_p": "--benchmark (the preset's)",
    "actor_rollout_ref.rollout.val_kwargs.do_sample": "--benchmark (the preset's)",
    "actor_rollout_ref.rollout.response_length": "--max-tokens",
}
_CELL_PATTERNS = {"algorithm.*": "--algo", "actor_rollout_ref.actor.policy_loss.*": "--algo",
                  "actor_rollout_ref.actor.clip_ratio*": "--algo", "actor_rollout_ref.actor.loss_*": "--algo",
                  "actor_rollout_ref.actor.use_kl_loss": "--algo", "actor_rollout_ref.actor.ppo_epochs": "--algo",
                  "actor_rollout_ref.rollout.calculate_log_probs": "--algo (bench's mismatch metrics need μ)",
                  "actor_rollout_ref.rollout.dtype": "--dtype", "actor_rollout_ref.rollout.quantization": "--dtype",
                  "actor_rollout_ref.rollout.kv_cache_dtype": "--dtype",
                  "actor_rollout_ref.actor.fsdp_config.mixed_precision.*": "--dtype",
                  "actor_rollout_ref.ref.fsdp_config.mixed_precision.*": "--dtype",
                  "actor_rollout_ref.actor.fsdp_config.model_dtype": "--dtype",
                  "actor_rollout_ref.ref.fsdp_config.model_dtype": "--dtype"}


def owner(key: str) -> str | None:
    """What sets verl key `key`, or a key under it, in bench's command for some cell (None: no cell
    sets it): `actor_rollout_ref.actor.optim={lr:1}` would set `--lr`'s key as Hydra merges it."""
    direct = OWNERS.get(key) or next((why for pat, why in _CELL_PATTERNS.items() if fnmatchcase(key, pat)), None)
    under = key + "."
    return direct or next((f"{why} (its key {k.rstrip('.*')} is under this one)"
                           for k, why in [*OWNERS.items(), *_CELL_PATTERNS.items()]
                           if k.split("*", 1)[0].startswith(under)), None)


def check_verl_cell(algo: str, cfg: RunConfig) -> None:
    """Refuse what verl 0.9.1 cannot run to its end: pg-seq-mis, a staleness K > 0, router
    replay (runners/verl_runner.py says why for each), the built-in engine's cascade attention; and
    a --verl-override of a key the cell sets."""
    check_algorithm(algo)
    if cfg.staleness:
        raise VerlError(VERL_STALENESS)
    if cfg.router_replay:
        raise VerlError(VERL_ROUTER_REPLAY)
    if cfg.cascade_attention:
        raise VerlError("--cascade-attention is the built-in engine's decode attention; verl rolls out with vLLM")
    check_overrides(algo, cfg)


def check_overrides(algo: str, cfg: RunConfig) -> None:
    """Refuse a user override (`cfg.verl_settings`, `cfg.verl_resources`) of a key the cell sets
    (ConfigError naming what sets it), before anything is written: `verl_command` merges them the
    same way."""
    merge(algo_overrides(algo, cfg.max_tokens, cfg.algo.C, cfg.algo), [*cfg.verl_settings, *cfg.verl_resources],
          owner)


def verl_command(algo: str, p: Precision, cfg: RunConfig, job: VerlJob,
                 entry: str = "verl.trainer.main_ppo") -> tuple[list[str], dict]:
    """The argv and extra environment that launch verl (`python -m entry`) for one cell: bench's
    overrides, the run's seed in each of verl's seeds (`SEED_KEYS`), then the user's own
    (`cfg.verl_settings`, `cfg.verl_resources`: runners/verl_overrides.py `merge`)."""
    mini = max(1, cfg.prompts_per_step // max(1, cfg.updates_per_batch))
    args = [
        f"data.train_files={job.train_file}",
        f"data.val_files={job.val_file or job.train_file}",
        f"data.train_batch_size={cfg.prompts_per_step}", "data.max_prompt_length=1024",
        f"data.max_response_length={cfg.max_tokens}", "data.filter_overlong_prompts=True",
        f"actor_rollout_ref.model.path={job.model_path}", "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.strategy=fsdp2", f"actor_rollout_ref.actor.optim.lr={cfg.lr:g}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.n={cfg.samples_per_prompt}",
        f"actor_rollout_ref.rollout.temperature={cfg.temperature:g}", f"actor_rollout_ref.rollout.top_p={cfg.top_p:g}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"reward.custom_reward_function.path={job.reward_file}", "reward.custom_reward_function.name=compute_score",
        "trainer.logger=[console,file]", f"trainer.project_name={job.project}",
        f"trainer.experiment_name={job.experiment}", f"trainer.n_gpus_per_node={job.target.gpus}",
        f"trainer.nnodes={job.target.nodes}", f"trainer.test_freq={cfg.eval_every}",
        f"trainer.total_training_steps={cfg.max_steps}", f"trainer.save_freq={cfg.checkpoint_every}",
        "trainer.resume_mode=auto", "trainer.val_before_train=True",
    ]
    if job.checkpoint_dir:
        args.append(f"trainer.default_local_dir={Path(job.checkpoint_dir).resolve()}")
    if cfg.benchmarks:
        b = cfg.benchmarks[0]
        args += [f"actor_rollout_ref.rollout.val_kwargs.n={b.n}",
                 f"actor_rollout_ref.rollout.val_kwargs.temperature={b.temperature:g}",
                 f"actor_rollout_ref.rollout.val_kwargs.top_p={b.top_p:g}",
                 "actor_rollout_ref.rollout.val_kwargs.do_sample=True"]
    args += [f"{k}={cfg.seed}" for k in SEED_KEYS]
    bench = [*algo_overrides(algo, cfg.max_tokens, cfg.algo.C, cfg.algo), *precision_overrides(p), *args]
    argv = [job.target.python, "-m", entry, *merge(bench, [*cfg.verl_settings, *cfg.verl_resources], owner)]
    return argv, {"VERL_FILE_LOGGER_PATH": str(job.metrics_file.resolve())}


def shell_line(argv: list[str], env: dict) -> str:
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *map(shlex.quote, argv)])


def map_metrics(data: dict) -> dict[str, float | None]:
    """One verl log line's metrics under bench's names (unmapped ones keep verl's name under
    a `verl/` prefix; validation scores become `eval/<data_source>`)."""
    out: dict[str, float | None] = {}
    for k, v in data.items():
        if k in METRIC_MAP:
            out[METRIC_MAP[k]] = v
        elif k.startswith("val-core/") and "/acc/mean@" in k:
            out[f"eval/{k[len('val-core/'):].rsplit('/acc/mean@', 1)[0]}"] = v
        else:
            out[f"verl/{k}"] = v
    return out
