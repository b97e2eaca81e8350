"""The prepared GPU check: one command, one JSON, on a bare CUDA machine with a checkout of
bench, PyTorch and transformers (no vLLM, no network, no hub, no store).

    python benchmarks/gpu_check.py --out gpu_check.json              # a CUDA machine, ≤ 8 minutes
    python benchmarks/gpu_check.py --shrink --device cpu --out x.json  # small shapes, seconds (CI)
    python benchmarks/gpu_check.py --memory-table                      # the README's computed memory table

What it measures, with a model of DeepSeek-R1-Distill-Qwen-1.5B's shapes (benchmarks/configs/
r1-distill-qwen-1.5b.json: hidden 1536, 28 layers, 12 heads / 2 KV heads, intermediate 8960,
vocabulary 151,936, untied head; 1.78B parameters) with random weights (seed 0):

  rollout      the built-in engine (bench/engines/torch_engine.py) at bf16 and fp16: 64 prompts
               of 128 random tokens × 8 samples, 1,024 new tokens each (no EOS can end a row),
               T=1, top-p 1: tokens/s, samples/s, peak memory
  train_step   one training step of the native trainer's training engine (runners/train_engine.py)
               at the paper's batch: 64 × 8 sequences of 128 prompt + 1,024 or 4,096 response
               tokens, π_old forward, then 4 optimizer steps (mini-batches of 128 sequences),
               bf16 compute over fp32 master weights and AdamW, Dr.GRPO loss, micro-batches of
               32,768 tokens with activation checkpointing: seconds, tokens/s, peak memory, and
               the peak the README's formula predicts for the same setting
  mismatch     offline mismatch of the same-format pairs fp32, bf16, fp16 (rollout = training
               format), built-in engine against the training engine's scoring, on the embedded
               tiny-math model (64 synthetic-hard problems × 8, ≤ 64 tokens) and on the random
               1.5B (32 prompts × 4, in four groups of 64, 128, 192 and 256 tokens: it never
               emits EOS): mean |π−μ|, KL k3 per token, log-ratio slope per 1K tokens
               (bench/mismatch.py, as `bench mismatch` reports them)

  smollm2      the same three on a random model of SmolLM2-135M's shapes (benchmarks/configs/
               smollm2-135m.json: Llama, hidden 576, 30 layers, 9 heads / 3 KV heads, intermediate
               1,536, vocabulary 49,152, tied head; 134.5M parameters) at the small preset's
               sizes (runners/presets.py): rollouts of 8 prompts of 64 tokens × 8 samples, 128 new
               tokens, at bf16 and fp16; one pg-seq-is step at fp16 over 128 response tokens,
               micro-batches of 2,048 tokens, activation checkpointing; the mismatch of 16
               prompts × 4 (the real weights never reach a lent device: the speed and memory of
               its shapes, not its mismatch, which random weights do not have)

Every section has a time check (the whole run stays within --budget-s) and catches its own
errors (e.g. out of memory), which the JSON records before the next section runs. Peak memory
is torch.cuda.max_memory_allocated per section on CUDA, the process's peak RSS on a CPU.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import platform
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))           # a checkout: bench need not be installed

import torch  # noqa: E402

CONFIG = ROOT / "benchmarks" / "configs" / "r1-distill-qwen-1.5b.json"
SMOLLM2_CONFIG = ROOT / "benchmarks" / "configs" / "smollm2-135m.json"
SCHEMA = "bench-gpu-check/1"


@dataclass(frozen=True)
class CheckPlan:
    prompts: int = 64                   # rollout and training batch: prompts × samples
    samples: int = 8
    prompt_tokens: int = 128
    new_tokens: int = 1024              # rollout length
    train_lengths: tuple[int, ...] = (1024, 4096)
    updates: int = 4                    # optimizer steps per batch (the paper's 4 mini-batches)
    microbatch_tokens: int = 32768
    checkpointing: bool = True
    train_dtype: str = "bf16"
    algo: str = "grpo"
    mm_prompts: int = 32                # random-model mismatch
    mm_samples: int = 4
    mm_tokens: int = 256
    tiny_limit: int = 64                # tiny-math mismatch
    tiny_n: int = 8
    shapes: dict | None = None          # config overrides (--shrink)
    # seconds a section needs left in the budget to start (a CUDA machine's estimates)
    need_s: tuple[tuple[str, float], ...] = (("rollout", 45.0), ("train_1024", 45.0), ("train_4096", 150.0),
                                             ("mismatch_tiny", 15.0), ("mismatch_random", 45.0), ("smollm2", 45.0))


FULL = CheckPlan()
SHRINK = CheckPlan(prompts=4, samples=2, prompt_tokens=8, new_tokens=16, train_lengths=(16, 64), microbatch_tokens=160,
              mm_prompts=4, mm_samples=2, mm_tokens=16, tiny_limit=8, tiny_n=2,
              shapes={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512,
                      "bos_token_id": 1, "eos_token_id": 1},
              need_s=())
# SmolLM2-135M's shapes at the small preset's sizes (the `smollm2` section); shrunk: SHRINK's shapes
SMOLLM2 = CheckPlan(prompts=8, samples=8, prompt_tokens=64, new_tokens=128, train_lengths=(128,), updates=1,
                    microbatch_tokens=2048, checkpointing=True, train_dtype="fp16", algo="pg-seq-is",
                    mm_prompts=16, mm_samples=4, mm_tokens=128)
SMOLLM2_SHRINK = replace(SMOLLM2, prompts=4, samples=2, prompt_tokens=8, new_tokens=16, train_lengths=(16,),
                         microbatch_tokens=40, mm_prompts=4, mm_samples=2, mm_tokens=16,
                         shapes={k: v for k, v in SHRINK.shapes.items() if k not in ("bos_token_id", "eos_token_id")})


# ------------------------------------------------------------------ memory (computed)

def param_count(c: dict) -> int:
    """Parameters of a Qwen2- or Llama-style causal LM (q/k/v biases where `attention_bias`, as
    Qwen2's always; RMSNorms; untied or tied head)."""
    h, n, i, v = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    b = 1 if c.get("attention_bias", True) else 0
    layer = (h * h + b * h) + 2 * (h * kv + b * kv) + h * h + 3 * h * i + 2 * h
    return v * h * (1 if c.get("tie_word_embeddings") else 2) + n * layer + h


def memory_model(c: dict, microbatch_tokens: int, checkpointing: bool, rollout_rows: int = 0, rollout_len: int = 0,
                 compute_bytes: int = 2, logit_chunk: int = 2 ** 26, rollout_engine: bool = True,
                 staleness: int = 0) -> dict:
    """Bytes the native trainer holds on one device (the README's formula, COMPUTED):

      static       = P·(4 master fp32 + 8 AdamW m,v fp32 + 4 master grads fp32
                        + 2 compute copy + 2 compute grads [16-bit train] + 2 rollout copy [built-in engine]
                        + 2 π_old model [staleness K > 0; 4 in fp32 training])
      host         = K·P·4                               staleness: K fp32 snapshots, in host memory
      activations  = M·L·(6H + 2H_kv + 4I)·2            without activation checkpointing
                   = M·L·H·2 + 2·M·(6H + 2H_kv + 4I)·2   with it (layer inputs + one layer recomputed)
      logits       = min(chunk, M·V)·(2 + 4 + 4)         one chunk of 16-bit logits, fp32 copy, log-softmax
      kv_cache     = rows·len·2·L·H_kv·2                 built-in engine, bf16, during rollouts only
      peak         = static + max(activations + logits, kv_cache)

    P parameters, L layers, H hidden, H_kv = head_dim × KV heads, I intermediate, V vocabulary,
    M tokens per micro-batch, chunk = runners/logprobs.py's 2^26 logits. Ignores allocator
    fragmentation, temporary GEMM workspaces and the CUDA context (~0.5 GiB): read it as a floor."""
    p = param_count(c)
    h, n, i = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    per_tok_layer = (6 * h + 2 * kv + 4 * i) * 2
    static = {"master_fp32": 4 * p, "adamw_fp32": 8 * p, "master_grads_fp32": 4 * p,
              "compute_copy": compute_bytes * p if compute_bytes != 4 else 0,
              "compute_grads": compute_bytes * p if compute_bytes != 4 else 0,
              "rollout_engine": 2 * p if rollout_engine else 0,
              "stale_pi_old_model": compute_bytes * p if staleness else 0}
    act = (microbatch_tokens * n * h * 2 + 2 * microbatch_tokens * per_tok_layer if checkpointing
           else microbatch_tokens * n * per_tok_layer)
    logits = min(logit_chunk, microbatch_tokens * c["vocab_size"]) * (2 + 4 + 4)
    kv_cache = rollout_rows * rollout_len * 2 * n * kv * 2
    total_static = sum(static.values())
    return {"params": p, "static": static, "static_total": total_static, "activations": act, "logits_chunk": logits,
            "kv_cache": kv_cache, "peak": total_static + max(act + logits, kv_cache), "host": staleness * 4 * p}


MODELS = {   # the README's table: Qwen2-family shapes
    "0.5B (Qwen2.5-0.5B)": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                            "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                            "tie_word_embeddings": True},
    "1.5B (R1-Distill-Qwen-1.5B)": None,       # benchmarks/configs/r1-distill-qwen-1.5b.json
    "7B (R1-Distill-Qwen-7B)": {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
                                "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
                                "tie_word_embeddings": False},
}


def memory_table() -> str:
    """The README's table (COMPUTED by memory_model, bf16 training with the built-in engine)."""
    gib = 2 ** 30
    rows = ["| model | params | static: 22 B/param | activations + logits chunk, 32K-token micro-batch, "
            "checkpointing | the same without checkpointing | rollout KV cache, 512 rows × 1,152 tokens | "
            "64 rows × 8,320 tokens | peak, 1K-token responses, 512 rows, checkpointing | "
            "peak, 8K-token responses, 64 rows, checkpointing |", "|---|---|---|---|---|---|---|---|---|"]
    for name, c in MODELS.items():
        c = c or json.loads(CONFIG.read_text())
        on = memory_model(c, 32768, True, 512, 1152)
        off = memory_model(c, 32768, False)
        on8k = memory_model(c, 32768, True, 64, 8320)
        rows.append(f"| {name} | {on['params'] / 1e9:.2f}B | {on['static_total'] / gib:.1f} GiB | "
                    f"{(on['activations'] + on['logits_chunk']) / gib:.1f} GiB | "
                    f"{(off['activations'] + off['logits_chunk']) / gib:.1f} GiB | {on['kv_cache'] / gib:.1f} GiB | "
                    f"{on8k['kv_cache'] / gib:.1f} GiB | {on['peak'] / gib:.1f} GiB | {on8k['peak'] / gib:.1f} GiB |")
    return "\n".join(rows)


# ------------------------------------------------------------------ pieces

class IdTokenizer:
    """A tokenizer for a model without one: prompts are space-separated token ids. No EOS
    (-1 is never sampled), so every row runs to the length limit."""

    eos_token_id = -1
    pad_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def random_model(plan: CheckPlan, device: str, config: Path = CONFIG):
    from transformers import AutoConfig, AutoModelForCausalLM

    c = json.loads(config.read_text())
    c.update(plan.shapes or {})
    cfg = AutoConfig.for_model(c.pop("model_type"), **{k: v for k, v in c.items() if k != "architectures"})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval(), {**json.loads(config.read_text()), **(plan.shapes or {})}


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join(map(str, torch.randint(1, vocab, (length,), generator=g).tolist())) for _ in range(n)]


