"""A preallocated KV cache for the built-in engine's decode loop.

transformers' `DynamicCache` grows each layer's keys and values by `torch.cat` at every token,
so decoding token t copies the whole cache, O(t) per token and O(T²) per response: on a GPU
with a real model this copy, not the arithmetic, sets a long response's per-token cost. Here
each layer's keys and values live in one buffer of the batch's final length (the prompt's width
plus `max_tokens`, as vLLM's paged cache is sized once); a token writes its column in place and
attention reads the filled prefix as a view:

    K[:, :, t] ← k_t,   attend over K[:, :, :t+1]      (no copy of K[:, :, :t])

Dropping finished rows (the engine's `reorder_cache`) compacts the kept rows' filled prefix to
the front of the same buffer: one copy of the live part, when rows finish, as before. The
values attention reads are the same numbers in the same order as DynamicCache's, so samples and
log-probs are unchanged bit for bit (tests/test_kv_cache.py).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in buffers [B, H, capacity, D]; `length` columns filled,
    `rows` rows live."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.rows = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self._k = torch.empty((b, h, self.capacity, d), dtype=key_states.dtype, device=key_states.device)
        self._v = torch.empty((b, h, self.capacity, value_states.shape[-1]), dtype=value_states.dtype,
                              device=value_states.device)
        self.rows, self.length = b, 0
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        end = self.length + q
        if end > self.capacity:
            raise RuntimeError(f"KV cache full: {end} positions asked of {self.capacity}")
        self._k[:self.rows, :, self.length:end] = key_states
        self._v[:self.rows, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self._k[:self.rows, :, :end], self._v[:self.rows, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self.capacity

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep rows `beam_idx` (in that order): their filled prefix moves to the front."""
        if not self.is_initialized:
            return
        idx = beam_idx.to(self._k.device)
        n, t = len(idx), self.length
        self._k[:n, :, :t] = self._k[idx, :, :t]          # advanced indexing reads a copy first
        self._v[:n, :, :t] = self._v[idx, :, :t]
        self.rows = n
        self.keys, self.values = self._k[:n, :, :t], self._v[:n, :, :t]

    batch_select_indices = reorder_cache


def preallocated_cache(model, capacity: int) -> Cache:
    """A cache of `capacity` positions per layer for `model`, or transformers' DynamicCache
    where the model's layers are not all plain full attention (sliding windows, linear
    attention: their own cache layers)."""
    from transformers import DynamicCache

    cfg = getattr(model, "config", None)
    cfg = cfg.get_text_config() if cfg is not None and hasattr(cfg, "get_text_config") else cfg
    types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"} or getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return DynamicCache()
    return Cache(layers=[PreallocatedLayer(capacity) for _ in range(cfg.num_hidden_layers)])
