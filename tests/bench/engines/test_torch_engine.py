"""The built-in engine: sampling math by hand, seeds independent of batching, μ equal to the
training engine's full-sequence log-probs in fp32."""

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


def test_top_p_one_is_no_nucleus_at_all():
    """top_p = 1 samples from the whole softmax, bit for bit (vLLM's "no top-p"): through the
    nucleus code, fp32's cumulative sum reaches 1 before the tail and drops its smallest tokens
    (9 of 64 × 85 here), and renormalising moves every log-prob by up to ~5e-7."""
    logits = torch.randn(64, 85, generator=torch.Generator().manual_seed(0)) * 3
    lp = sampling_logprobs(logits, 1.0, 1.0)
    assert torch.equal(lp, torch.log_softmax(logits, -1)) and torch.isfinite(lp).all()


def test_inverse_cdf_sample():
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.2]] * 4))
    u = torch.tensor([0.0, 0.49, 0.51, 0.99])
    assert inverse_cdf_sample(lp, u).tolist() == [0, 0, 1, 2]
    # weights that do not sum to 1 are sampled in proportion (u scales the cdf's total)
    w = torch.log(torch.tensor([[1.0, 1.0, 2.0]] * 3))
    assert inverse_cdf_sample(w, torch.tensor([0.2, 0.3, 0.6])).tolist() == [0, 1, 2]


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


def test_the_head_sees_one_position_per_row(engine):
    """The prefill takes the logits of each prompt's last position only (`logits_to_keep=1`): a
    [rows, prompt width, vocabulary] head output would not fit for a real model's vocabulary.
    Every call of the output head, prefill and decode steps alike, sees one position a row, and
    there is one call per sampled position: none after the last token."""
    widths = []
    with engine.model.get_output_embeddings().register_forward_hook(
            lambda mod, args, out: widths.append(args[0].shape[-2])):
        samples = engine.generate(PROMPTS, 2, Sampling(max_tokens=4, seed=1))
    assert set(widths) == {1} and len(widths) == max(len(s.token_ids) for row in samples for s in row) == 4


def test_by_default_a_prompt_is_prefilled_once_and_nothing_extra_is_kept(engine):
    """The defaults: a prompt's n samples share one prefill (the body sees the distinct prompts),
    no sync statistics, distributions or routes are kept, padding is the tokenizer's."""
    rows = []
    with engine.model.get_input_embeddings().register_forward_hook(lambda mod, args, out: rows.append(args[0].shape)):
        out = engine.generate(PROMPTS, 2, Sampling(max_tokens=2, seed=1))
    assert all(s.distributions is None and s.routes is None for row in out for s in row)
    assert rows[0][0] == len(PROMPTS) and all(r == (2 * len(PROMPTS), 1) for r in rows[1:])
    assert (engine.share_prompts, engine.track_updates, engine.record_routes) == (True, False, False)
    assert engine.pad == engine.tokenizer.pad_token_id == 0 != engine.eos


def test_a_training_model_samples_in_eval_mode_and_is_given_back_training(engine):
    seen = []
    engine.model.train()
    try:
        with engine.model.register_forward_pre_hook(lambda mod, args: seen.append(mod.training)):
            engine.generate(PROMPTS[:1], 1, Sampling(max_tokens=2, seed=1))
        assert engine.model.training and seen and not any(seen)
    finally:
        engine.model.eval()
    engine.generate(PROMPTS[:1], 1, Sampling(max_tokens=2, seed=1))
    assert not engine.model.training


def test_recorded_distributions_are_what_each_token_was_drawn_from(engine):
    """`record_distributions`: a sample carries [T, V] log-probs, one row per token, each the
    distribution its token was drawn from (its log-prob read off it; every row sums to 1)."""
    e = make_engine("torch", str(TINY_MATH_DIR), "fp32", model=engine.model, tokenizer=engine.tokenizer,
                    prepared=True, record_distributions=True)
    out = e.generate(PROMPTS, 2, Sampling(max_tokens=6, seed=4))
    for s in (s for row in out for s in row):
        d = s.distributions
        assert d.shape == (len(s.token_ids), len(engine.tokenizer))
        assert torch.equal(d.gather(-1, torch.tensor(s.token_ids).unsqueeze(-1)).squeeze(-1), torch.tensor(s.logprobs))
        assert torch.allclose(d.exp().sum(-1), torch.ones(len(s.token_ids)), atol=1e-5)


