"""The shared-prefix ("cascade") decode attention of the built-in engine.

A prompt sampled n times decodes n rows that share its keys and values: a plain decode step has
every row read its own copy of the prompt's keys (transformers' `generate()`), or a copy of the
one prefill's (bench/engines/kv_cache.py). Here the prompt's keys and values are stored once
per prompt (the prefix, [P, H, W, D]) beside each row's own generated ones (the suffix,
[B, H, T, D]), and a decode step attends over both parts with one softmax:

    S_p = (q · K_pᵀ) · scale over the prompt's W positions (−inf on its left padding),
    S_s = (q · K_sᵀ) · scale over the row's t generated positions,
    m = max(max S_p, max S_s),   E = exp(S − m) (fp32),   l = Σ E_p + Σ E_s (fp32),
    O = round16( (round16(E_p) · V_p + round16(E_s) · V_s)_fp32 / l )

— FlashAttention-2's arithmetic (bench/kernels.flash_attention_arithmetic: one max, the
unnormalised exponentials rounded to the format's 16 bits for the products, the fp32 sum
dividing at the end; round16 is the identity in fp32) with the keys split into two blocks. The
rows of a prompt are gathered into one [n_max·rep, D] block of queries (rep: query heads per
key/value head), so the prefix's part is one GEMM per prompt and head that reads K_p and V_p
once, not once per row; the suffix's part is a batched GEMV per row. vLLM's cascade attention
(vllm/v1/attention/backends/flash_attn.py, `cascade_attention`) computes the same two parts as
two FlashAttention calls, each with its own max and sum, and merges them by their log-sum-exps
(`merge_attn_states`: O = (e^{lse_p−M}·O_p + e^{lse_s−M}·O_s) / (e^{lse_p−M} + e^{lse_s−M})); here
one max covers both parts before any exponential, so the sum and the products are rescaled by
nothing, which is the one-block arithmetic up to the order of fp32 additions (the two parts'
products are added after each is summed).

The decode's arithmetic moves by that order: samples and μ are no longer bit-identical to the
plain path's, so the engine takes it only when asked (`TorchEngine(cascade_attention=True)`,
the run knob `cascade_attention`, recorded "when-set"). The prefill keeps the model's own
attention (torch's sdpa, or the emulated 16-bit arithmetic of bench/kernels.py).
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache

from .kv_cache import PreallocatedLayer

CASCADE = "bench_cascade"        # attention implementation names: CASCADE + "_" + the base's
_ACTIVE: contextvars.ContextVar["SharedPrefixCache | None"] = contextvars.ContextVar("bench_cascade", default=None)


# ------------------------------------------------------------------ which rows belong to which prompt

def prompt_slots(prompt: torch.Tensor, n_prompts: int) -> tuple[torch.Tensor, int]:
    """Each row's place among its prompt's rows, and the most rows a prompt has: (rank [B], n_max),
    with rank counted in row order.

        prompt = [1, 0, 1, 1, 0]  →  rank = [0, 0, 1, 2, 1], n_max = 3
    """
    if not len(prompt):
        return prompt.clone(), 0
    order = torch.sort(prompt, stable=True).indices
    counts = torch.bincount(prompt, minlength=n_prompts)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(prompt)
    rank[order] = torch.arange(len(prompt), device=prompt.device) - starts[prompt[order]]
    return rank, int(counts.max())


class PromptRows:
    """The prompt (among the P prefilled) of each live row, with `prompt_slots`' ranks: one
    object shared by every layer of a `SharedPrefixCache`, moved once per dropped batch."""

    def __init__(self, prompt: torch.Tensor, n_prompts: int):
        self.n_prompts = n_prompts
        self.set(prompt)

    def set(self, prompt: torch.Tensor) -> None:
        self.prompt = prompt
        self.rank, self.n_max = prompt_slots(prompt, self.n_prompts)
        # prompt-major rows, n_max each (a batch before any row finishes): the slots are a view
        self.in_order = len(prompt) == self.n_prompts * self.n_max and bool(
            (prompt == torch.arange(len(prompt), device=prompt.device) // max(self.n_max, 1)).all())

    def keep(self, order: torch.Tensor) -> None:
        """The rows `order` (old row of each new row) remain."""
        self.set(self.prompt[order.to(self.prompt.device)])


def _to_slots(x: torch.Tensor, rows: PromptRows) -> torch.Tensor:
    """[B, Hkv, rep, ...] → [P, Hkv, n_max·rep, ...]: each row's entries in its prompt's block at
    slot `rank`; empty slots are 0."""
    b, h, rep, *rest = x.shape
    if rows.in_order:
        return x.view(rows.n_prompts, rows.n_max, h, rep, *rest).transpose(1, 2).reshape(
            rows.n_prompts, h, rows.n_max * rep, *rest)
    out = x.new_zeros((rows.n_prompts, h, rows.n_max, rep, *rest))
    out[rows.prompt, :, rows.rank] = x
    return out.view(rows.n_prompts, h, rows.n_max * rep, *rest)


def _from_slots(x: torch.Tensor, rows: PromptRows, rep: int) -> torch.Tensor:
    """The inverse of `_to_slots`: [P, Hkv, n_max·rep, ...] → [B, Hkv, rep, ...]."""
    p, h, _, *rest = x.shape
    x = x.view(p, h, rows.n_max, rep, *rest)
    if rows.in_order:
        return x.transpose(1, 2).reshape(p * rows.n_max, h, rep, *rest)
    return x[rows.prompt, :, rows.rank]


# ------------------------------------------------------------------ the arithmetic

def cascade_attention(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor, prefix_keep: torch.Tensor,
                      k_suffix: torch.Tensor, v_suffix: torch.Tensor, rows: PromptRows, scale: float,
                      dtype: torch.dtype, softcap: float | None = None) -> torch.Tensor:
    """One decode token's attention over a shared prefix and each row's suffix (the module's
    equation). q [B, Hq, 1, D] (the format's dtype); k/v_prefix [P, Hkv, W, D] and
    k/v_suffix [B, Hkv, t, D] in fp32 (16-bit values held exactly) or the format's dtype;
    prefix_keep [P, W] bool (False: the prompt's left padding); `rows`: the prompt of each of
    the B rows. Returns [B, 1, Hq, D] in `dtype` (transformers' attention output layout)."""
    b, hq, _, d = q.shape
    hkv = k_prefix.shape[1]
    rep = hq // hkv
    qf = q.float().reshape(b, hkv, rep, d)
    s_p = torch.matmul(_to_slots(qf, rows), k_prefix.float().transpose(-1, -2)) * scale     # [P, Hkv, n·rep, W]
    s_s = torch.matmul(qf, k_suffix.float().transpose(-1, -2)) * scale                       # [B, Hkv, rep, t]
    if softcap:
        s_p, s_s = torch.tanh(s_p / softcap) * softcap, torch.tanh(s_s / softcap) * softcap
    s_p = _from_slots(s_p.masked_fill(~prefix_keep[:, None, None, :], float("-inf")), rows, rep)
    m = torch.maximum(s_p.amax(-1, keepdim=True), s_s.amax(-1, keepdim=True))
    e_p, e_s = torch.exp(s_p - m), torch.exp(s_s - m)
    l = e_p.sum(-1, keepdim=True) + e_s.sum(-1, keepdim=True)
    o_p = _from_slots(torch.matmul(_to_slots(e_p.to(dtype).float(), rows), v_prefix.float()), rows, rep)
    o = (o_p + torch.matmul(e_s.to(dtype).float(), v_suffix.float())) / l                  # [B, Hkv, rep, D]
    return o.to(dtype).reshape(b, 1, hq, d)


# ------------------------------------------------------------------ the cache

class SharedPrefixLayer(PreallocatedLayer):
    """One layer's prompt keys and values once per prompt (`k_prefix`, `v_prefix` [P, H, W, D],
    the first forward's, which runs over the distinct prompts) and each row's generated ones in
    the rows' buffers ([B, H, capacity − W, D]), in `store` (see PreallocatedLayer: `width` = W
    positions held apart). After the prefill, `update` writes the rows' new columns and returns
    their filled part; `cascade_attention` reads both. `length` counts both parts (the positions
    attended)."""

    def __init__(self, capacity: int, rows: PromptRows, store: torch.dtype | None = None,
                 pool=None, index: int | None = None):
        super().__init__(capacity, None, store, pool, index)
        self.shared = rows

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        p, h, w, d = key_states.shape
        b, dv = len(self.shared.prompt), value_states.shape[-1]
        self.dtype, self.device = self.store or key_states.dtype, key_states.device
        self.k_prefix = self._buffer("kp", (p, h, w, d))
        self.v_prefix = self._buffer("vp", (p, h, w, dv))
        self._k = self._buffer("k", (b, h, self.capacity - w, d))
        self._v = self._buffer("v", (b, h, self.capacity - w, dv))
        self.rows, self.length, self.width = b, 0, w
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.is_initialized:                      # a decode step: the rows' own columns
            return super().update(key_states, value_states)
        self.lazy_initialization(key_states, value_states)     # the prefill: its own attention over its rows
        self.k_prefix.copy_(key_states)
        self.v_prefix.copy_(value_states)
        self.length = self.width
        return key_states, value_states


class SharedPrefixCache(Cache):
    """A `SharedPrefixLayer` per layer over one `PromptRows`; `prefix_keep` [P, W]: the prompts'
    attention mask (False on left padding)."""

    def __init__(self, n_layers: int, capacity: int, prompt: torch.Tensor, n_prompts: int,
                 prefix_keep: torch.Tensor, store: torch.dtype | None = None, pool=None):
        self.shared = PromptRows(prompt, n_prompts)
        self.prefix_keep = prefix_keep.bool()
        super().__init__(layers=[SharedPrefixLayer(capacity, self.shared, store, pool, i) for i in range(n_layers)])

    def keep_rows(self, order: torch.Tensor) -> None:
        self.shared.keep(order)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep rows `beam_idx` (transformers' beam search, `batch_select_indices`): their suffixes
        and their prompts."""
        super().reorder_cache(beam_idx)
        self.keep_rows(beam_idx)


@contextmanager
def decoding(cache: Cache):
    """While active, the cascade attention of this thread's forwards reads `cache` (a
    SharedPrefixCache; any other cache: the base attention throughout)."""
    token = _ACTIVE.set(cache if isinstance(cache, SharedPrefixCache) else None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


# ------------------------------------------------------------------ the attention implementation

def refusal(config) -> str | None:
    """Why a model of `config` cannot decode with the cascade, or None: its layers must all be
    plain full attention (a sliding window or linear attention keeps transformers' own cache)."""
    from .kv_cache import plain_attention

    if plain_attention(config) is None:
        return ("--cascade-attention needs a model whose layers are all full attention; this one has sliding-window "
                "or linear-attention layers")
    return None


def request_refusal(model_path: str, engine: str) -> str | None:
    """Why a run or build asking for the cascade cannot have it, or None, before anything is
    written: the built-in engine only (vLLM chooses its own cascade attention), and a model of
    full-attention layers (`refusal`, from its config)."""
    from transformers import AutoConfig

    if engine != "torch":
        return ("--cascade-attention is the built-in engine's decode attention: use --engine torch (vLLM chooses its "
                "own cascade attention)")
    return refusal(AutoConfig.from_pretrained(model_path))


def _cascade_forward(base: str):
    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
        cache = _ACTIVE.get()
        idx = getattr(module, "layer_idx", None)
        layer = cache.layers[idx] if cache is not None and idx is not None else None
        if layer is None or query.shape[-2] != 1 or not layer.is_initialized or layer.length <= layer.width:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            return ALL_ATTENTION_FUNCTIONS[base](module, query, key, value, attention_mask, scaling=scaling,
                                                 dropout=dropout, softcap=softcap, **kwargs)
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        out = cascade_attention(query, layer.k_prefix, layer.v_prefix, cache.prefix_keep.to(query.device),
                                key, value, cache.shared, scale, query.dtype, softcap)
        return out, None
    return forward


def use_cascade(model) -> str:
    """Give `model` the cascade decode attention over its current implementation (sdpa, or
    bench/kernels.py's upcast), registered with transformers as CASCADE_<base> with the base's
    masks; the prefill and any forward outside `decoding` run the base (looked up at each call).
    Returns the base's name; ValueError where the base is not a registered attention (eager)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    base = model.config._attn_implementation
    if base.startswith(CASCADE):
        return base[len(CASCADE) + 1:]
    if base not in ALL_ATTENTION_FUNCTIONS or not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"the cascade attention decodes over a registered attention (sdpa, bench's upcast); this "
                         f"model runs {base!r}")
    name = f"{CASCADE}_{base}"
    AttentionInterface.register(name, _cascade_forward(base))
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    model.set_attn_implementation(name)
    return base

