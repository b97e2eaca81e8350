"""The shared-prefix ("cascade") decode attention (bench/engines/cascade.py): the rows' slots by
hand, the arithmetic by hand and against the one-block FlashAttention arithmetic over the joined
keys, the cache's two parts, and the engine's samples against its plain decode."""

import math

import pytest
import torch

from bench.engines import Sampling
from bench.engines.cascade import (PromptRows, SharedPrefixCache, SharedPrefixLayer, _from_slots, _to_slots,
                                   cascade_attention, prompt_slots)
from bench.engines.kv_cache import drop_rows
from bench.engines.torch_engine import TorchEngine
from bench.kernels import flash_attention_arithmetic
from bench.models import TINY_MATH_DIR

from conftest import quick_sample


def test_prompt_slots_by_hand():
    rank, n_max = prompt_slots(torch.tensor([1, 0, 1, 1, 0]), 3)
    assert rank.tolist() == [0, 0, 1, 2, 1] and n_max == 3
    rows = PromptRows(torch.tensor([0, 0, 1, 1]), 2)
    assert rows.in_order and rows.n_max == 2
    rows.keep(torch.tensor([3, 0, 1]))              # row 2 finished; the last row took its place
    assert rows.prompt.tolist() == [1, 0, 0] and rows.rank.tolist() == [0, 0, 1] and not rows.in_order


@pytest.mark.parametrize("prompt", [[0, 0, 1, 1, 2, 2], [2, 0, 1, 0, 2]], ids=["in order", "scattered"])
def test_slots_hold_each_row_once_and_give_it_back(prompt):
    rows = PromptRows(torch.tensor(prompt), 3)
    x = torch.arange(len(prompt) * 2 * 3 * 4, dtype=torch.float32).reshape(len(prompt), 2, 3, 4) + 1
    slots = _to_slots(x, rows)
    assert slots.shape == (3, 2, rows.n_max * 3, 4)
    assert torch.equal(_from_slots(slots, rows, 3), x)
    assert slots.ne(0).sum() == x.numel()           # the empty slots are 0
    assert torch.equal(slots[2, 1, :3], x[prompt.index(2), 1])        # prompt 2's first row, KV head 1


def test_the_arithmetic_by_hand():
    """One prompt of two positions (the first left padding), two rows of one generated position,
    D = 1, scale 1: S = q·k, one max over the prompt's and the row's positions."""
    q = torch.tensor([1.0, 2.0]).reshape(2, 1, 1, 1)
    kp, vp = torch.tensor([9.0, 1.0]).reshape(1, 1, 2, 1), torch.tensor([100.0, 3.0]).reshape(1, 1, 2, 1)
    ks, vs = torch.tensor([0.0, 2.0]).reshape(2, 1, 1, 1), torch.tensor([5.0, 7.0]).reshape(2, 1, 1, 1)
    keep = torch.tensor([[False, True]])
    out = cascade_attention(q, kp, vp, keep, ks, vs, PromptRows(torch.tensor([0, 0]), 1), 1.0, torch.float32)
    # row 0: S = [−inf, 1, 0], m = 1: (e⁰·3 + e⁻¹·5) / (1 + e⁻¹);  row 1: S = [−inf, 2, 4], m = 4
    want0 = (3 + math.exp(-1) * 5) / (1 + math.exp(-1))
    want1 = (math.exp(-2) * 3 + 7) / (math.exp(-2) + 1)
    assert out.shape == (2, 1, 1, 1)
    assert out.flatten().tolist() == pytest.approx([want0, want1], rel=1e-6)