def test_positions_count_from_zero_at_each_prompts_first_token(engine):
    """Left-padded prompts: each prompt's tokens sit at positions 0 … len − 1 (its padding at
    0, masked), and each decode step one further, as a forward of the prompt alone numbers them."""
    seen = []
    with engine.model.register_forward_pre_hook(lambda mod, args, kw: seen.append(kw["position_ids"].clone()),
                                                with_kwargs=True):
        engine.generate(PROMPTS[:2], 1, Sampling(max_tokens=2, seed=1))
    lens = [len(engine.tokenizer.encode(p, add_special_tokens=False)) for p in PROMPTS[:2]]
    width = max(lens)
    rows = sorted(range(2), key=lambda i: lens[i])          # the engine orders rows by prompt length
    expect = torch.stack([torch.cat([torch.zeros(width - lens[i], dtype=torch.long), torch.arange(lens[i])])
                          for i in rows])
    assert torch.equal(seen[0].cpu(), expect)
    assert torch.equal(seen[1].cpu(), torch.tensor([[lens[i]] for i in rows]))


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


def _full_forward_logits(engine, prompt, s):
    """fp32 logits at each response position, from one forward over prompt + response."""
    p = engine.tokenizer.encode(prompt)
    with torch.no_grad():
        logits = engine.model(torch.tensor([p + s.token_ids])).logits[0].float()
    return logits[len(p) - 1:-1]


def test_length_finish_and_top_p_logprobs(engine):
    (row,) = engine.generate(PROMPTS[:1], 2, Sampling(max_tokens=3, seed=0))
    assert all(s.finish_reason == "length" and len(s.token_ids) == 3 for s in row)
    # top-p 0.5 at temperature 0.7: μ is the processed distribution's log-prob at the token,
    # every token lies in its nucleus, and μ is above the raw log-prob wherever the nucleus
    # leaves tokens out (μ − raw = −log(nucleus mass) > 0)
    T, top_p = 0.7, 0.5
    samples = engine.generate(PROMPTS, 4, Sampling(max_tokens=20, temperature=T, top_p=top_p, seed=0))
    raised = 0
    for prompt, row in zip(PROMPTS, samples):
        for s in row:
            logits = _full_forward_logits(engine, prompt, s)
            tok = torch.tensor(s.token_ids).unsqueeze(-1)
            processed = sampling_logprobs(logits, T, top_p).gather(-1, tok).squeeze(-1)
            raw = torch.log_softmax(logits / T, -1).gather(-1, tok).squeeze(-1)
            assert torch.isfinite(processed).all()                               # in the nucleus
            assert torch.allclose(torch.tensor(s.logprobs), processed, atol=1e-4)
            raised += int((processed - raw > 1e-3).sum())
    assert raised >= 10          # the nucleus cut tokens at many positions (24 here): the check has teeth
    # no nucleus: μ is log_softmax(logits / T), not the T = 1 log-prob
    samples = engine.generate(PROMPTS, 2, Sampling(max_tokens=20, temperature=T, seed=1))
    for prompt, row in zip(PROMPTS, samples):
        for s in row:
            logits = _full_forward_logits(engine, prompt, s)
            tok = torch.tensor(s.token_ids).unsqueeze(-1)
            assert torch.allclose(torch.tensor(s.logprobs),
                                  torch.log_softmax(logits / T, -1).gather(-1, tok).squeeze(-1), atol=1e-4)


def test_update_weights_changes_samples(engine):
    """Zeroing the (tied) embedding through update_weights zeroes the logits too: every token
    is then drawn uniformly, μ = −log V, and the samples differ from the model's own."""
    import copy
    import math

    e2 = make_engine("torch", str(TINY_MATH_DIR), "bf16", model=copy.deepcopy(engine.model),
                     tokenizer=engine.tokenizer)
    sp = Sampling(max_tokens=8, seed=3)
    before = e2.generate(PROMPTS, 2, sp)
    named = [(n, torch.zeros_like(p)) for n, p in engine.model.named_parameters() if n.endswith("embed_tokens.weight")]
    assert len(named) == 1
    e2.update_weights(named)
    assert e2.model.model.embed_tokens.weight.abs().sum() == 0
    assert e2.model.model.embed_tokens.weight.dtype == torch.bfloat16
    after = e2.generate(PROMPTS, 2, sp)
    vocab = e2.model.config.vocab_size
    assert all(lp == pytest.approx(-math.log(vocab), abs=1e-5) for row in after for s in row for lp in s.logprobs)
    assert [[s.token_ids for s in r] for r in after] != [[s.token_ids for s in r] for r in before]


def test_start_continues_the_sample_sequence(engine):
    sp = Sampling(max_tokens=40, seed=5)
    whole = engine.generate(PROMPTS, 6, sp)
    tail = engine.generate(PROMPTS, 3, sp, start=3)
    assert [[s.token_ids for s in r[3:]] for r in whole] == [[s.token_ids for s in r] for r in tail]
