"""Tensors of the training engine: a batch of prompt + response ids packed for one forward,
and log π of the sampled response tokens."""

from __future__ import annotations

import torch


# ------------------------------------------------------------------ tensors

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


def response_logprobs(model, ids, attn, tok, pos) -> torch.Tensor:
    """log π(y_t) of the response tokens [N, T]: logits cast to fp32 before log-softmax."""
    logits = model(input_ids=ids, attention_mask=attn).logits
    logits = logits.gather(1, pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