def _joined(q, kp, vp, keep, ks, vs, prompt, dtype):
    """flash_attention_arithmetic over each row's prompt keys and its own, joined (one block)."""
    rep = q.shape[1] // kp.shape[1]
    k = torch.cat([kp[prompt], ks], 2).repeat_interleave(rep, 1)
    v = torch.cat([vp[prompt], vs], 2).repeat_interleave(rep, 1)
    s = torch.matmul(q.float(), k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    mask = torch.cat([keep[prompt], torch.ones(len(prompt), ks.shape[2], dtype=torch.bool)], 1)
    s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    return flash_attention_arithmetic(s, v, dtype).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_two_blocks_are_the_one_block_arithmetic_up_to_the_order_of_sums(dtype):
    """GQA (6 query heads over 2 KV heads), rows of three prompts scattered, left padding: the
    cascade equals the one-block arithmetic over the joined keys to fp32's rounding, then the
    format's (a sum in another order may round the output to the next 16-bit number)."""
    torch.manual_seed(0)
    prompt = torch.tensor([0, 2, 1, 0, 2, 2, 1])
    p, hkv, w, t, d = 3, 2, 7, 5, 16
    keep = torch.ones(p, w, dtype=torch.bool)
    keep[1, :3], keep[2, :1] = False, False
    kp, vp = (torch.randn(p, hkv, w, d).to(dtype).float() for _ in range(2))
    ks, vs = (torch.randn(len(prompt), hkv, t, d).to(dtype).float() for _ in range(2))
    q = (torch.randn(len(prompt), 3 * hkv, 1, d) * 2).to(dtype)
    got = cascade_attention(q, kp, vp, keep, ks, vs, PromptRows(prompt, p), d ** -0.5, dtype)
    want = _joined(q, kp, vp, keep, ks, vs, prompt, dtype)
    assert got.dtype == dtype and got.shape == want.shape == (7, 1, 6, 16)
    ulp = {torch.float32: 1e-6, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}[dtype]
    assert ((got.float() - want.float()).abs() <= ulp * want.float().abs().clamp(min=1)).all()


def kv(b, t, fill):
    """[b, 1 head, t, 2] entries naming (row, position): fill + 10·row + position."""
    return (fill + torch.arange(b).reshape(b, 1, 1, 1) * 10.0 + torch.arange(t).reshape(1, 1, t, 1)).expand(
        b, 1, t, 2).clone()


def test_the_prompt_is_kept_once_and_the_rows_move_their_own_part():
    rows = PromptRows(torch.tensor([0, 0, 1, 1, 1]), 2)
    layer = SharedPrefixLayer(capacity=5, rows=rows)
    k, _ = layer.update(kv(2, 2, 0.0), kv(2, 2, 100.0))             # the prefill of two prompts
    assert k.shape == (2, 1, 2, 2) and layer.k_prefix.shape == (2, 1, 2, 2) and layer.get_seq_length() == 2
    k, v = layer.update(kv(5, 1, 50.0), kv(5, 1, 150.0))            # one token of each of the 5 rows
    assert k.shape == (5, 1, 1, 2) and layer.get_seq_length() == 3
    assert k[:, 0, 0, 0].tolist() == [50, 60, 70, 80, 90]
    layer.move_rows(torch.tensor([1]), torch.tensor([4]), 4)        # row 1 finished, row 4 takes its slot
    k, v = layer.update(kv(4, 1, 0.5), kv(4, 1, 0.5))
    assert k[:, 0, :, 0].tolist() == [[50, 0.5], [90, 10.5], [70, 20.5], [80, 30.5]]
    assert layer.k_prefix[:, 0, :, 0].tolist() == [[0, 1], [10, 11]]   # untouched
    with pytest.raises(RuntimeError, match="KV cache full: 6 positions asked of 5"):
        layer.update(kv(4, 2, 0.0), kv(4, 2, 0.0))


def test_dropping_rows_moves_their_prompts_once():
    cache = SharedPrefixCache(2, 6, torch.tensor([0, 0, 1, 1]), 2, torch.ones(2, 2))
    for i in range(2):
        cache.update(kv(2, 2, 0.0), kv(2, 2, 0.0), i)
        cache.update(kv(4, 1, 0.0), kv(4, 1, 0.0), i)
    order = drop_rows(cache, torch.tensor([False, True, True, True]))
    assert order.tolist() == [3, 1, 2]
    assert cache.shared.prompt.tolist() == [1, 0, 1] and cache.shared.rank.tolist() == [0, 0, 1]
    assert [layer.rows for layer in cache.layers] == [3, 3]


PROMPTS = [f"Q: Compute {a}+{b}.\nA: " for a, b in [(3, 4), (12, 30), (7, 8), (100, 23)]]


def _gqa_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=85, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        eos_token_id=1)).eval()