def rollout(master, dtype: str, plan: CheckPlan, device: str, vocab: int) -> dict:
    from bench.device import peak_memory_mb, reset_peak_memory, synchronize
    from bench.engines import Sampling
    from bench.engines.torch_engine import TorchEngine

    rows = plan.prompts * plan.samples
    eng = TorchEngine("random", dtype, model=copy.deepcopy(master), tokenizer=IdTokenizer(), device=device,
                      max_batch=rows)
    try:
        eng.generate(random_prompts(1, plan.prompt_tokens, vocab, 99), 2, Sampling(1.0, 1.0, 4, seed=1))  # warm-up
        prompts = random_prompts(plan.prompts, plan.prompt_tokens, vocab, 0)
        synchronize(device)
        reset_peak_memory(device)
        t0 = time.perf_counter()
        samples = eng.generate(prompts, plan.samples, Sampling(1.0, 1.0, plan.new_tokens, seed=0))
        synchronize(device)
        dt = time.perf_counter() - t0
    finally:
        eng.close()
        del eng
    tokens = sum(len(s.token_ids) for row in samples for s in row)
    return {"prompts": plan.prompts, "samples_per_prompt": plan.samples, "prompt_tokens": plan.prompt_tokens,
            "new_tokens": plan.new_tokens, "rows_per_batch": rows, "tokens": tokens, "seconds": dt,
            "tokens_per_s": tokens / dt, "samples_per_s": rows / dt, "peak_memory_mb": peak_memory_mb(device)}


