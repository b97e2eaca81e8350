"""benchmarks/shared_prompt_train.py's prototype computes what the trainer's packed rows compute:
log π of every response token and the gradient of their sum, each prompt run once for its rows
(in float64: log π to 1e-10, the gradient to fp32's rounding, where transformers' RMSNorm
computes), on tiny-math (a dense Llama), tiny-math-moe (Mixtral: the experts' per-token
dispatch; in fp32, to its rounding) and a random Llama with grouped KV heads, with prompts of
different lengths, an empty response and passes that split a prompt's rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from bench.models import load_model, resolve_model
from runners.train_engine import Batch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("shared_prompt_train", ROOT / "benchmarks" / "shared_prompt_train.py")
spt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spt)

pytestmark = pytest.mark.slow          # seconds a case (models in float64): in the full suite, not --quick

G = 3


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=120, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
                                        tie_word_embeddings=True))


def _case(vocab: int):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, vocab, (n,), generator=g).tolist() for n in (5, 9, 3)]
    responses = [torch.randint(2, vocab, (n,), generator=g).tolist() for n in (4, 7, 1, 6, 0, 2, 8, 3, 5)]
    return prompts, responses


def _grad(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("which", ["tiny-math", "tiny-math-moe", "llama"])
@pytest.mark.parametrize("cut,layout", [("whole prompts", "prompt, padding, response"),
                                        ("by response length", "prompt, padding, response"),
                                        ("by response length", "packed")])
def test_each_prompt_once_is_the_packed_rows_function(which, cut, layout):
    model = _llama() if which == "llama" else load_model(resolve_model(which))
    # transformers' grouped expert GEMM takes no float64: the MoE model in fp32, to fp32's rounding
    exact = which != "tiny-math-moe"
    model = model.double() if exact else model.float()
    prompts, responses = _case(model.config.vocab_size)
    batch = Batch.pack([p for p in prompts for _ in range(G)], responses, pad=0)
    batch.mask = batch.mask.to(next(model.parameters()).dtype)
    rows = list(range(len(responses)))
    model.zero_grad(set_to_none=True)
    packed = spt.packed_pass(model, batch, [rows[:4], rows[4:]])
    g_packed = _grad(model)
    parts = spt.by_prompt(len(prompts), G, 2) if cut == "whole prompts" else spt.by_response_length(
        batch.response_lengths, 2)
    if cut == "by response length":
        assert sum(len({i // G for i in part}) for part in parts) > len(prompts)     # a prompt in both passes
    model.zero_grad(set_to_none=True)
    shared = spt.shared_pass(model, prompts, responses, G, parts, 0, batch.tok.shape[1], layout)
    g_shared = _grad(model)
    assert shared.shape == packed.shape and torch.all(shared[4] == 0)              # the empty response
    assert torch.allclose(shared, packed.to(shared.dtype), atol=1e-10 if exact else 2e-5, rtol=0)
    # transformers' RMSNorm computes in fp32 even in a float64 model, and its backward rounds the
    # gradient there: the prompt's gradient summed over its rows before the norm's backward (shared)
    # or after it (packed) agree to fp32's rounding, ~6e-8 of the gradient here, not to float64's
    assert ((g_shared - g_packed).norm() / g_packed.norm()).item() < (1e-6 if exact else 2e-5)
