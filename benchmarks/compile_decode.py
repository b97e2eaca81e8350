"""`torch.compile` (inductor, `dynamic=True`) of the rollout engine's model on a whole rollout of the
built-in engine: tiny-math, 100 prompts × 8, ≤ 64 tokens (the shapes of `rollout_engine.py`), one
torch thread, against the same engine eager. Measured, not adopted: the decode's shapes are not
static (finished rows leave the batch, the attention mask grows by a column a token, the prefill
has its own width), and inductor fuses and reorders, so μ moves: a product path would be a
recorded knob through the equivalence protocol (docs/development.md).

    python benchmarks/compile_decode.py [--dtype fp32|bf16|fp16] [--problems 100] [--n 8] [--repeats 3]
        [--threads 1] [--part model|body|layers]

`--part model` compiles the whole causal LM's forward (body, head, the KV cache's writes),
`body` only the decoder stack, `layers` each decoder layer's MLP and its two norms (modules
whose width is fixed; their rows still change; the projections, rotary, attention, cache and
head stay eager). Prints the compile with the first rollout, the fastest of `--repeats`
rollouts each way after it (in turn), compiled time over eager time and the break-even, the
graphs dynamo compiled, its graph breaks with their most frequent reasons (a frame past dynamo's
recompile limit runs eager from then on, and dynamo warns), and how far the compiled rollout's
samples are from eager's: the
share of samples with the same tokens, and the largest |Δ μ| over the tokens both drew alike
(the sampler's uniforms are the same, so tokens part only where a logit moves across a
sampling boundary). The compile is cold (inductor's cache in a new folder) unless
TORCHINDUCTOR_CACHE_DIR is set."""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from bench.engines import Sampling, make_engine
from bench.kernels import cpu_kernel_path
from bench.models import PLAIN_TEMPLATE, resolve_model
from bench.provenance import cpu_summary
from bench.synthetic import synthetic_examples


def sample_distance(eager: list, compiled: list) -> tuple[float, float]:
    """(share of samples whose tokens are the same, largest |Δ μ| over the tokens both drew
    alike): per sample, the log-probabilities of the common prefix of the two token lists."""
    same = total = 0
    worst = 0.0
    for re_, rc in zip(eager, compiled, strict=True):
        for se, sc in zip(re_, rc, strict=True):
            total += 1
            same += se.token_ids == sc.token_ids
            for te, tc, le, lc in zip(se.token_ids, sc.token_ids, se.logprobs, sc.logprobs):
                if te != tc:                     # past here the two samples condition on other text
                    break
                worst = max(worst, abs(le - lc))
    return same / max(total, 1), worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"), help="the rollout format")
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--part", choices=("model", "body", "layers"), default="model",
                    help="compile the causal LM's whole forward, its decoder stack, or each layer's MLP and norms")
    a = ap.parse_args()
    # a cold compile, as a run's first process has it: inductor's on-disk cache in a new folder
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-"))
    torch.set_num_threads(a.threads)
    ref = resolve_model("tiny-math")
    prompts = [PLAIN_TEMPLATE.format(problem=r["problem"]) for r in synthetic_examples("test", a.problems)]
    sp = Sampling(max_tokens=64, seed=0)
    engine = make_engine("torch", ref.path, a.dtype)
    engine.generate(prompts[:4], 2, sp)                                  # warm-up, eager

    from torch._dynamo.utils import counters

    modules = {"model": [engine.model], "body": [engine.model.base_model],
               "layers": [m for layer in engine.model.base_model.layers
                          for m in (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm)]}[a.part]
    eager_forwards = [m.forward for m in modules]
    compiled_forwards = [torch.compile(f, dynamic=True) for f in eager_forwards]

    def use(forwards) -> None:
        for m, f in zip(modules, forwards):
            m.forward = f

    def rollout() -> tuple[float, list]:
        t0 = time.perf_counter()
        out = engine.generate(prompts, a.n, sp)
        return time.perf_counter() - t0, out

    use(compiled_forwards)
    first = rollout()                                                    # the compile, and one rollout
    eager, compiled = [], []
    for _ in range(a.repeats):                                           # in turn: the host's drift falls on both
        use(eager_forwards)
        eager.append(rollout())
        use(compiled_forwards)
        compiled.append(rollout())
    e, c = min(x[0] for x in eager), min(x[0] for x in compiled)
    same, dmu = sample_distance(eager[-1][1], compiled[-1][1])
    tokens = sum(len(s.token_ids) for r in eager[-1][1] for s in r)
    even = f"break-even after {(first[0] - c) / (e - c):.0f} rollouts" if c < e else "never breaks even"
    breaks = sum(counters["graph_break"].values())
    reasons = "; ".join(f"{n}× {r[:80]}" for r, n in counters["graph_break"].most_common(3))
    print(f"a rollout of tiny-math, {a.problems} prompts × {a.n}, ≤ {sp.max_tokens} tokens ({tokens} drawn), "
          f"{a.dtype}, compiled: {a.part} ({len(modules)} forward(s)), {a.threads} thread(s), "
          f"torch {torch.__version__}; "
          f"{cpu_summary()}; 16-bit kernels: {cpu_kernel_path()}")
    print(f"  eager {e:.3f} s; compiled (inductor, dynamic) {c:.3f} s: {c / e:.2f}× eager's time; compile + first "
          f"rollout {first[0]:.1f} s ({even}); graphs compiled {counters['stats']['unique_graphs']}, graph breaks "
          f"{breaks}{': ' + reasons if reasons else ''}")
    print(f"  compiled against eager: samples with the same tokens {same:.1%}, max |Δ μ| over tokens drawn alike "
          f"{dmu:.2e}")
    engine.close()


if __name__ == "__main__":
    main()