def train_step(engine, plan: CheckPlan, length: int, device: str, vocab: int, config: dict) -> dict:
    """One step of the training engine as the native trainer runs it after its rollouts."""
    from bench.device import peak_memory_mb, reset_peak_memory, synchronize
    from runners.algos import LossInputs, leave_one_out_advantages
    from runners.train_engine import Batch

    n = plan.prompts * plan.samples
    g = torch.Generator().manual_seed(length)
    prompts = [torch.randint(1, vocab, (plan.prompt_tokens,), generator=g).tolist() for _ in range(plan.prompts)]
    responses = [torch.randint(1, vocab, (length,), generator=g).tolist() for _ in range(n)]
    engine.cfg.algo.max_len = length
    synchronize(device)
    reset_peak_memory(device)
    engine.passes = 0
    t0 = time.perf_counter()
    batch = Batch.pack([p for p in prompts for _ in range(plan.samples)], responses, 0, device)
    engine.sync_compute()
    logp_old = engine.logprobs(batch)
    synchronize(device)
    t1 = time.perf_counter()
    # μ a little off π_old (a rollout engine's mismatch), rewards 0/1 → leave-one-out advantages
    logp_rollout = (logp_old + 1e-3 * torch.randn(logp_old.shape, generator=g).to(device)) * batch.mask
    rewards = torch.randint(0, 2, (n,), generator=g).float()
    adv = leave_one_out_advantages(rewards.view(-1, plan.samples)).view(-1).to(device)
    x = LossInputs(None, logp_old, logp_rollout, batch.mask, adv)  # type: ignore[arg-type]
    order = torch.randperm(n, generator=g)
    out = [engine.update(x, chunk, batch) for chunk in order.chunk(plan.updates)]
    synchronize(device)
    t2 = time.perf_counter()
    mm = memory_model(config, plan.microbatch_tokens, plan.checkpointing,
                      compute_bytes=4 if plan.train_dtype == "fp32" else 2, rollout_engine=False)
    return {"sequences": n, "prompt_tokens": plan.prompt_tokens, "response_tokens": length,
            "tokens": batch.tokens, "optimizer_steps": plan.updates, "applied": sum(o[3] for o in out),
            "train_dtype": plan.train_dtype, "algo": plan.algo, "max_tokens_per_microbatch": plan.microbatch_tokens,
            "gradient_checkpointing": plan.checkpointing, "micro_batches": engine.passes,
            "seconds": t2 - t0, "seconds_pi_old": t1 - t0, "seconds_updates": t2 - t1,
            "tokens_per_s": batch.tokens / (t2 - t0), "loss": [o[0] for o in out], "grad_norm": [o[1] for o in out],
            "peak_memory_mb": peak_memory_mb(device), "computed_peak_mb": mm["peak"] / 2 ** 20}


