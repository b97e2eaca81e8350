"""Mismatch baselines on tiny-math after the RoPE fix, against the old cast in one run.

The old cast (`model.to(dtype)`) rounded RoPE's inv_freq buffers to 16 bits in both engines;
bench now casts parameters only (buffers stay fp32, as FSDP and vLLM keep them). Same prompts,
samples and engines; prints mean |π−μ|, k3, signed max/min π−μ and the log-ratio slope per
dtype, and the ratio after/before.

    python benchmarks/mismatch_rope.py [--problems 64] [--n 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy

import torch

from bench.engines import Sampling
from bench.engines.torch_engine import TorchEngine
from bench.mismatch import mismatch_metrics
from bench.models import load_model, load_tokenizer, render_prompt, resolve_model
from bench.model_formats import prepare_compute_model
from bench.precision import torch_dtype
from bench.synthetic import synthetic_examples
from runners.logprobs import pack, response_logprobs


def measure(master, tok, prompts, n, dtype, legacy: bool) -> dict:
    ref = resolve_model("tiny-math")
    engine = TorchEngine(ref.path, dtype, model=copy.deepcopy(master), tokenizer=tok)
    compute = master if dtype == "fp32" else prepare_compute_model(copy.deepcopy(master), dtype)
    if legacy:                                    # the old cast: buffers rounded to 16 bits too
        engine.model.to(torch_dtype(dtype))
        compute.to(torch_dtype(dtype))
    flat = [s for row in engine.generate(prompts, n, Sampling(1.0, 1.0, 64, seed=1)) for s in row]
    pids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    ids, attn, tk, pos, mask = pack([pids[i] for i in range(len(prompts)) for _ in range(n)],
                                    [s.token_ids for s in flat], tok.pad_token_id)
    with torch.no_grad():
        pi = response_logprobs(compute, ids, attn, tk, pos) * mask
    mu = torch.zeros_like(mask)
    for i, s in enumerate(flat):
        mu[i, :len(s.logprobs)] = torch.tensor(s.logprobs)
    return mismatch_metrics(mu, pi, mask)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ref = resolve_model("tiny-math")
    tok, master = load_tokenizer(ref), load_model(ref, torch.float32)
    prompts = [render_prompt(ref, tok, r["problem"]) for r in synthetic_examples("test", a.problems, seed=5)]
    keys = ("prob_abs_diff_mean", "kl_k3", "prob_diff_max", "prob_diff_min", "log_ratio_slope")
    print(f"{'dtype':5s} {'cast':7s} " + " ".join(f"{k:>18s}" for k in keys))
    for dtype in ("fp16", "bf16"):
        before = measure(master, tok, prompts, a.n, dtype, legacy=True)
        after = measure(master, tok, prompts, a.n, dtype, legacy=False)
        for name, m in (("before", before), ("after", after)):
            print(f"{dtype:5s} {name:7s} " + " ".join(f"{m[k]:18.3e}" for k in keys))
        print(f"{dtype:5s} {'ratio':7s} " + " ".join(f"{after[k] / before[k]:18.2f}" if before[k] else f"{'-':>18s}"
                                                     for k in keys))


if __name__ == "__main__":
    main()
