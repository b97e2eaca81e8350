"""The built-in engine's preallocated KV cache (bench/engines/kv_cache.py): writes in place,
reads the filled prefix, compacts kept rows, and samples exactly as transformers' DynamicCache."""

import pytest
import torch

from bench.engines import Sampling
from bench.engines.kv_cache import BufferPool, PreallocatedLayer, drop_rows, fill_from_end, preallocated_cache
from bench.engines.torch_engine import TorchEngine, shared_prompts
from bench.models import TINY_MATH_DIR


def kv(b, t, fill):
    """[b, 1 head, t, 2] keys whose entries name (row, position): fill + 10·row + position."""
    rows = torch.arange(b).reshape(b, 1, 1, 1) * 10.0
    pos = torch.arange(t).reshape(1, 1, t, 1).float()
    return (fill + rows + pos).expand(b, 1, t, 2).clone()


def test_update_writes_in_place_and_returns_the_filled_prefix():
    layer = PreallocatedLayer(capacity=5)
    k, v = layer.update(kv(3, 2, 0.0), kv(3, 2, 100.0))
    assert k.shape == (3, 1, 2, 2) and layer.get_seq_length() == 2
    buffer = layer._k
    k, v = layer.update(kv(3, 1, 2.0), kv(3, 1, 102.0))          # position 2 of each row
    assert layer._k is buffer                                     # no new buffer, no copy of the old part
    assert k.shape == (3, 1, 3, 2) and k[:, 0, :, 0].tolist() == [[0, 1, 2], [10, 11, 12], [20, 21, 22]]
    assert v[:, 0, :, 0].tolist() == [[100, 101, 102], [110, 111, 112], [120, 121, 122]]


def test_reorder_keeps_the_chosen_rows_in_order():
    layer = PreallocatedLayer(capacity=4)
    layer.update(kv(3, 2, 0.0), kv(3, 2, 100.0))
    layer.reorder_cache(torch.tensor([2, 0]))                     # row 1 finished; keep 2 then 0
    k, v = layer.update(kv(2, 1, 2.0), kv(2, 1, 102.0))
    assert k[:, 0, :, 0].tolist() == [[20, 21, 2], [0, 1, 12]]
    assert v[:, 0, :2, 0].tolist() == [[120, 121], [100, 101]]


def test_a_prefill_of_distinct_prompts_is_stored_once_per_row():
    layer = PreallocatedLayer(capacity=4, repeat=torch.tensor([0, 0, 1, 1, 1]))
    k, v = layer.update(kv(2, 2, 0.0), kv(2, 2, 100.0))            # two prompts prefilled once
    assert k.shape == (2, 1, 2, 2)                                  # the prefill attends over its own rows
    assert layer._k.shape[0] == 5 and layer.get_seq_length() == 2
    k, v = layer.update(kv(5, 1, 2.0), kv(5, 1, 102.0))             # 2 and 3 samples of them
    assert k[:, 0, :, 0].tolist() == [[0, 1, 2], [0, 1, 12], [10, 11, 22], [10, 11, 32], [10, 11, 42]]
    assert v[:, 0, :2, 0].tolist() == [[100, 101], [100, 101], [110, 111], [110, 111], [110, 111]]


def test_fill_from_end_by_hand():
    order, dst, src = fill_from_end(torch.tensor([True, False, True, False, True, True]))
    assert order.tolist() == [0, 4, 2, 5] and dst.tolist() == [1, 3] and src.tolist() == [4, 5]
    order, dst, src = fill_from_end(torch.tensor([True, True, False]))     # the last row: nothing moves
    assert order.tolist() == [0, 1] and dst.tolist() == [] and src.tolist() == []
    assert fill_from_end(torch.tensor([False, False, True]))[0].tolist() == [2]


