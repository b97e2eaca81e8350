"""The built-in rollout engine: batched sampling with a KV cache on any transformers causal LM.

Rows are grouped by prompt length (less left padding), decoded together, and finished rows
are dropped from the batch as soon as they emit EOS. Each row draws its uniforms from its
own generator seeded by (seed, prompt, sample index), so a sample does not depend on how
problems are batched, sharded or resumed. μ is the log-probability of the sampled token
under the distribution actually sampled (temperature and top-p applied), from fp32 logits.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Iterable, Sequence

import torch

from .. import formats
from ..model_formats import NO_KERNELS, RolloutWeights, apply_rollout_kernels
from ..kernels import UPCAST_ATTENTION
from ..moe import is_moe
from ..routes import DecodeRoutes
from . import Sample, Sampling, row_seed

if TYPE_CHECKING:
    from .kv_cache import BufferPool


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """log of the sampling distribution: log_softmax(logits/T) restricted to the top-p nucleus
    and renormalised (−inf outside it). Logits are cast to fp32 first."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_lp, idx = logp.sort(dim=-1, descending=True)
    cum = sorted_lp.exp().cumsum(-1)
    drop_sorted = (cum - sorted_lp.exp()) >= top_p          # keep the smallest set reaching top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
    logp = logp.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logp, dim=-1)