def _samples(fmt, cascade, gqa):
    from transformers import AutoTokenizer

    kw = {"model": _gqa_llama(), "tokenizer": AutoTokenizer.from_pretrained(str(TINY_MATH_DIR))} if gqa else {}
    eng = TorchEngine(str(TINY_MATH_DIR), fmt, cascade_attention=cascade, max_batch=7, threads=1, **kw)
    return eng, [s for row in eng.generate(PROMPTS, 4, Sampling(1.0, 1.0, 24, seed=5)) for s in row]


@pytest.mark.parametrize("cpu16", ["none", "all"])
@pytest.mark.parametrize("fmt", quick_sample(["fp32", "bf16", "fp16", "fp8", "nvfp4", "e8m6"], ["bf16"]))
@pytest.mark.parametrize("gqa", [False, True], ids=["tiny-math", "GQA Llama"])
def test_the_engine_samples_as_its_plain_decode_up_to_the_order_of_sums(fmt, cpu16, gqa, monkeypatch):
    """Four prompts × 4 samples in chunks of 7 rows (a prompt's rows across two chunks), rows
    finishing apart, in 16-bit, quantized (FP8, NVFP4: their 16-bit activations) and ladder-rung
    (e8m6) formats: the cascade's tokens are the plain decode's and μ within the rounding of the
    attention's output (fp32: 1e-5; a 16-bit output a rounding apart moves a logit by up to a
    16-bit step: measured 2026-12-06, mean 6e-4 at most; where torch's native 16-bit kernel
    is the plain path (`all`) the cascade's FlashAttention arithmetic differs from it beyond
    the order of sums, and a token may differ)."""
    monkeypatch.setenv("BENCH_CPU_16BIT", cpu16)
    _, plain = _samples(fmt, False, gqa)
    eng, cascade = _samples(fmt, True, gqa)
    assert eng.model.config._attn_implementation.startswith("bench_cascade")
    assert len({len(s.token_ids) for s in cascade}) > 1                     # rows finished apart
    same = [(a, b) for a, b in zip(plain, cascade) if a.token_ids == b.token_ids]
    assert len(same) >= (len(plain) if fmt == "fp32" or cpu16 == "none" else len(plain) - 2)
    d = torch.tensor([abs(x - y) for a, b in same for x, y in zip(a.logprobs, b.logprobs)])
    assert d.max() <= 1e-5 if fmt == "fp32" else d.mean() <= 2e-3


def test_the_prefill_and_other_forwards_keep_the_base_attention():
    """Outside a decode (the trainer's forwards of the same model type, a prefill) the registered
    implementation runs its base: logits equal to the plain model's bit for bit."""
    a = TorchEngine(str(TINY_MATH_DIR), "fp32", threads=1)
    b = TorchEngine(str(TINY_MATH_DIR), "fp32", threads=1, cascade_attention=True)
    ids = torch.tensor([a.tokenizer.encode(PROMPTS[0], add_special_tokens=False)])
    assert b.attention == "sdpa" and b.model.config._attn_implementation == "bench_cascade_sdpa"
    assert torch.equal(a.model(input_ids=ids).logits, b.model(input_ids=ids).logits)