@pytest.mark.parametrize("preallocated", [True, False])
def test_drop_rows_moves_the_tail_into_the_holes(preallocated):
    from transformers import DynamicCache
    from transformers.cache_utils import Cache

    cache = Cache(layers=[PreallocatedLayer(capacity=4)]) if preallocated else DynamicCache()
    cache.update(kv(4, 2, 0.0), kv(4, 2, 100.0), 0)
    order = drop_rows(cache, torch.tensor([False, True, True, True]))       # row 0 finished: row 3 takes its slot
    assert order.tolist() == [3, 1, 2]
    k, v = cache.update(kv(3, 1, 2.0), kv(3, 1, 102.0), 0)
    assert k[:, 0, :, 0].tolist() == [[30, 31, 2], [10, 11, 12], [20, 21, 22]]
    assert v[:, 0, :2, 0].tolist() == [[130, 131], [110, 111], [120, 121]]


def test_shared_prompts_by_hand():
    uniq, src = shared_prompts([[5, 6], [5, 6], [7], [5, 6], [7]])
    assert uniq == [[5, 6], [7]] and src == [0, 0, 1, 0, 1]


@torch.no_grad()
def _prefill_keeps_its_bits(eng, prompts, n: int) -> bool:
    """Whether the engine's model gives a prompt's prefill the same logits alone as among n
    copies of it (the GEMM rows of a shared prefill against a prefill per row). True on the AMD
    EPYCs measured; an Intel AMX Xeon's fp32 GEMM rounds a row by the row count."""
    for p in prompts:
        ids = torch.tensor([eng.tokenizer.encode(p, add_special_tokens=False)])
        if not torch.equal(eng.model(input_ids=ids).logits[0], eng.model(input_ids=ids.repeat(n, 1)).logits[0]):
            return False
    return True


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16", "fp8", "nvfp4"])
@pytest.mark.parametrize("prompts", [[f"Q: Compute {a}+{b}.\nA: " for a, b in [(3, 4), (12, 30), (7, 8), (100, 23)]],
                                     ["Q: 7+8=?\nA: "]], ids=["4 prompts", "1 prompt"])
@pytest.mark.slow
def test_a_prompt_prefilled_once_samples_as_one_prefilled_per_row(fmt, prompts):
    """Shared prefill (a prompt's keys and values copied to its n rows, the head over every row)
    against one prefill per row: token ids and μ identical, over a batch cut into chunks across a
    prompt's rows, and for one prompt sampled n times (a one-row head GEMM rounds otherwise).
    The shared prefill runs a prompt's tokens as rows of a GEMM n times shorter: where this CPU's
    GEMM rounds a row by the row count (`_prefill_keeps_its_bits`), μ moves in its last bits
    (relative 1e-5 at most; 2e-6 seen at fp32) and the tokens stay the same."""
    out = {}
    for share in (False, True):
        eng = TorchEngine(str(TINY_MATH_DIR), fmt, share_prompts=share, max_batch=12, threads=1)
        out[share] = [s for row in eng.generate(prompts, 5, Sampling(1.0, 1.0, 24, seed=7)) for s in row]
    assert [s.token_ids for s in out[True]] == [s.token_ids for s in out[False]]
    if not _prefill_keeps_its_bits(eng, prompts, 5):
        got = torch.tensor([x for s in out[True] for x in s.logprobs])
        want = torch.tensor([x for s in out[False] for x in s.logprobs])
        assert ((got - want).abs() <= 1e-5 * want.abs().clamp(min=1.0)).all()
        return
    assert [s.logprobs for s in out[True]] == [s.logprobs for s in out[False]]


def test_a_full_cache_says_so():
    layer = PreallocatedLayer(capacity=2)
    layer.update(kv(1, 2, 0.0), kv(1, 2, 0.0))
    with pytest.raises(RuntimeError, match="KV cache full: 3 positions asked of 2"):
        layer.update(kv(1, 1, 0.0), kv(1, 1, 0.0))