def mismatch(base, tokenizer, prompts: list[str], n: int, max_tokens: int | list[int], device: str,
             formats=("fp32", "bf16", "fp16"), score_rows: int = 64) -> dict:
    """Same-format pairs: μ from the built-in engine in format d, π from the training
    engine's compute copy in d, on the same tokens (what `bench mismatch` does, without the
    store). A list of max_tokens splits the prompts into as many groups, each sampled to its
    own length (a model that never ends a response still gets a log-ratio-vs-length slope)."""
    from bench.engines import Sampling
    from bench.engines.torch_engine import TorchEngine
    from bench.mismatch import mismatch_metrics
    from bench.model_formats import prepare_compute_model
    from runners.logprobs import response_logprobs
    from runners.train_engine import Batch

    pids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    out = {}
    for d in formats:
        t0 = time.perf_counter()
        eng = TorchEngine("model", d, model=copy.deepcopy(base), tokenizer=tokenizer, device=device,
                          max_batch=len(prompts) * n)
        lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens]
        groups = [prompts[k::len(lengths)] for k in range(len(lengths))]
        by_prompt = {}
        for group, length in zip(groups, lengths):
            if group:
                by_prompt.update(zip(group, eng.generate(group, n, Sampling(1.0, 1.0, length, seed=0))))
        samples = [by_prompt[p] for p in prompts]
        eng.close()
        del eng
        _free()
        model = prepare_compute_model(copy.deepcopy(base), d, device).eval()
        flat = [(pids[i], s) for i, row in enumerate(samples) for s in row]
        t_max = max(len(s.token_ids) for _, s in flat)
        mu, pi, mask = (torch.zeros(len(flat), t_max) for _ in range(3))
        for a in range(0, len(flat), score_rows):
            part = flat[a:a + score_rows]
            b = Batch.pack([p for p, _ in part], [s.token_ids for _, s in part], tokenizer.pad_token_id or 0, device)
            with torch.no_grad():
                lp = (response_logprobs(model, *b.tensors) * b.mask).cpu()
            pi[a:a + len(part), :lp.shape[1]] = lp
            mask[a:a + len(part), :lp.shape[1]] = b.mask.cpu()
            for k, (_, s) in enumerate(part):
                mu[a + k, :len(s.logprobs)] = torch.tensor(s.logprobs)
        del model
        _free()
        m = mismatch_metrics(mu, pi, mask)
        out[d] = {"pair": f"{d}/{d}", "tokens": int(mask.sum().item()), "sequences": len(flat),
                  "prob_abs_diff_mean": m["prob_abs_diff_mean"], "kl_k3": m["kl_k3"], "kl_k1": m["kl_k1"],
                  "log_ratio_slope": m["log_ratio_slope"], "log_ratio_slope_se": m.get("log_ratio_slope_se"),
                  "seconds": time.perf_counter() - t0}
    return out