def test_it_is_refused_where_it_cannot_decode():
    """A prepared (training) model, a model with sliding-window layers, an eager attention, no
    preallocated cache: each refused with its reason, never silently decoded without it."""
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    from bench.engines.cascade import request_refusal

    tok = AutoTokenizer.from_pretrained(str(TINY_MATH_DIR))
    windowed = MistralForCausalLM(MistralConfig(vocab_size=85, hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                                sliding_window=8))
    with pytest.raises(ValueError, match="rollout engine's"):
        TorchEngine("m", "fp32", model=windowed, tokenizer=tok, prepared=True, cascade_attention=True)
    with pytest.raises(ValueError, match="all full attention; this one has sliding-window"):
        TorchEngine("m", "fp32", model=windowed, tokenizer=tok, cascade_attention=True)
    eager = _gqa_llama()
    eager.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="this model runs 'eager'"):
        TorchEngine("m", "fp32", model=eager, tokenizer=tok, cascade_attention=True)
    with pytest.raises(ValueError, match="preallocated cache"):
        TorchEngine(str(TINY_MATH_DIR), "fp32", preallocated_cache=False, cascade_attention=True)
    assert request_refusal(str(TINY_MATH_DIR), "torch") is None
    assert "use --engine torch" in request_refusal(str(TINY_MATH_DIR), "vllm")


def test_one_token_prompts_and_no_shared_prefill():
    """A prompt of one token (its prefill has one query, the base attention's) and an engine that
    prefills every row (each row its own prompt): the plain decode's tokens."""
    plain = TorchEngine(str(TINY_MATH_DIR), "fp32", threads=1)
    ids = plain.tokenizer.encode("7", add_special_tokens=False)
    assert len(ids) == 1
    sp = Sampling(1.0, 1.0, 16, seed=2)
    cascade = TorchEngine(str(TINY_MATH_DIR), "fp32", threads=1, cascade_attention=True)
    for share in (True, False):
        plain.share_prompts = cascade.share_prompts = share
        a, b = plain.generate(["7", PROMPTS[1]], 3, sp), cascade.generate(["7", PROMPTS[1]], 3, sp)
        assert [[s.token_ids for s in r] for r in a] == [[s.token_ids for s in r] for r in b]


def test_a_reordered_cache_keeps_each_rows_prompt():
    cache = SharedPrefixCache(1, 6, torch.tensor([0, 0, 1, 1]), 2, torch.ones(2, 2))
    cache.update(kv(2, 2, 0.0), kv(2, 2, 0.0), 0)
    cache.update(kv(4, 1, 0.0), kv(4, 1, 0.0), 0)
    cache.reorder_cache(torch.tensor([3, 1]))
    assert cache.shared.prompt.tolist() == [1, 0] and cache.layers[0].rows == 2
    assert cache.layers[0].keys[:, 0, 0, 0].tolist() == [30, 10]


def test_bench_mismatch_records_the_cascade_and_pairs_it_apart(tmp_path):
    """`bench mismatch --cascade-attention`: the report's conditions and its store row say
    "cascade"; a plain report says None (leaderboard.summary pairs reports by these conditions)."""
    import json

    from sqlalchemy import select
    from typer.testing import CliRunner

    from bench.cli import app
    from bench.store import MismatchReport, open_store, session

    url = f"sqlite:///{tmp_path / 's.db'}"
    args = ["mismatch", "--model", "tiny-math", "--dtype", "bf16", "--limit", "2", "--n", "2", "--threads", "1",
            "--db", url, "--json"]
    for extra, want in (([], None), (["--cascade-attention"], "cascade")):
        r = CliRunner().invoke(app, [*args, *extra])
        assert r.exit_code == 0, r.output
        (report,) = json.loads(r.stdout)
        assert report["conditions"]["attention"] == want
    with session(open_store(url)) as s:
        assert [m.attention for m in s.scalars(select(MismatchReport).order_by(MismatchReport.id))] == [None, "cascade"]
