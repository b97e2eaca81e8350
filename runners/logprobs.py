"""Tensors of the training engine: a batch of prompt + response ids packed for one forward,
and log π of the sampled response tokens.

`response_logprobs` never holds the [N, T, V] logits of a batch: it runs the model's body
once (hidden states [N, W, H]), keeps the response positions ([N, T, H]) and applies the
model's own `lm_head` (whatever a format made of it: quantized, fp32 "head32", tied to the
embedding) to a chunk of positions at a time, taking log-softmax in fp32 per chunk and
gathering the sampled tokens. With grad, each chunk is recomputed in backward
(torch.utils.checkpoint), so autograd keeps only the hidden states, not the chunk logits.
Per chunk the arithmetic is the full-logits function's (`full_response_logprobs`), so the
values are the same bits on CPU; the memory is one chunk's logits: at most
`max_logit_elements` values (default 2^26: 256 MiB in fp32), e.g. for 8 responses of 8,192
tokens over Qwen's 151,936-token vocabulary 55 positions per chunk instead of 40 GB at once.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

from .algos import sc_weights

LOGIT_CHUNK_ELEMENTS = 2 ** 26          # values of one chunk's logits (fp32: 256 MiB)


# ------------------------------------------------------------------ tensors


def _at_least_fp32(logits: torch.Tensor) -> torch.Tensor:
    """The logits the log-softmax reads: fp32 for a 16-bit or fp32 model (the same bits as
    `.float()`), float64 for a float64 one (the tests' exact reference), never rounded down."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def pack(prompt_ids: list[list[int]], responses: list[list[int]], pad: int):
    """Right-padded prompt+response ids [N, W], attention mask, and for the response tokens
    their positions in the sequence [N, T], their ids [N, T] and a mask [N, T]."""
    n = len(responses)
    width = max(len(p) + len(r) for p, r in zip(prompt_ids, responses))
    t_max = max(1, max(map(len, responses)))
    ids = torch.full((n, width), pad, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    tok = torch.full((n, t_max), pad, dtype=torch.long)
    pos = torch.zeros((n, t_max), dtype=torch.long)
    mask = torch.zeros((n, t_max))
    for i, (p, r) in enumerate(zip(prompt_ids, responses)):
        seq = p + r
        ids[i, :len(seq)] = torch.tensor(seq)
        attn[i, :len(seq)] = 1
        if r:
            tok[i, :len(r)] = torch.tensor(r)
            pos[i, :len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
            mask[i, :len(r)] = 1
    return ids, attn, tok, pos, mask


def full_response_logprobs(model, ids, attn, tok, pos) -> torch.Tensor:
    """log π(y_t) of the response tokens [N, T] from the whole [N, W, V] logits of one
    forward, cast to fp32 before log-softmax: the reference `response_logprobs` equals, and
    the fallback for a model whose head cannot be applied on its own."""
    logits = model(input_ids=ids, attention_mask=attn).logits
    logits = logits.gather(1, pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    return torch.log_softmax(_at_least_fp32(logits), dim=-1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)


# post-head logit transforms that some architectures apply in their CausalLM forward and that
# `lm_head` alone would miss; soft-capping is applied here, the others fall back to the full path
_UNSUPPORTED_SCALES = ("logits_scaling", "logit_scale", "output_multiplier", "lm_head_multiplier")


def split_head(model):
    """(body, head) of a transformers causal LM such that logits = head(body(...).last_hidden_state),
    or None when the model does more after its head than bench knows (then the full path).
    `head` is `model.lm_head` as it is now (a format may have patched or replaced it), with
    the config's `final_logit_softcapping` (Gemma 2/3) applied when set. A tied head is the
    embedding's Parameter: its gradient reaches that one tensor from both uses."""
    cfg = getattr(model, "config", None)
    body = getattr(model, "base_model", None)
    head = getattr(model, "lm_head", None)
    if cfg is None or head is None or body is None or body is model:
        return None
    text = getattr(cfg, "text_config", None) or cfg
    for c in (cfg, text):
        if any(getattr(c, k, None) not in (None, 1, 1.0) for k in _UNSUPPORTED_SCALES):
            return None
    if any(getattr(m, "lm_head_multiplier", None) is not None for m in (model, body)):
        return None
    cap = getattr(text, "final_logit_softcapping", None)
    if not cap:
        return body, head

    def capped(h):
        return torch.tanh(head(h) / cap) * cap
    return body, capped


def _chunk_logprobs(head, h: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """log-softmax in fp32 of head(h) [N, c, V], at the tokens `tok` [N, c]."""
    return torch.log_softmax(_at_least_fp32(head(h)), dim=-1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)


def _vocab(model) -> int:
    cfg = model.config
    return getattr(cfg, "vocab_size", None) or getattr(getattr(cfg, "text_config", None), "vocab_size")


def _over_chunks(fn, model, ids, attn, tok, pos, *per_position, max_logit_elements: int | None = None,
                 chunk: int | None = None) -> list:
    """`fn(head, h, tok, *per_position)` over chunks of the response positions, one output per chunk:
    the body's hidden states at the response positions ([N, T, H]), then `chunk` positions at a time
    (default: as many as keep one chunk's logits within `max_logit_elements`, LOGIT_CHUNK_ELEMENTS
    unless given), each chunk recomputed in backward when grad flows (torch.utils.checkpoint), a
    single chunk not. A model whose head cannot be split off: one chunk of its whole logits, the
    identity as the head. `per_position` tensors [N, T, ...] are cut into the same chunks."""
    parts = split_head(model)
    if parts is None:
        logits = model(input_ids=ids, attention_mask=attn).logits
        return [fn(lambda x: x, logits.gather(1, pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1])), tok,
                   *per_position)]
    body, head = parts
    h = body(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
    h = h.gather(1, pos.unsqueeze(-1).expand(-1, -1, h.shape[-1]))          # [N, T, H]
    n, t = tok.shape
    if chunk is None:
        chunk = max(1, (max_logit_elements or LOGIT_CHUNK_ELEMENTS) // max(1, n * _vocab(model)))
    if chunk >= t:
        return [fn(head, h, tok, *per_position)]
    recompute = torch.is_grad_enabled() and h.requires_grad
    out = []
    for t0 in range(0, t, chunk):
        args = (head, h[:, t0:t0 + chunk], tok[:, t0:t0 + chunk], *(x[:, t0:t0 + chunk] for x in per_position))
        out.append(checkpoint(fn, *args, use_reentrant=False) if recompute else fn(*args))
    return out


def response_logprobs(model, ids, attn, tok, pos, max_logit_elements: int | None = None,
                      chunk: int | None = None) -> torch.Tensor:
    """log π(y_t) of the response tokens [N, T] (ids/attn [N, W]; tok, pos [N, T] from `pack`):
    `lm_head` and fp32 log-softmax a chunk of positions at a time (`_over_chunks`). Equal to
    `full_response_logprobs` (same bits per chunk on CPU), with or without grad."""
    if split_head(model) is None:
        return full_response_logprobs(model, ids, attn, tok, pos)
    return torch.cat(_over_chunks(_chunk_logprobs, model, ids, attn, tok, pos, max_logit_elements=max_logit_elements,
                                  chunk=chunk), dim=1)


def _chunk_logprobs_entropy(head, h: torch.Tensor, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_chunk_logprobs` (the same bits) and the entropy −Σ_v p_v log p_v of each position."""
    lp = torch.log_softmax(_at_least_fp32(head(h)), dim=-1)
    return lp.gather(-1, tok.unsqueeze(-1)).squeeze(-1), -(lp.exp() * lp).sum(-1)


def _cat_pairs(out: list) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([a for a, _ in out], dim=1), torch.cat([b for _, b in out], dim=1)


@torch.no_grad()
def response_logprobs_entropy(model, ids, attn, tok, pos,
                              max_logit_elements: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(y_t), H_t) of the response tokens [N, T], no grad: log π exactly as
    `response_logprobs` computes it (same chunks, same bits) and the entropy H_t of the whole
    distribution at each position, from the same fp32 log-softmax (the calibration gate's
    reference forward, bench/calibration.py)."""
    return _cat_pairs(_over_chunks(_chunk_logprobs_entropy, model, ids, attn, tok, pos,
                                   max_logit_elements=max_logit_elements))


@torch.no_grad()
def response_log_softmax(model, ids, attn, pos) -> torch.Tensor:
    """The whole fp32 log-softmax at every response position [N, T, V], no grad: the rows
    `response_logprobs` gathers its sampled tokens from (the same head, the same fp32
    log-softmax, so the same bits at those tokens on a CPU). [N, T, V] at once: for a full
    vocabulary only on small batches (`bench check`): `_over_chunks` with one chunk of every position."""

    def whole(head, h, _tok):
        return torch.log_softmax(_at_least_fp32(head(h)), dim=-1)
    return _over_chunks(whole, model, ids, attn, pos, pos, chunk=pos.shape[1])[0]


def _chunk_logprobs_centered(head, h: torch.Tensor, tok: torch.Tensor, logq: torch.Tensor,
                             hi: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`_chunk_logprobs` (the same bits) and Score Centering's term at each position,
    center = Σ_v sg(q_v · min(p_v/q_v, hi)) · log p_v, p = softmax(head(h)) in fp32, q = exp(logq)
    [N, c, V] (μ's recorded distribution), both over the whole vocabulary of the chunk's rows."""
    lp = torch.log_softmax(_at_least_fp32(head(h)), dim=-1)
    q = logq.to(lp.device, lp.dtype).exp()
    c = (q * sc_weights(lp, logq.to(lp.device, lp.dtype), hi)).detach()
    return lp.gather(-1, tok.unsqueeze(-1)).squeeze(-1), (c * lp).sum(-1)


def response_logprobs_centered(model, ids, attn, tok, pos, logq: torch.Tensor, hi: float,
                               max_logit_elements: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(y_t), center_t) of the response tokens [N, T], with grad: log π exactly as
    `response_logprobs` computes it (same chunks of positions, same bits) and Score Centering's
    Σ_v sg(μ_v w_v) log π(v) from the same fp32 log-softmax (`_chunk_logprobs_centered`), each chunk
    recomputed in backward. `logq` [N, T, V]: μ's log-distribution at each response position."""
    return _cat_pairs(_over_chunks(partial(_chunk_logprobs_centered, hi=hi), model, ids, attn, tok, pos, logq,
                                   max_logit_elements=max_logit_elements))
