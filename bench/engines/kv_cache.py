"""A preallocated KV cache for the built-in engine's decode loop.

transformers' `DynamicCache` grows each layer's keys and values by `torch.cat` at every token,
so decoding token t copies the whole cache, O(t) per token and O(T²) per response: on a GPU
with a real model this copy, not the arithmetic, sets a long response's per-token cost. Here
each layer's keys and values live in one buffer of the batch's final length (the prompt's width
plus `max_tokens`, as vLLM's paged cache is sized once); a token writes its column in place and
attention reads the filled prefix as a view:

    K[:, :, t] ← k_t,   attend over K[:, :, :t+1]      (no copy of K[:, :, :t])

Dropping finished rows (`drop_rows`) moves the live rows past the batch's new end into the
finished rows' slots: f finished rows copy at most f rows' prefixes, where compacting every kept
row (`reorder_cache`, DynamicCache's way) copies the whole live cache each time a row finishes.
A prompt prefilled once for its n samples is written into each of its n rows as the prefill
stores it (`repeat`), with no second copy. A row's keys and values are the same
numbers in the same order as DynamicCache's wherever the row sits in the batch, so samples and
log-probs are unchanged bit for bit (tests/bench/engines/test_kv_cache.py).
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in buffers [B, H, capacity, D]; `length` columns filled,
    `rows` rows live. `repeat`: the first forward ran over distinct prompts only, and batch row
    r holds that forward's row repeat[r] (a prompt prefilled once, then given to each of its
    samples: bench/engines/torch_engine.py); B is then len(repeat). `store`: the buffers' dtype
    when not the states' own: fp32 holds 16-bit keys and values exactly, for an attention that
    reads them as fp32 (bench/kernels.py, upcast_attention) and would otherwise convert the
    whole cache at every token. `width`: the leading positions held apart from the rows' buffers
    (0 here; a shared prompt in bench/engines/cascade.py), so row buffer column c is position
    width + c and `filled` columns are written."""

    def __init__(self, capacity: int, repeat: torch.Tensor | None = None, store: torch.dtype | None = None,
                 pool: "BufferPool | None" = None, index: int | None = None):
        super().__init__()
        if pool is not None and index is None:
            raise ValueError("a pooled layer needs its index (its own buffers)")
        self.capacity = capacity
        self.repeat = repeat
        self.store = store
        self.pool, self.index = pool, index         # buffers kept between batches (`BufferPool`), this layer's
        self.length = self.rows = self.width = 0

    @property
    def filled(self) -> int:
        """Columns of the rows' buffers written."""
        return self.length - self.width

    def _buffer(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A buffer of this layer (`name`: k, v, ...), from the pool where there is one."""
        new = self.pool.take if self.pool is not None else _empty
        return new((name, self.index), shape, self.dtype, self.device)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        n = b if self.repeat is None else len(self.repeat)
        self.dtype, self.device = self.store or key_states.dtype, key_states.device
        self._k = self._buffer("k", (n, h, self.capacity, d))
        self._v = self._buffer("v", (n, h, self.capacity, value_states.shape[-1]))
        self.rows, self.length = n, 0
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        first = not self.is_initialized
        if first:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        end = self.length + q
        if end > self.capacity:
            raise RuntimeError(f"KV cache full: {end} positions asked of {self.capacity}")
        if first and self.repeat is not None:
            # each prompt's keys and values into each of its rows; this forward attends over its own rows
            idx = self.repeat.to(key_states.device)
            self._k[:, :, :end] = torch.index_select(key_states, 0, idx)
            self._v[:, :, :end] = torch.index_select(value_states, 0, idx)
            self.length = end
            self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
            return key_states, value_states
        c = self.filled
        self._k[:self.rows, :, c:c + q] = key_states
        self._v[:self.rows, :, c:c + q] = value_states
        self.length = end
        self.keys, self.values = self._k[:self.rows, :, :c + q], self._v[:self.rows, :, :c + q]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self.capacity

    def _rows_moved(self, rows: int) -> None:
        t = self.filled
        self.rows = rows
        self.keys, self.values = self._k[:rows, :, :t], self._v[:rows, :, :t]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep rows `beam_idx` (in that order): their filled prefix moves to the front."""
        if not self.is_initialized:
            return
        idx = beam_idx.to(self._k.device)
        n, t = len(idx), self.filled
        # index_select reads a copy first (and is ~5× advanced indexing's speed on these strided views)
        self._k[:n, :, :t] = torch.index_select(self._k[:, :, :t], 0, idx)
        self._v[:n, :, :t] = torch.index_select(self._v[:, :, :t], 0, idx)
        self._rows_moved(n)

    batch_select_indices = reorder_cache

    def move_rows(self, dst: torch.Tensor, src: torch.Tensor, rows: int) -> None:
        """Rows `src` take the places `dst` (disjoint), then the first `rows` rows are live: a
        finished row's slot is filled by a live row from past the new end, so dropping f rows
        copies at most f rows' prefixes, not every live row's."""
        if not self.is_initialized:
            return
        t = self.filled
        if len(dst):
            dst, src = dst.to(self._k.device), src.to(self._k.device)
            for buf in (self._k, self._v):
                filled = buf[:, :, :t]
                filled.index_copy_(0, dst, torch.index_select(filled, 0, src))
        self._rows_moved(rows)


def _empty(key, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


class BufferPool:
    """The cache's buffers kept from one decode batch to the next (an engine's, on the CPU): a
    buffer of a few hundred MB allocated afresh for every batch is returned to the operating
    system when freed, and its pages are faulted in again on first write (~4-8% of a tiny-math
    rollout). Each (layer, keys or values, dtype, device) keeps one flat buffer, grown (by a
    quarter more than asked, as a batch's later chunks are wider) when a batch needs more;
    `take` views its front in the batch's shape. One batch at a time: while a `lease` is held,
    another lease (any thread) gets None and allocates afresh. Buffers of more than `keep_bytes`
    in all are freed when the lease ends (a real model's cache would otherwise stay beside
    training's memory). On a GPU the caching allocator already reuses freed blocks."""

    def __init__(self, keep_bytes: int = 1 << 30):
        self.keep_bytes = keep_bytes
        self._bufs: dict[tuple, torch.Tensor] = {}
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._bufs.values())

    @contextmanager
    def lease(self):
        if not self._lock.acquire(blocking=False):
            yield None
            return
        try:
            yield self
        finally:
            if self.nbytes > self.keep_bytes:
                self._bufs.clear()
            self._lock.release()

    def take(self, key, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        assert self._lock.locked(), "take() outside a lease"
        need, k = math.prod(shape), (key, dtype, device)
        buf = self._bufs.get(k)
        if buf is None or buf.numel() < need:
            del buf
            self._bufs.pop(k, None)                      # a smaller one is freed before the new one is made
            buf = self._bufs[k] = torch.empty(need + need // 4, dtype=dtype, device=device)
        return buf[:need].view(shape)


def plain_attention(config):
    """The text config of a model's `config` where its layers are all plain full attention (no
    sliding window, no linear attention: those keep their own cache layers), else None."""
    cfg = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"} or getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return None
    return cfg


def preallocated_cache(model, capacity: int, repeat: torch.Tensor | None = None,
                       store: torch.dtype | None = None, pool: BufferPool | None = None) -> Cache:
    """A cache of `capacity` positions per layer for `model` (`repeat`, `store`: see PreallocatedLayer;
    `pool`: its buffers from there, `BufferPool`), or transformers' DynamicCache where the model's
    layers are not all plain full attention (`plain_attention`)."""
    cfg = plain_attention(getattr(model, "config", None))
    if cfg is None:
        return DynamicCache()
    return Cache(layers=[PreallocatedLayer(capacity, repeat, store, pool, i) for i in range(cfg.num_hidden_layers)])


def fill_from_end(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop the batch rows where `keep` is False by moving the kept rows past the new end into
    the freed slots below it: (order, dst, src), with `order` the old row of each new row
    (arange but at `dst`, which hold `src`). Rows that stay keep their slot.

        keep = [T, F, T, F, T, T]  →  order = [0, 4, 2, 5], dst = [1, 3], src = [4, 5]
    """
    n = int(keep.sum())
    dst = (~keep[:n]).nonzero().squeeze(-1)
    src = keep[n:].nonzero().squeeze(-1) + n
    order = torch.arange(n)
    order[dst] = src
    return order, dst, src


def drop_rows(cache: Cache, keep: torch.Tensor) -> torch.Tensor:
    """Drop the finished rows (`keep` False, on the CPU) from `cache`; returns the old row of each
    remaining row, to index the batch's other tensors with. A preallocated cache moves only the
    rows `fill_from_end` names; any other cache reorders every layer (`reorder_cache`)."""
    order, dst, src = fill_from_end(keep)
    if is_preallocated(cache):
        for layer in cache.layers:
            layer.move_rows(dst, src, len(order))
        if hasattr(cache, "keep_rows"):              # the rows' prompts (bench/engines/cascade.py)
            cache.keep_rows(order)
    else:
        cache.reorder_cache(order)           # each layer moves the index to its own device
    return order


def is_preallocated(cache: Cache) -> bool:
    """Every layer of `cache` a PreallocatedLayer (not transformers' DynamicCache)."""
    return bool(cache.layers) and all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
