"""The built-in engine: sampling math by hand, seeds independent of batching, μ equal to the
training engine's full-sequence log-probs in fp32."""

import math

import pytest
import torch

from bench.engines import Sampling, make_engine
from bench.engines.torch_engine import inverse_cdf_sample, sampling_logprobs
from bench.models import TINY_MATH_DIR


def test_sampling_logprobs_temperature_and_top_p_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    lp = sampling_logprobs(logits, 1.0, 1.0)
    assert torch.allclose(lp.exp(), torch.tensor([[0.5, 0.3, 0.15, 0.05]]), atol=1e-6)
    lp = sampling_logprobs(logits, 1.0, 0.8)          # nucleus {0.5, 0.3} reaches 0.8
    assert torch.allclose(lp.exp(), torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    lp = sampling_logprobs(logits, 1.0, 0.81)         # needs the third token too
    assert torch.allclose(lp.exp(), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95, atol=1e-6)
    lp = sampling_logprobs(logits, 2.0, 1.0)          # p^(1/2) renormalised
    p = torch.tensor([0.5, 0.3, 0.15, 0.05]).sqrt()
    assert torch.allclose(lp.exp()[0], p / p.sum(), atol=1e-6)


def test_inverse_cdf_sample():
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.2]] * 4))
    u = torch.tensor([0.0, 0.49, 0.51, 0.99])
    assert inverse_cdf_sample(lp, u).tolist() == [0, 0, 1, 2]


@pytest.fixture(scope="module")
def engine():
    e = make_engine("torch", str(TINY_MATH_DIR), "fp32", max_batch=16)
    yield e
    e.close()


PROMPTS = ["Q: Compute 23+45.\nA: ", "Q: Compute 7*8-10.\nA: ", "Q: Compute 9-31.\nA: "]


def test_samples_do_not_depend_on_batching(engine):
    sp = Sampling(max_tokens=40, seed=7)
    together = engine.generate(PROMPTS, 4, sp)
    alone = [engine.generate([p], 4, sp)[0] for p in PROMPTS]
    assert [[s.token_ids for s in r] for r in together] == [[s.token_ids for s in r] for r in alone]
    other_seed = engine.generate(PROMPTS, 4, Sampling(max_tokens=40, seed=8))
    assert [[s.token_ids for s in r] for r in together] != [[s.token_ids for s in r] for r in other_seed]


def test_mu_matches_full_forward_in_fp32(engine):
    tok, model = engine.tokenizer, engine.model
    samples = engine.generate(PROMPTS, 3, Sampling(max_tokens=40, seed=1))
    for prompt, row in zip(PROMPTS, samples):
        p = tok.encode(prompt)
        for s in row:
            ids = torch.tensor([p + s.token_ids])
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits[0].float(), -1)
            ref = lp[len(p) - 1:-1].gather(-1, torch.tensor(s.token_ids).unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(ref, torch.tensor(s.logprobs), atol=1e-4)
            assert s.finish_reason == "stop" and s.token_ids[-1] == tok.eos_token_id
            assert "<eos>" not in s.text and s.text == tok.decode(s.token_ids[:-1])


def test_length_finish_and_top_p_logprobs(engine):
    (row,) = engine.generate(PROMPTS[:1], 2, Sampling(max_tokens=3, seed=0))
    assert all(s.finish_reason == "length" and len(s.token_ids) == 3 for s in row)
    (row,) = engine.generate(PROMPTS[:1], 4, Sampling(max_tokens=20, top_p=0.5, seed=0))
    assert all(all(lp <= 0 and math.isfinite(lp) for lp in s.logprobs) for s in row)


def test_update_weights_changes_samples(engine):
    import copy

    e2 = make_engine("torch", str(TINY_MATH_DIR), "bf16", model=copy.deepcopy(engine.model),
                     tokenizer=engine.tokenizer)
    named = [(n, torch.zeros_like(p)) for n, p in engine.model.named_parameters() if n.endswith("embed_tokens.weight")]
    e2.update_weights(named)
    assert e2.model.model.embed_tokens.weight.abs().sum() == 0
    assert e2.model.model.embed_tokens.weight.dtype == torch.bfloat16


def test_start_continues_the_sample_sequence(engine):
    sp = Sampling(max_tokens=40, seed=5)
    whole = engine.generate(PROMPTS, 6, sp)
    tail = engine.generate(PROMPTS, 3, sp, start=3)
    assert [[s.token_ids for s in r[3:]] for r in whole] == [[s.token_ids for s in r] for r in tail]