# ------------------------------------------------------------------ the check

def environment(device: str) -> dict:
    import transformers

    from bench.provenance import device_facts, git_commit

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "bench": git_commit(ROOT), **device_facts(device)}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        env["device_memory_mb"] = props.total_memory / 2 ** 20
    return env


def run_check(plan: CheckPlan, device: str, budget_s: float, log=print) -> dict:
    from bench.models import load_model, load_tokenizer, render_prompt, resolve_model
    from bench.synthetic import synthetic_examples

    start = time.perf_counter()
    need = dict(plan.need_s)
    result: dict = {"schema": SCHEMA, "shrink": plan.shapes is not None, "device": device,
                    "plan": {k: v for k, v in plan.__dict__.items() if k != "need_s"},
                    "environment": environment(device), "model": {}, "rollout": {}, "train_step": {},
                    "mismatch": {}, "smollm2": {}, "skipped": {}, "errors": {}}

    def section(name: str, key: str, fn):
        left = budget_s - (time.perf_counter() - start)
        if left < need.get(key, 0.0) or left <= 0:
            result["skipped"][name] = f"time budget: {left:.0f} s left, the section needs ~{need.get(key, 0):.0f} s"
            log(f"skip {name}: {result['skipped'][name]}")
            return None
        t0 = time.perf_counter()
        try:
            out = fn()
            log(f"{name}: {time.perf_counter() - t0:.1f} s")
            return out
        except Exception as e:                       # e.g. torch.cuda.OutOfMemoryError: record, free, go on
            result["errors"][name] = f"{type(e).__name__}: {e}"[:2000]
            result["errors"][name + "_traceback"] = traceback.format_exc()[-4000:]
            log(f"{name} failed: {type(e).__name__}: {e}")
            return None
        finally:
            _free()

    t0 = time.perf_counter()
    master, config = random_model(plan, device)
    vocab = config["vocab_size"]
    result["model"] = {"config": str(CONFIG.relative_to(ROOT)), "overrides": plan.shapes, "weights": "random (seed 0)",
                       "params": sum(p.numel() for p in master.parameters()), "params_formula": param_count(config),
                       "seconds_to_build": time.perf_counter() - t0}
    for d in ("bf16", "fp16"):
        r = section(f"rollout {d}", "rollout", lambda d=d: rollout(master, d, plan, device, vocab))
        if r:
            result["rollout"][d] = r
    try:
        with training_engine(master, plan, device, lr=1e-6) as engine:
            for length in plan.train_lengths:
                key = "train_1024" if length <= 1024 else "train_4096"
                r = section(f"train_step {length}", key,
                            lambda n=length, e=engine: train_step(e, plan, n, device, vocab, config))
                if r:
                    result["train_step"][str(length)] = r
    except Exception as e:
        result["errors"]["train_engine"] = f"{type(e).__name__}: {e}"[:2000]
    master = master.eval()

    def tiny():
        ref = resolve_model("tiny-math")
        tok = load_tokenizer(ref)
        base = load_model(ref, torch.float32).to(device)
        probs = synthetic_examples("synthetic-hard", plan.tiny_limit)
        prompts = [render_prompt(ref, tok, p["problem"]) for p in probs]
        return mismatch(base, tok, prompts, plan.tiny_n, 64 if plan.shapes is None else 16, device)

    r = section("mismatch tiny-math", "mismatch_tiny", tiny)
    if r:
        result["mismatch"]["tiny-math"] = r
    r = section("mismatch random-1.5b", "mismatch_random",
                lambda: mismatch(master, IdTokenizer(), random_prompts(plan.mm_prompts, plan.prompt_tokens, vocab, 7),
                                 plan.mm_samples, [plan.mm_tokens * k // 4 for k in (1, 2, 3, 4)], device))
    if r:
        result["mismatch"]["random-1.5b"] = r
    master = None                     # the 1.5B's memory back before the next model
    _free()
    r = section("smollm2", "smollm2", lambda: smollm2_check(SMOLLM2_SHRINK if plan.shapes else SMOLLM2, device, log))
    if r:
        result["smollm2"] = r
    result["computed_memory"] = {name: memory_model(c or json.loads(CONFIG.read_text()), 32768, True, 512, 1152)
                                 for name, c in MODELS.items()}
    result["wall_s"] = time.perf_counter() - start
    return result


@contextmanager
def training_engine(master, plan: CheckPlan, device: str, lr: float):
    """A TrainingEngine over `master` at `plan`'s sizes; on leaving, its compute copy and optimizer
    state dropped, the master's gradients cleared and the allocator's cache freed."""
    from runners.algos import get_loss
    from runners.presets import RunConfig
    from runners.train_engine import TrainingEngine

    cfg = RunConfig(prompts_per_step=plan.prompts, samples_per_prompt=plan.samples, updates_per_batch=plan.updates,
                    lr=lr, threads=None, max_tokens_per_microbatch=plan.microbatch_tokens,
                    gradient_checkpointing=plan.checkpointing)
    engine = None
    try:
        engine = TrainingEngine(master, plan.train_dtype, cfg, get_loss(plan.algo), plan.algo, device)
        yield engine
    finally:
        if engine is not None:
            engine.compute = engine.opt = None
        for p in master.parameters():
            p.grad = None
        _free()


def smollm2_check(plan: CheckPlan, device: str, log=print) -> dict:
    """The `smollm2` section: rollouts at bf16 and fp16, one training step and the same-format
    mismatch on a random model of SmolLM2-135M's shapes, at `plan`'s sizes."""
    master, config = random_model(plan, device, SMOLLM2_CONFIG)
    vocab = config["vocab_size"]
    out = {"model": {"config": str(SMOLLM2_CONFIG.relative_to(ROOT)), "overrides": plan.shapes,
                     "weights": "random (seed 0)", "params": sum(p.numel() for p in master.parameters()),
                     "params_formula": param_count(config)},
           "rollout": {d: rollout(master, d, plan, device, vocab) for d in ("bf16", "fp16")}}
    speeds = ", ".join(f"{d} {x['tokens_per_s']:,.0f} tokens/s" for d, x in out["rollout"].items())
    log(f"smollm2: rollouts {speeds}")
    with training_engine(master, plan, device, lr=1e-5) as engine:
        out["train_step"] = {str(n): train_step(engine, plan, n, device, vocab, config) for n in plan.train_lengths}
    out["mismatch"] = mismatch(master.eval(), IdTokenizer(), random_prompts(plan.mm_prompts, plan.prompt_tokens,
                                                                             vocab, 7),
                               plan.mm_samples, plan.mm_tokens, device)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:i")
    ap.add_argument("--shrink", action="store_true", help="small shapes and batches (seconds, any device)")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="wall-clock budget: a section that would not fit is skipped (and listed)")
    ap.add_argument("--train-dtype", default=None, help="training format of the step (default bf16)")
    ap.add_argument("--microbatch-tokens", type=int, default=None)
    ap.add_argument("--memory-table", action="store_true", help="print the computed memory table and exit")
    a = ap.parse_args(argv)
    if a.memory_table:
        print(memory_table())
        return 0
    from bench.device import DeviceError, resolve_device

    try:
        device = resolve_device(a.device)
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plan = SHRINK if a.shrink else FULL
    if a.train_dtype:
        plan = replace(plan, train_dtype=a.train_dtype)
    if a.microbatch_tokens:
        plan = replace(plan, microbatch_tokens=a.microbatch_tokens)
    if device == "cpu":
        torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    result = run_check(plan, device, a.budget_s, log)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, default=str))
    log(summary(result))
    log(f"wrote {a.out}")
    return 0


