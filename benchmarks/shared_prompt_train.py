"""A prototype, not a product path: the training forward + backward of the demo's step with each
prompt computed once for its G responses ("shared prompt"), against the trainer's packed rows
(every row carries its own copy of its prompt), on one step's batch: tiny-math, pg-seq-is,
64 prompts × 8 responses, fp32, one torch thread.

    python benchmarks/shared_prompt_train.py [--repeats 5] [--prompts-per-pass 16] [--threads 1] [--dtype fp16]

Packed (the trainer's arithmetic): the rows cut as `TrainingEngine.parts` cuts them (grouped by
length), each part one forward of prompt + response and the backward of Σ log π(y_t).
Shared: per pass, the prompts of its rows run forward once with their KV cache kept (with grad);
the cache is indexed to the pass's rows (`DynamicCache.batch_select_indices`, whose backward sums
the rows' gradients into the prompt's keys and values); the responses run forward
on it (explicit positions, the prompt's padding masked); log π(y_0) comes from the prompt's last
hidden state, log π(y_t) from the response's hidden state at t − 1. The same function of the
weights: the script prints the largest difference of log π and of the gradient (relative to its
norm) beside the times, and, as the yardstick, how far the trainer's own cut moves them (one
padded batch against the grouped parts). Three cuts: whole prompts a pass; rows by response
length (a prompt computed once in each pass its rows fall in); the same with each row's keys in
the packed row's order (prompt, response, padding: `_packed_layout`, a 4-D mask) instead of the
cache's (prompt, its padding, response), in the hope that 16-bit reductions then sum the same
terms in the same places (the key widths and GEMM shapes still differ: measured, not guaranteed).
All run in turn, `--repeats` times; the fastest of each. A CPU prototype (its index tensors are
built on the CPU).

What it measures is the lever, not a change: prompt tokens are computed G times in the packed
rows, once here. A product path would also need MoE route recording and replay (the trainer
records routes at every packed position), sc's centering term, the head's vocabulary chunks,
micro-batch budgets, gradient checkpointing (which turns the cache off) and the equivalence
protocol (docs/development.md)."""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch

from bench.provenance import cpu_summary
from runners.logprobs import _chunk_logprobs, response_logprobs, split_head


def packed_pass(model, batch, parts) -> torch.Tensor:
    """Σ over the trainer's parts of forward + backward of Σ_t log π(y_t); log π [N, T]."""
    out = torch.zeros_like(batch.mask)
    for part in parts:
        ids, attn, tok, pos, m = batch.rows(part)
        lp = response_logprobs(model, ids, attn, tok, pos) * m
        lp.sum().backward()
        out[torch.tensor(part), :m.shape[1]] = lp.detach()
    return out


def _packed_layout(cache, plen: torch.Tensor, wp: int, wr: int) -> None:
    """Make each layer of `cache` (the prompts' keys and values [n, h, wp, d], a row's prompt in
    its first plen_i slots) lay a row's keys out as a packed row does after the response's
    update: its prompt, its response, then the padding, [n, h, wp + wr, d] (a gather, so the
    gradient reaches the prompt's keys)."""
    n = plen.shape[0]
    k = torch.arange(wp + wr)[None].expand(n, -1)
    resp = k - plen[:, None]                              # response slot of key k, where ≥ 0
    pad_slot = k - wr                                     # the prompt's padding after the response
    src = torch.where(k < plen[:, None], k, torch.where(resp < wr, wp + resp, pad_slot))

    def update(layer, key_states, value_states, *args, **kwargs):
        keys, values = torch.cat([layer.keys, key_states], -2), torch.cat([layer.values, value_states], -2)
        idx = src[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[-1])
        return keys.gather(2, idx), values.gather(2, idx)
    for layer in cache.layers:
        layer.update = partial(update, layer)


