"""Memory-lean log-probs (runners/logprobs.py): the chunked function against the full-logits
one, values and gradients, in every training format; it never builds more than one chunk of
logits; soft-capping is kept; models bench cannot split fall back to the full path."""

from __future__ import annotations

import copy

import pytest
import torch

from bench.models import load_model, resolve_model
from bench.model_formats import prepare_compute_model
from runners.logprobs import full_response_logprobs, pack, response_logprobs, split_head


def _batch(vocab: int, n: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(2, vocab, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    responses = [torch.randint(2, vocab, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(n)]
    return pack(prompts, responses, 0)


@pytest.fixture(scope="module")
def tiny():
    return load_model(resolve_model("tiny-math"))


def _qwen2(vocab=300, tied=False, **extra):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tied, **extra)
    return Qwen2ForCausalLM(cfg).float()


def assert_grads_close(got: dict, ref: dict, tol: float = 1e-6) -> None:
    """Every gradient within tol of the reference, relative to the largest reference gradient
    of that tensor (the fp32 sums of a chunked head run in another order: float64 agrees to
    1e-14, fp32 to ~4e-8 of the scale)."""
    assert got.keys() == ref.keys()
    for name, r in ref.items():
        scale = max(1.0, r.float().abs().max().item())
        diff = (got[name].float() - r.float()).abs().max().item()
        assert diff <= tol * scale, (name, diff, scale)


def _grads(model, fn, ids, attn, tok, pos, mask, weights):
    model.zero_grad(set_to_none=True)
    lp = fn(model, ids, attn, tok, pos)
    (lp * mask * weights).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk", [1, 4, 7, None])
def test_chunked_equals_full_fp32_values_and_gradients(tiny, chunk):
    model = copy.deepcopy(tiny).train()
    ids, attn, tok, pos, mask = _batch(85)
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
    ref, g_ref = _grads(model, full_response_logprobs, ids, attn, tok, pos, mask, weights)
    got, g_got = _grads(model, lambda *a: response_logprobs(*a, chunk=chunk), ids, attn, tok, pos, mask, weights)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    assert_grads_close(g_got, g_ref)
    with torch.no_grad():
        torch.testing.assert_close(response_logprobs(model, ids, attn, tok, pos, chunk=chunk), ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "bf16+head32", "fp8"])
def test_chunked_equals_full_in_every_training_format(tiny, fmt):
    """A format's patched or fp32 lm_head is what the chunks call: same values as the full
    forward of the same compute copy (the same bits per chunk on a CPU)."""
    model = prepare_compute_model(copy.deepcopy(tiny), fmt)
    ids, attn, tok, pos, mask = _batch(85, seed=2)
    with torch.no_grad():
        ref = full_response_logprobs(model, ids, attn, tok, pos)
        for chunk in (3, None):
            torch.testing.assert_close(response_logprobs(model, ids, attn, tok, pos, chunk=chunk), ref,
                                       rtol=0, atol=1e-6)
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3))
    _, g_ref = _grads(model, full_response_logprobs, ids, attn, tok, pos, mask, weights)
    _, g_got = _grads(model, lambda *a: response_logprobs(*a, chunk=5), ids, attn, tok, pos, mask, weights)
    assert_grads_close(g_got, g_ref, tol=1e-2)   # 16-bit gradients, summed over chunks in another order


@pytest.mark.parametrize("tied", [False, True])
def test_qwen2_untied_and_tied(tied):
    model = _qwen2(tied=tied).train()
    ids, attn, tok, pos, mask = _batch(300, seed=4)
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(5))
    ref, g_ref = _grads(model, full_response_logprobs, ids, attn, tok, pos, mask, weights)
    got, g_got = _grads(model, lambda *a: response_logprobs(*a, chunk=6), ids, attn, tok, pos, mask, weights)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    assert_grads_close(g_got, g_ref)


def test_never_more_than_one_chunk_of_logits(tiny):
    """The head sees at most `max_logit_elements` logits at a time, with and without grad,
    where the whole batch would be many times that."""
    model = copy.deepcopy(tiny)
    ids, attn, tok, pos, mask = _batch(85, n=16, seed=6)
    budget = 16 * 85 * 4                          # 4 positions of 16 rows
    assert tok.numel() * 85 > 5 * budget
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, a, out: seen.append(out.numel()))
    try:
        lp = response_logprobs(model, ids, attn, tok, pos, max_logit_elements=budget)
        lp.sum().backward()
        with torch.no_grad():
            response_logprobs(model, ids, attn, tok, pos, max_logit_elements=budget)
    finally:
        hook.remove()
    assert seen and max(seen) <= budget


def test_soft_capping_is_applied():
    """Gemma 2's final_logit_softcapping happens after lm_head in its CausalLM forward."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                       final_logit_softcapping=2.0)
    model = Gemma2ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(50)             # logits well past the cap
    ids, attn, tok, pos, mask = _batch(200, n=6, seed=7)
    with torch.no_grad():
        ref = full_response_logprobs(model, ids, attn, tok, pos)
        torch.testing.assert_close(response_logprobs(model, ids, attn, tok, pos, chunk=3), ref, rtol=0, atol=1e-5)


def test_unknown_logit_scaling_falls_back_to_the_full_path():
    model = _qwen2()
    assert split_head(model) is not None
    model.config.logit_scale = 0.5                # an architecture that rescales after its head
    assert split_head(model) is None
    ids, attn, tok, pos, mask = _batch(300, n=3, seed=8)
    with torch.no_grad():
        torch.testing.assert_close(response_logprobs(model, ids, attn, tok, pos),
                                   full_response_logprobs(model, ids, attn, tok, pos), rtol=0, atol=0)