def test_sliding_window_models_keep_transformers_cache():
    from transformers import DynamicCache, MistralConfig, MistralForCausalLM

    m = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, sliding_window=8))
    assert type(preallocated_cache(m, 16)) is DynamicCache
    m.config.sliding_window = None
    assert [type(x) for x in preallocated_cache(m, 16).layers] == [PreallocatedLayer] * 2


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16", "nvfp4"])
def test_samples_are_those_of_dynamic_cache_bit_for_bit(fmt):
    """The same prompts and seeds: token ids and μ identical, with rows finishing at different
    steps (the compaction path)."""
    prompts = [f"Q: Compute {a}+{b}.\nA: " for a, b in [(3, 4), (12, 30), (7, 8), (100, 23)]]
    out = {}
    for pre in (False, True):
        eng = TorchEngine(str(TINY_MATH_DIR), fmt, preallocated_cache=pre)
        out[pre] = [s for row in eng.generate(prompts, 4, Sampling(1.0, 1.0, 24, seed=5)) for s in row]
    assert len({len(s.token_ids) for s in out[True]}) > 1                      # rows finished apart
    assert [s.token_ids for s in out[True]] == [s.token_ids for s in out[False]]
    assert [s.logprobs for s in out[True]] == [s.logprobs for s in out[False]]


def test_the_pool_hands_one_buffer_per_key_and_grows_it():
    pool, cpu = BufferPool(), torch.device("cpu")
    with pool.lease() as held:
        assert held is pool
        a = pool.take(("k", 0), (2, 3, 4), torch.float32, cpu)                   # 24 asked: 30 made
        b = pool.take(("k", 0), (3, 2, 5), torch.float32, cpu)                   # 30 fit: the same memory
        assert b.data_ptr() == a.data_ptr() and b.shape == (3, 2, 5) and b.is_contiguous()
        assert pool.take(("v", 0), (2, 3, 4), torch.float32, cpu).data_ptr() != a.data_ptr()
        assert pool.take(("k", 0), (2, 3, 4), torch.bfloat16, cpu).dtype == torch.bfloat16
        c = pool.take(("k", 0), (5, 7), torch.float32, cpu)                      # 35: a new buffer of 43
        assert c.shape == (5, 7) and c.is_contiguous()
        with pool.lease() as second:                                             # one batch at a time
            assert second is None
    assert pool.nbytes == (43 + 30) * 4 + 30 * 2
    with pool.lease() as again:
        assert again is pool
    with pytest.raises(AssertionError, match="outside a lease"):
        pool.take("k", (1,), torch.float32, cpu)
    small = BufferPool(keep_bytes=100)
    with small.lease() as held:
        held.take("k", (30,), torch.float32, cpu)
    assert small.nbytes == 0                   # over keep_bytes: freed with the lease
    with pytest.raises(ValueError, match="needs its index"):
        PreallocatedLayer(8, pool=pool)


@pytest.mark.slow
@pytest.mark.parametrize("cpu16", ["none", "all"])
@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
def test_pooled_buffers_sample_as_fresh_ones(fmt, cpu16, monkeypatch):
    """Batches of growing and shrinking size through one engine's pool (its buffers reused and
    grown, NaN left in them from before each batch, so a read of a position no batch wrote would
    show) sample what an engine without the pool does; bf16 on both CPU paths (emulated: the
    cache stores fp32)."""
    monkeypatch.setenv("BENCH_CPU_16BIT", cpu16)
    sp = Sampling(1.0, 1.0, 24, seed=3)
    batches = [[f"Q: Compute {a}+{b}.\nA: " for a, b in [(3, 4), (12, 30)]],
               [f"Q: Compute {a}*{b}+{c}.\nA: " for a, b, c in [(3, 4, 5), (12, 30, 7), (1, 2, 3)]],
               ["Q: 7+8=?\nA: "]]
    pooled = TorchEngine(str(TINY_MATH_DIR), fmt, max_batch=8, threads=1)
    fresh = TorchEngine(str(TINY_MATH_DIR), fmt, max_batch=8, threads=1)
    fresh._cache_pool = None
    assert pooled._cache_pool is not None
    for prompts in batches:
        for buf in pooled._cache_pool._bufs.values():
            buf.fill_(float("nan"))
        a, b = pooled.generate(prompts, 4, sp), fresh.generate(prompts, 4, sp)
        assert [[s.token_ids for s in r] for r in a] == [[s.token_ids for s in r] for r in b]
        assert [[s.logprobs for s in r] for r in a] == [[s.logprobs for s in r] for r in b]
    assert pooled._cache_pool._bufs            # the buffers stay for the next batch
    dtypes = {k[1] for k in pooled._cache_pool._bufs}
    assert dtypes == {torch.float32 if fmt == "fp32" or cpu16 == "none" else torch.bfloat16}
