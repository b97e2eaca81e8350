"""Does a token's cost depend on the cache copy? The built-in engine's preallocated KV cache
(bench/engines/kv_cache.py) against transformers' DynamicCache (a torch.cat of the whole cache
per token), on a random Llama of longer context: per-token decode time at 48 and at 1,024 new
tokens, and their ratio (1 = flat; a growing copy makes the long run's tokens dearer). Both
caches give the same samples bit for bit (checked here on the short run).

Attention itself grows with the context (each token reads t keys), so neither ratio is 1; the
copy is the part a preallocated cache removes.

    python benchmarks/kv_cache.py [--batch 16] [--hidden 256] [--layers 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch


def random_model(path: str, hidden: int, layers: int, context: int, vocab_from: str) -> None:
    """A random-weight Llama with tiny-math's tokenizer, saved at `path`."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(vocab_from)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * hidden,
                      num_hidden_layers=layers, num_attention_heads=hidden // 32, num_key_value_heads=hidden // 32,
                      max_position_embeddings=context, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)


def per_token(engine, prompts, new_tokens: int) -> tuple[float, list]:
    from bench.engines import Sampling

    engine.eos = -1                       # no row stops early: every run decodes exactly `new_tokens`
    t = time.perf_counter()
    out = engine.generate(prompts, 1, Sampling(1.0, 1.0, new_tokens, seed=1))
    return (time.perf_counter() - t) / new_tokens, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--short", type=int, default=48)
    ap.add_argument("--long", type=int, default=1024)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from bench.engines.torch_engine import TorchEngine
    from bench.models import TINY_MATH_DIR
    from bench.provenance import cpu_summary

    print(f"{cpu_summary()}; torch {torch.__version__}; {args.threads} thread(s); "
          f"random Llama hidden {args.hidden}, {args.layers} layers, batch {args.batch}")
    prompts = [f"Q: Compute {i}+{2 * i}.\nA: " for i in range(args.batch)]
    with tempfile.TemporaryDirectory() as d:
        random_model(d, args.hidden, args.layers, 64 + args.long, str(TINY_MATH_DIR))
        rows = {}
        for name, pre in (("DynamicCache (torch.cat)", False), ("preallocated", True)):
            eng = TorchEngine(d, "fp32", preallocated_cache=pre)
            per_token(eng, prompts, 8)                                                     # warm-up
            short, out_s = per_token(eng, prompts, args.short)
            long, _ = per_token(eng, prompts, args.long)
            rows[name] = (short, long, out_s)
    (a_s, a_l, a_out), (b_s, b_l, b_out) = rows.values()
    same = all(x.token_ids == y.token_ids and x.logprobs == y.logprobs
               for ra, rb in zip(a_out, b_out) for x, y in zip(ra, rb))
    print(f"{'cache':<26} {'ms/token @' + str(args.short):>14} {'ms/token @' + str(args.long):>15} {'long/short':>11}")
    for name, (s, l, _) in rows.items():
        print(f"{name:<26} {1e3 * s:14.2f} {1e3 * l:15.2f} {l / s:11.2f}")
    print(f"preallocated vs DynamicCache at {args.long} tokens: {a_l / b_l:.2f}× faster; "
          f"samples identical: {same}")


if __name__ == "__main__":
    main()
