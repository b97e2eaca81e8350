"""The precision ladder (bench/ladder.py): round_float against torch's own casts; e8m7 is bf16 and
e5m10 is fp16 bit for bit through the rollout engine on the emulated path (tiny-math's sampling,
a Llama's and a Gemma 3's prefill and decode); a low rung leaves every carrier tensor of the
forward on its grid; weight syncs land on the grid; the rungs are rollout-only and off vLLM;
the mismatch grows along the ladder."""

from __future__ import annotations

import copy

import pytest
import torch

from bench import formats, ladder
from bench.errors import PrecisionError
from bench.grids import float_max, round_float
from bench.precision import LADDER_PAIRS, Precision, parse_list

INT = {torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.float().view(torch.int32)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns, NaN equal to NaN."""
    return bool(((_bits(a) == _bits(b)) | (a.isnan() & b.isnan())).all())


def _ties(mantissa_bits: int, n: int = 4096) -> torch.Tensor:
    """fp32 values exactly halfway between two neighbours of a grid with `mantissa_bits` (normal
    binades of both parities), and one ulp either side of each."""
    g = torch.Generator().manual_seed(0)
    drop = 23 - mantissa_bits
    base = torch.randint(0x3F000000, 0x47000000, (n,), generator=g, dtype=torch.int32)
    tie = (base >> drop << drop) | (1 << (drop - 1))
    return torch.cat([tie, tie + 1, tie - 1]).view(torch.float32)


@pytest.mark.parametrize("dtype,grid", [(torch.bfloat16, (7, -126, 127)), (torch.float16, (10, -14, 15))], ids=str)
def test_round_float_is_the_cast_to_each_16_bit_format(dtype, grid):
    """Random values over every binade the format has (subnormals, overflow), exact ties of both
    parities and their neighbours, ±0, ±inf and NaN: the same bits as `.to(dtype)`."""
    g = torch.Generator().manual_seed(1)
    parts = [torch.randn(20000, generator=g) * 10.0 ** e for e in range(-44, 39, 3)]
    edge = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), float_max(*grid[::2]), 65519.99, 65520.0,
            -65520.0, 3.3895e38, 3.39e38, 2.0 ** -149, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26]
    x = torch.cat([*parts, _ties(grid[0]), torch.tensor(edge)])
    assert _same_bits(round_float(x, *grid), x.to(dtype).float())


def test_a_rung_rounds_half_to_even_onto_its_own_grid():
    """Hand values on e8m2's grid (1, 1.25, 1.5, 1.75, 2, 2.5, …): ties go to the even mantissa;
    subnormals keep the smallest binade's step (2^−128: 1.3 · 2^−127 is 2.6 steps → 3); the largest
    finite value and overflow."""
    r = ladder.Rung(8, 2)
    x = torch.tensor([1.125, 1.375, 1.625, 1.875, 2.25, 1.126, -1.375, 2.0 ** -127 * 1.3, 7.0 * 2.0 ** 125,
                      1.875 * 2.0 ** 127])
    want = torch.tensor([1.0, 1.5, 1.5, 2.0, 2.0, 1.25, -1.5, 1.5 * 2.0 ** -127, 7.0 * 2.0 ** 125, float("inf")])
    assert torch.equal(r.round(x), want)
    assert float_max(2, 127) == 1.75 * 2.0 ** 127
    assert r.unit_roundoff == 0.125


def test_rungs_are_named_rollout_only_and_refused_where_they_cannot_run():
    assert [f for f in formats.LADDER] == ["fp32", "e5m10", "e5m9", "e5m8", "e8m7", "e8m6", "e8m5", "e8m4",
                                            "e8m3", "e8m2", "e8m1"]
    assert ladder.parse("E8M3") == ladder.Rung(8, 3) and ladder.parse("fp16") is None
    with pytest.raises(ValueError, match="no rung e8m8"):
        ladder.Rung(8, 8)
    assert all(not formats.get(r).in_all and not formats.get(r).train for r in formats.LADDER[1:])
    with pytest.raises(PrecisionError, match="rollout-only format .*write rollout=e8m3,train=X"):
        Precision.parse("e8m3")
    assert [p.spec for p in parse_list("ladder")] == ["fp32"] + [f"rollout={r},train=fp32" for r in formats.LADDER[1:]]
    assert LADDER_PAIRS[4].name == "e8m7→fp32"
    with pytest.raises(PrecisionError, match="ladder rung"):
        formats.canonical("e8m9")
    assert "--engine torch" in formats.get("e8m3").vllm_refusal


# ------------------------------------------------------------------ the rungs through the rollout engine

def _engines_sample_alike(model, tok, a: str, b: str, monkeypatch) -> bool:
    from bench.engines import Sampling
    from bench.engines.torch_engine import TorchEngine

    monkeypatch.setenv("BENCH_CPU_16BIT", "none")
    prompts = ["What is 3 + 4?", "Compute 12 * 3 - 5.", "What is 7 - 9?"]
    sp = Sampling(temperature=1.0, top_p=1.0, max_tokens=24, seed=3)
    out = []
    for d in (a, b):
        e = TorchEngine("x", d, model=copy.deepcopy(model), tokenizer=tok)
        e.update_weights((n, p.detach() + 1e-3) for n, p in model.named_parameters())     # a sync, then sample
        out.append([(s.token_ids, s.logprobs) for row in e.generate(prompts, 4, sp) for s in row])
    return out[0] == out[1]


@pytest.fixture(scope="module")
def tiny_math():
    from transformers import AutoModelForCausalLM

    from bench.models import load_tokenizer, resolve_model

    ref = resolve_model("tiny-math")
    return AutoModelForCausalLM.from_pretrained(ref.path, dtype=torch.float32), load_tokenizer(ref)


@pytest.mark.parametrize("rung,carrier", [("e8m7", "bf16"), ("e5m10", "fp16")])
def test_the_carriers_own_rung_samples_as_the_carrier_bit_for_bit(tiny_math, rung, carrier, monkeypatch):
    """tiny-math through the built-in engine (prefill, KV-cache decode, split-K GEMMs, fused
    SiluAndMul, upcast attention) after a weight sync: the same tokens and the same μ to the bit."""
    assert _engines_sample_alike(*tiny_math, carrier, rung, monkeypatch)


def test_a_lower_rung_samples_otherwise(tiny_math, monkeypatch):
    assert not _engines_sample_alike(*tiny_math, "bf16", "e8m3", monkeypatch)


def _prepared(model, fmt: str):
    from bench.model_formats import RolloutWeights, apply_rollout_kernels

    m = RolloutWeights(copy.deepcopy(model), formats.get(fmt)).model.eval()
    apply_rollout_kernels(m, formats.get(fmt), "cpu")
    return m


def _prefill_and_decode(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """The logits of a prefill of ids[:, :-2] and of two decoded tokens through a KV cache."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        out = [model(input_ids=ids[:, :-2], past_key_values=cache, use_cache=True).logits]
        for step in (ids[:, -2:-1], ids[:, -1:]):
            out.append(model(input_ids=step, past_key_values=cache, use_cache=True).logits)
    return out


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("rung,carrier", [("e8m7", "bf16"), ("e5m10", "fp16")])
def test_each_architecture_computes_the_carriers_rung_as_the_carrier(arch, rung, carrier, monkeypatch):
    """A Llama (GQA, tied head) and a Gemma 3 (sliding window, q/k norms, embedding scale): the
    rollout engine's model in the carrier's rung gives the carrier's logits bit for bit, prefill
    and decode; two bits fewer does not."""
    from gguf_files import tiny_gemma3, tiny_llama

    monkeypatch.setenv("BENCH_CPU_16BIT", "none")
    model = tiny_llama(seed=1) if arch == "llama" else tiny_gemma3(seed=1)
    ids = torch.randint(3, model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    want = _prefill_and_decode(_prepared(model, carrier), ids)
    got = _prefill_and_decode(_prepared(model, rung), ids)
    assert all(_same_bits(a, b) for a, b in zip(want, got))
    lower = ladder.Rung(int(rung[1]), int(rung[3:]) - 2).name
    assert not all(_same_bits(a, b) for a, b in zip(want, _prefill_and_decode(_prepared(model, lower), ids)))


def _on_grid(t: torch.Tensor, rung: ladder.Rung) -> bool:
    return _same_bits(rung.round(t.float()), t.float())


def test_a_low_rung_leaves_every_tensor_of_the_forward_on_its_grid(tiny_math, monkeypatch):
    """e8m3: every carrier output of every module (embeddings, norms, projections, attention,
    the MLP, the logits) and every parameter after a sync lies on e8m3's grid — no bf16 floor."""
    from bench.engines.torch_engine import TorchEngine

    monkeypatch.setenv("BENCH_CPU_16BIT", "none")
    model, tok = tiny_math
    rung = ladder.Rung(8, 3)
    e = TorchEngine("x", "e8m3", model=copy.deepcopy(model), tokenizer=tok)
    e.update_weights((n, p.detach() * 1.01) for n, p in model.named_parameters())
    seen: list[tuple[str, bool]] = []

    def hook(mod, args, out):
        for t in (out if isinstance(out, tuple) else (out,)):
            if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16:
                seen.append((type(mod).__name__, _on_grid(t, rung)))

    handles = [m.register_forward_hook(hook) for m in e.model.modules()]
    ids = torch.randint(3, 80, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = e.model(input_ids=ids).logits
    for h in handles:
        h.remove()
    assert logits.dtype == torch.bfloat16 and _on_grid(logits, rung)
    assert len(seen) > 20 and all(ok for _, ok in seen), [name for name, ok in seen if not ok]
    params = [p for p in e.model.parameters() if p.dtype == torch.bfloat16]
    assert params and all(_on_grid(p.detach(), rung) for p in params)


@pytest.mark.slow
def test_the_mismatch_grows_down_the_ladder(tiny_math, monkeypatch):
    """Offline on tiny-math (the same prompts, 8 × 4 responses a rung, fp32 scoring): mean |π − μ|
    per token rises at every rung from fp32 to e8m1 (k3 is carried by a few tokens and may dip
    between neighbours; the mean is the monotone measure)."""
    from bench.engines import Sampling
    from bench.engines.torch_engine import TorchEngine
    from bench.mismatch import prob_diff_stats
    from runners.logprobs import pack, response_logprobs

    monkeypatch.setenv("BENCH_CPU_16BIT", "none")
    model, tok = tiny_math
    prompts = [f"What is {a} + {b}?" for a, b in ((3, 4), (12, 30), (7, 9), (25, 17), (8, 8), (40, 2), (6, 19), (5, 5))]
    sp = Sampling(temperature=1.0, top_p=1.0, max_tokens=32, seed=0)
    pids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    means = []
    for fmt in formats.LADDER:
        rows = TorchEngine("x", fmt, model=copy.deepcopy(model), tokenizer=tok).generate(prompts, 4, sp)
        flat = [(pids[i], s) for i, row in enumerate(rows) for s in row]
        ids, attn, tk, pos, m = pack([p for p, _ in flat], [s.token_ids for _, s in flat], tok.pad_token_id)
        with torch.no_grad():
            pi = response_logprobs(model, ids, attn, tk, pos)
        mu = torch.zeros_like(pi)
        for k, (_, s) in enumerate(flat):
            mu[k, :len(s.logprobs)] = torch.tensor(s.logprobs)
        means.append(prob_diff_stats(mu, pi, m)["prob_abs_diff_mean"])
    assert all(a < b for a, b in zip(means, means[1:])), dict(zip(formats.LADDER, means))


def test_ops_that_write_into_a_carrier_tensor_write_the_rounded_result():
    """In place (mul_, add_ of an fp32 tensor), copy_ from fp32 and a slice assignment: each carrier
    tensor they write holds e8m3 values, the single rounding of the fp32 result; views pass through
    (the slice assignment lands in the original)."""
    r = ladder.Rung(8, 3)
    g = torch.Generator().manual_seed(0)
    x0 = r.round(torch.randn(1000, generator=g)).to(torch.bfloat16)
    y = torch.randn(1000, generator=g)
    x, z = x0.clone(), x0.clone()
    w = torch.empty(1000, dtype=torch.bfloat16)
    v = torch.zeros(10, dtype=torch.bfloat16)
    with ladder.RoundingMode(r):
        x.mul_(1.1)
        z.add_(y)
        w.copy_(y)
        v[2:5] = torch.tensor([1.1, 2.2, 3.3])
    assert torch.equal(x.float(), r.round(x0.float() * 1.1))
    assert torch.equal(z.float(), r.round(x0.float() + y))
    assert torch.equal(w.float(), r.round(y))
    assert v.float().tolist()[:6] == [0.0, 0.0, 1.125, 2.25, 3.25, 0.0]