def shared_pass(model, prompt_ids: list[list[int]], responses: list[list[int]], g: int, parts: list[list[int]],
                pad: int, t_max: int, layout: str = "prompt, padding, response") -> torch.Tensor:
    """The same Σ_t log π(y_t) and its backward, one pass per part of rows (row i answers prompt
    i // g), each prompt of a part run forward once (module doc). log π [N, t_max]. `layout` of a
    row's keys in the response's attention: "prompt, padding, response" (the cache as
    transformers extends it, a 2-D mask) or "packed" (`_packed_layout`, a 4-D mask: the packed
    row's own order of keys, so its reductions sum the same terms in the same places)."""
    from transformers import DynamicCache

    body, head = split_head(model)
    if layout == "packed" and model.config._attn_implementation not in ("sdpa", "bench_upcast"):
        raise ValueError("the packed layout's 4-D boolean mask is read as a mask by sdpa and bench's upcast "
                         f"attention only, not by {model.config._attn_implementation!r}")
    out = torch.zeros(len(responses), t_max, dtype=torch.promote_types(next(model.parameters()).dtype, torch.float32))
    for part in parts:
        ps = sorted({i // g for i in part})
        assert all(prompt_ids[p] for p in ps), "an empty prompt has no last token to predict y_0 from"
        which = torch.tensor([ps.index(i // g) for i in part])              # row → its prompt in this pass
        rs = [responses[i] for i in part]
        wp, wr = max(len(prompt_ids[p]) for p in ps), max(1, max(map(len, rs)))
        pids = torch.full((len(ps), wp), pad)
        pattn = torch.zeros((len(ps), wp), dtype=torch.long)
        for k, p in enumerate(ps):
            pids[k, :len(prompt_ids[p])], pattn[k, :len(prompt_ids[p])] = torch.tensor(prompt_ids[p]), 1
        cache = DynamicCache(config=model.config)
        hp = body(input_ids=pids, attention_mask=pattn, past_key_values=cache, use_cache=True).last_hidden_state
        cache.batch_select_indices(which)
        plen = pattn.sum(1)[which]
        rids = torch.full((len(rs), wr), pad)
        rattn = torch.zeros((len(rs), wr), dtype=torch.long)
        for k, r in enumerate(rs):
            if r:
                rids[k, :len(r)], rattn[k, :len(r)] = torch.tensor(r), 1
        attn = torch.cat([pattn[which], rattn], 1)
        positions = plen[:, None] + torch.arange(wr)[None]
        if layout == "packed":
            _packed_layout(cache, plen, wp, wr)
            key = torch.arange(wp + wr)[None, None]
            attn = ((key <= positions[:, :, None]) & (key < (plen + rattn.sum(1))[:, None, None]))[:, None]
        hr = body(input_ids=rids, attention_mask=attn, position_ids=positions, past_key_values=cache,
                  use_cache=True).last_hidden_state
        first = hp[which, plen - 1]                                                     # [n, H]: predicts y_0
        h = torch.cat([first[:, None], hr[:, :wr - 1]], 1)                              # [n, wr, H]
        lp = _chunk_logprobs(head, h, rids) * rattn
        lp.sum().backward()
        out[torch.tensor(part), :wr] = lp.detach()
    return out


def by_prompt(n_prompts: int, g: int, per_pass: int) -> list[list[int]]:
    """Parts of `per_pass` whole prompts each (every prompt in one pass: computed once a step)."""
    return [list(range(p0 * g, min(n_prompts, p0 + per_pass) * g)) for p0 in range(0, n_prompts, per_pass)]


def by_response_length(lengths: list[int], n_parts: int) -> list[list[int]]:
    """The rows sorted by response length and cut into `n_parts` equal parts: little response
    padding, a prompt computed once in each pass where its rows fall."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    k = -(-len(order) // n_parts)
    return [order[i:i + k] for i in range(0, len(order), k)]


def grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def main() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from microbatch_cost import first_step

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts-per-pass", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="fp32", help="the training format (rollouts in the same): fp32, or fp16 "
                                                    "as the demo's positive control trains")
    a = ap.parse_args()
    t, idx, batch = first_step(a.dtype, a.threads)
    g = t.cfg.samples_per_prompt
    model = t.learner.compute
    prompt_ids = [t.prompt_ids[i] for i in idx]
    responses = [batch.tok[i, :n].tolist() for i, n in enumerate(batch.response_lengths)]
    parts = t.learner.parts(list(range(len(responses))), batch)
    t_max = batch.tok.shape[1]
    by_len = by_response_length(batch.response_lengths, len(parts))
    shared_parts = {"shared, whole prompts": by_prompt(len(prompt_ids), g, a.prompts_per_pass),
                    "shared, by response length": by_len, "shared, by response length, packed layout": by_len}
    times = {"packed": [], **{k: [] for k in shared_parts}}
    lps, gs = {}, {}
    for _ in range(a.repeats):
        for name in times:
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            lp = (packed_pass(model, batch, parts) if name == "packed" else
                  shared_pass(model, prompt_ids, responses, g, shared_parts[name], t.tok.pad_token_id, t_max,
                              "packed" if "packed layout" in name else "prompt, padding, response"))
            times[name].append(time.perf_counter() - t0)
            lps[name], gs[name] = lp, grads(model)
    # the yardstick: how far the trainer's own cut moves log π and the gradient (one padded batch
    # against the grouped parts: `--no-group-by-length`), arithmetic the runs already accept
    model.zero_grad(set_to_none=True)
    lp_one = packed_pass(model, batch, [list(range(len(responses)))])
    d_one = ((lp_one - lps["packed"]).abs().max().item(),
             ((grads(model) - gs["packed"]).norm() / gs["packed"].norm()).item())
    real_prompt = sum(len(p) for p in prompt_ids) * g
    real_resp = sum(batch.response_lengths)
    best = {k: min(v) for k, v in times.items()}
    print(f"training forward + backward of one step's batch, tiny-math, 64 × {g}, {a.dtype}, {a.threads} thread(s), "
          f"fastest of {a.repeats} in turn; {cpu_summary()}")
    print(f"  tokens: prompts {real_prompt} (each of {len(prompt_ids)} prompts {g} times), responses {real_resp}; "
          f"shared computes the prompts once: {real_prompt // g + real_resp} tokens "
          f"({(real_prompt // g + real_resp) / (real_prompt + real_resp):.2f}× the packed rows' real ones)")
    print(f"  packed ({len(parts)} parts, grouped by length): {best['packed']:.3f} s; as one padded batch instead: "
          f"max |Δ log π| {d_one[0]:.2e}, |Δ gradient| / |gradient| {d_one[1]:.2e} (the trainer's own cut)")
    for name, sp in shared_parts.items():
        computed = sum(len({i // g for i in part}) for part in sp)
        dlp = (lps[name] - lps["packed"]).abs().max().item()
        dg = ((gs[name] - gs["packed"]).norm() / gs["packed"].norm()).item()
        print(f"  {name} ({len(sp)} passes, {computed} prompt forwards): {best[name]:.3f} s, "
              f"ratio to packed {best[name] / best['packed']:.2f}; max |Δ log π| {dlp:.2e}, "
              f"|Δ gradient| / |gradient| {dg:.2e}")
    t.close()


if __name__ == "__main__":
    main()