def inverse_cdf_sample(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token index per row with P(token) = exp(logp); `u` uniform in [0, 1), one per row."""
    cdf = logp.exp().cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
    return idx.clamp_(max=logp.shape[-1] - 1)


def shared_prompts(prompt_ids: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts of a batch's rows, in first-seen order, and for each row the index
    of its prompt among them: a prompt sampled n times is prefilled once (vLLM's prefix
    caching, SGLang's RadixAttention, within one batch)."""
    first: dict[tuple[int, ...], int] = {}
    src = [first.setdefault(tuple(p), len(first)) for p in prompt_ids]
    return [list(p) for p in first], src          # a dict keeps the order its keys came in


@contextmanager
def head_over_rows(model, rows: torch.Tensor | None):
    """While active, the model's output head (`get_output_embeddings`) takes its input's rows
    `rows` (the prompts' last hidden states, one per sampled row): the first token's logits come
    from a head GEMM over every sampled row, as a prefill of every row computes them (a CPU
    GEMM's result for a row depends on the row count below a few rows, e.g. one prompt sampled
    n times). Yields whether the head was found (else the caller repeats the logits)."""
    head = model.get_output_embeddings() if rows is not None else None
    if head is None:
        yield False
        return
    handle = head.register_forward_pre_hook(lambda mod, args: (args[0].index_select(0, rows), *args[1:]))
    try:
        yield True
    finally:
        handle.remove()


class TorchEngine:
    name = "torch"

    def __init__(self, model_path: str, dtype: str = "fp32", max_batch: int = 512,
                 threads: int | None = None, model=None, tokenizer=None, track_updates: bool = False,
                 prepared: bool = False, device: str = "cpu", vllm_kernels: bool = True,
                 preallocated_cache: bool = True, record_routes: bool = False, share_prompts: bool = True,
                 record_distributions: bool = False, cascade_attention: bool = False):
        """`dtype`: any format of bench/formats.py. `model`: an fp32 model to take over (it is
        modified, and moved to `device`). `track_updates`: record `sync_stats` at every
        update_weights (keeps an fp32 copy of the linear weights). `prepared`: sample from
        `model` exactly as given (e.g. the training engine's compute copy); update_weights is
        then refused. `device`: cpu or cuda[:i] (bench/device.py); the per-row uniforms are
        drawn on the CPU either way, so a sample's randomness does not depend on the device.
        `vllm_kernels`: 16-bit formats compute as vLLM does (bench/kernels.py); False
        keeps torch's own kernels (the baseline of benchmarks/lowp_speed.py). `preallocated_cache`:
        decode into a KV cache sized once per batch (bench/engines/kv_cache.py; the same numbers);
        False: transformers' DynamicCache, which copies the cache at every token (the baseline of
        benchmarks/kv_cache.py). `record_routes`: an
        MoE model's samples carry the experts chosen at every position (`Sample.routes`, bench/routes.py).
        `share_prompts`: a prompt's n samples share one prefill (its keys, values and last logits
        copied to each row: `shared_prompts`); False prefills every row (the baseline of
        benchmarks/rollout_engine.py). Samples are the same either way where the CPU's GEMM rounds
        a row whatever the row count (the AMD EPYCs measured; an Intel AMX Xeon's fp32 GEMM does not,
        and there fp32 μ moves in its last bits, the tokens unchanged: tests/bench/engines/test_kv_cache.py).
        `record_distributions`: each sample carries the whole distribution every token was drawn
        from (`Sample.distributions`, fp32 [T, V] log-probs: `bench check`'s full-vocabulary KL).
        `cascade_attention`: decode with the shared-prefix attention (bench/engines/cascade.py: a
        prompt's keys read once per prompt, not once per row; the same arithmetic up to the order
        of fp32 additions, so not the same bits); ValueError for a model with sliding-window or
        linear-attention layers, without the preallocated cache, or `prepared` (its attention is
        the trainer's). Its cache holds fp32 keys and values (twice a 16-bit cache on a GPU)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from . import cascade, kv_cache

        if threads:
            torch.set_num_threads(threads)
        self.format = formats.get(dtype)
        self.dtype = self.format.dtype
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        model = model if model is not None else AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.device = torch.device(device)
        if not prepared:
            model = model.to(self.device)
        self.track_updates = track_updates
        self.sync_stats: dict[str, float] = {}
        if prepared and cascade_attention:
            raise ValueError("the cascade attention is the rollout engine's: a prepared model keeps its own attention")
        if prepared:
            self.model, self.weights = model, None
        else:
            # parameters only (RoPE buffers stay fp32); W8A8 formats quantize every linear layer, lm_head
            # included (untied from the embedding); 16-bit formats compute as vLLM does (bench/kernels.py)
            self.weights = RolloutWeights(model, self.format, track=track_updates)
            self.model = self.weights.model.eval()
            self.kernels = (apply_rollout_kernels(self.model, self.format, self.device) if vllm_kernels
                            else dict(NO_KERNELS))
        # the model's own attention implementation; the cascade decodes over it (its prefill runs it)
        self.cascade = None          # the text config, where the engine decodes with the cascade
        if cascade_attention:
            if not preallocated_cache:
                raise ValueError("--cascade-attention decodes into the preallocated cache")
            self.cascade = kv_cache.plain_attention(self.model.config)
            if self.cascade is None:
                raise ValueError(cascade.refusal(self.model.config))
        self.attention = cascade.use_cascade(self.model) if self.cascade is not None else \
            getattr(self.model.config, "_attn_implementation", None)
        self.max_batch = max_batch
        self.preallocated_cache = preallocated_cache
        # the cache's buffers between batches
        self._cache_pool = kv_cache.BufferPool() if self.device.type == "cpu" else None
        self.share_prompts = share_prompts
        self.record_routes = record_routes and is_moe(self.model)
        self.record_distributions = record_distributions
        self.eos = self.tokenizer.eos_token_id
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos

    # -------------------------------------------------------------- interface
    def generate(self, prompts: Sequence[str], n: int, sampling: Sampling, start: int = 0) -> list[list[Sample]]:
        training = self.model.training          # a prepared training copy: sample in eval mode (no activation
        if training:                            # checkpointing, which would drop the KV cache), then restore
            self.model.eval()
        try:
            return self._generate(prompts, n, sampling, start)
        finally:
            if training:
                self.model.train()

    def _generate(self, prompts: Sequence[str], n: int, sampling: Sampling, start: int) -> list[list[Sample]]:
        encoded = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        rows.sort(key=lambda r: len(encoded[r[0]]))
        out: list[list[Sample | None]] = [[None] * n for _ in prompts]
        with self._cache_pool.lease() if self._cache_pool is not None else nullcontext() as pool:
            for c0 in range(0, len(rows), self.max_batch):
                chunk = rows[c0:c0 + self.max_batch]
                uniforms = torch.stack([
                    torch.rand(sampling.max_tokens, generator=torch.Generator().manual_seed(
                        row_seed(sampling.seed, prompts[i], start + j)), dtype=torch.float64).float()
                    for i, j in chunk])
                for (i, j), sample in zip(chunk, self._decode([encoded[i] for i, _ in chunk], uniforms, sampling,
                                                              pool)):
                    out[i][j] = sample
        return out  # type: ignore[return-value]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load fp32 master weights by the master's parameter names; W8A8 layers re-quantize
        from them, a tied lm_head is refreshed from the embedding's tensor. With
        `track_updates`, `sync_stats` describes this sync (bench/model_formats.py)."""
        if self.weights is None:
            raise RuntimeError("this engine samples from a prepared model; it takes no weight updates")
        self.sync_stats = self.weights.load(named_tensors, track=self.track_updates)

    def close(self) -> None:
        self.model = None
        self._cache_pool = None

    def _cache(self, b: int, n_prompts: int, capacity: int, rows: torch.Tensor | None, prompt_mask: torch.Tensor,
               pool: BufferPool | None):
        """The decode's KV cache for b rows of n_prompts prompts (`rows`: each row's prompt, None
        when each row is its own), `prompt_mask` [n_prompts, W] their attention mask."""
        from transformers import DynamicCache

        from . import cascade, kv_cache

        # an upcast attention reads fp32 keys and values: the cache holds them so (the same numbers);
        # the cascade reads them as fp32 too
        store = torch.float32 if self.attention == UPCAST_ATTENTION or self.cascade is not None else None
        if self.cascade is not None:
            prompt = torch.arange(b, device=self.device) if rows is None else rows
            return cascade.SharedPrefixCache(self.cascade.num_hidden_layers, capacity, prompt, n_prompts, prompt_mask,
                                             store, pool)
        if self.preallocated_cache:
            return kv_cache.preallocated_cache(self.model, capacity, repeat=rows, store=store, pool=pool)
        return DynamicCache()

    # -------------------------------------------------------------- decoding
    @torch.no_grad()
    def _decode(self, prompt_ids: list[list[int]], uniforms: torch.Tensor, sp: Sampling,
                pool: BufferPool | None = None) -> list[Sample]:
        from . import cascade, kv_cache

        dev = self.device
        b = len(prompt_ids)
        width = max(map(len, prompt_ids))
        uniq, src = shared_prompts(prompt_ids) if self.share_prompts else (prompt_ids, None)
        src = src if len(uniq) < b else None
        ids = torch.full((len(uniq), width), self.pad, dtype=torch.long)
        attn = torch.zeros((len(uniq), width), dtype=torch.long)
        for r, p in enumerate(uniq):
            ids[r, width - len(p):] = torch.tensor(p)
            attn[r, width - len(p):] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        rows = None if src is None else torch.tensor(src, device=dev)     # each row's prompt among `uniq`
        cache = self._cache(b, len(uniq), width + sp.max_tokens, rows, attn, pool)
        routes = DecodeRoutes(self.model, b, width + sp.max_tokens) if self.record_routes else None
        live = torch.arange(b)                       # original row of each batch row (CPU)
        tokens: list[list[int]] = [[] for _ in range(b)]
        logps: list[list[float]] = [[] for _ in range(b)]
        dists: list[list[torch.Tensor]] = [[] for _ in range(b)]
        finish = ["length"] * b
        # the prompt's last position only: a full [B, W, V] prefill would not fit for a real vocabulary
        with head_over_rows(self.model, rows) as expanded, cascade.decoding(cache):
            logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos,
                                past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        if rows is not None:                         # each prompt's keys, values (and logits) to each of its rows
            if not kv_cache.is_preallocated(cache):  # (a preallocated cache stored them so)
                cache.reorder_cache(rows)
            logits = logits if expanded else logits[rows]
            attn, pos = attn[rows], pos[rows]
        if routes is not None:
            routes.prefill(attn, rows)
        next_pos = pos[:, -1:] + 1
        for t in range(sp.max_tokens):
            lp = sampling_logprobs(logits, sp.temperature, sp.top_p)
            tok = inverse_cdf_sample(lp, uniforms[live, t].to(dev))
            tok_lp = lp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
            done = (tok == self.eos).cpu()
            if self.record_distributions:
                for row, dist in zip(live.tolist(), lp.float().cpu()):
                    dists[row].append(dist)
            for row, x, l, d in zip(live.tolist(), tok.tolist(), tok_lp.tolist(), done.tolist()):
                tokens[row].append(x)
                logps[row].append(l)
                if d:
                    finish[row] = "stop"
            keep = ~done
            if t == sp.max_tokens - 1 or not keep.any():
                break
            if not keep.all():                        # drop finished rows from the batch
                order = kv_cache.drop_rows(cache, keep)
                od = order.to(dev)
                live, tok, attn, next_pos = live[order], tok[od], attn[od], next_pos[od]
            attn = torch.cat([attn, torch.ones((len(live), 1), dtype=attn.dtype, device=dev)], dim=-1)
            with cascade.decoding(cache):
                logits = self.model(input_ids=tok.unsqueeze(-1), attention_mask=attn, position_ids=next_pos,
                                    past_key_values=cache, use_cache=True).logits[:, -1]
            if routes is not None:
                routes.step(live)
            next_pos = next_pos + 1
        if routes is not None:
            routes.close()
        return [Sample(token_ids=tokens[r], logprobs=logps[r], finish_reason=finish[r],
                       text=self.tokenizer.decode([x for x in tokens[r] if x != self.eos], skip_special_tokens=False),
                       routes=None if routes is None else routes.sample(r),
                       distributions=torch.stack(dists[r]) if self.record_distributions else None)
                for r in range(b)]