def summary(r: dict) -> str:
    lines = [f"gpu_check on {r['device']} ({r['environment'].get('device_name')}), {r['wall_s']:.0f} s"]
    for d, x in r["rollout"].items():
        lines.append(f"  rollout {d}: {x['tokens_per_s']:,.0f} tokens/s, peak {x['peak_memory_mb']:,.0f} MiB")
    for n, x in r["train_step"].items():
        lines.append(f"  train step ({n} response tokens): {x['seconds']:.1f} s, {x['tokens_per_s']:,.0f} tokens/s, "
                     f"peak {x['peak_memory_mb']:,.0f} MiB (computed {x['computed_peak_mb']:,.0f})")
    for m, pairs in r["mismatch"].items():
        for d, x in pairs.items():
            lines.append(f"  mismatch {m} {d}: mean|π−μ| {x['prob_abs_diff_mean']:.2e}, k3 {x['kl_k3']:.2e}, "
                         f"slope {x['log_ratio_slope']:.3g}/1K")
    sm = r.get("smollm2") or {}
    for d, x in sm.get("rollout", {}).items():
        lines.append(f"  smollm2 shapes, rollout {d}: {x['tokens_per_s']:,.0f} tokens/s, "
                     f"peak {x['peak_memory_mb']:,.0f} MiB")
    for n, x in sm.get("train_step", {}).items():
        lines.append(f"  smollm2 shapes, {x['train_dtype']} step ({n} response tokens): {x['seconds']:.2f} s, "
                     f"peak {x['peak_memory_mb']:,.0f} MiB (computed {x['computed_peak_mb']:,.0f})")
    for d, x in sm.get("mismatch", {}).items():
        lines.append(f"  smollm2 shapes, mismatch {d}: k3 {x['kl_k3']:.2e}")
    for k, v in {**r["skipped"], **{k: v for k, v in r["errors"].items() if not k.endswith("_traceback")}}.items():
        lines.append(f"  {k}: {v}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
