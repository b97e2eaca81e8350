"""Micro-batches by a token budget (runners/train_engine.py): for every algorithm the summed
gradient of the micro-batches equals the whole mini-batch's: to 1e-6 of the gradient's scale
in fp32 when the parts keep the batch's padded width (the same arithmetic per row), to 1e-10
in float64 when they are trimmed to their own rows, and trimmed in fp32 within the rounding by
which fp32 itself misses float64; so does the optimizer step; π_old filled in by the
micro-batches equals the whole forward's; activation checkpointing changes no gradient; the
parts respect the budget."""

from __future__ import annotations

import copy

import pytest
import torch

from bench.models import load_model, resolve_model
from bench.algorithms import SPECS
from runners.algos import REGISTRY, LossInputs, get_loss
from runners.logprobs import response_log_softmax
from runners.presets import get_preset
from runners.train_engine import Batch, TrainingEngine

from conftest import QUICK_ALGOS, quick_sample


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model(resolve_model("tiny-math"))


def make_batch(n: int = 16, empty: bool = False, seed: int = 0, trim: bool = True, dtype=torch.float32) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(2, 85, (int(torch.randint(3, 14, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    responses = [torch.randint(2, 85, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(n)]
    if empty:
        responses[3] = []                    # GSPO averages over sequences with >= 1 token only
    b = Batch.pack(prompts, responses, 0)
    b.trim, b.mask = trim, b.mask.to(dtype)
    return b


def engine(tiny, algo: str, budget: int | None, fmt: str = "fp32", ckpt: bool = False,
           grouped: bool | None = None) -> TrainingEngine:
    """No budget: the whole mini-batch as one padded pass (unless `grouped`); a budget: its rows
    grouped by length within it (the default), or in order (`grouped=False`)."""
    cfg = get_preset("tiny")
    cfg.max_tokens_per_microbatch, cfg.gradient_checkpointing = budget, ckpt
    cfg.group_by_length = budget is not None if grouped is None else grouped
    cfg.algo.max_len = 32
    return TrainingEngine(copy.deepcopy(tiny), fmt, cfg, get_loss(algo), algo)


def inputs(eng: TrainingEngine, batch: Batch, seed: int = 1) -> LossInputs:
    """π_old from the engine, μ a little off it (IS weights near 1, some clipped), ±1 advantages;
    for Score Centering μ's whole distribution too: the engine's own, a little off, renormalised,
    and μ of the sampled tokens read from it."""
    g = torch.Generator().manual_seed(seed)
    eng.sync_compute()
    old = eng.logprobs(batch)
    roll = (old + 0.05 * torch.randn(old.shape, generator=g, dtype=old.dtype)) * batch.mask
    adv = (torch.randint(0, 2, (old.shape[0],), generator=g) * 2 - 1).to(batch.mask.dtype)
    logq = None
    if SPECS[eng.algo].needs_distribution:
        with torch.no_grad():
            full = response_log_softmax(eng.compute, batch.ids, batch.attn, batch.pos)
        logq = torch.log_softmax(full + 0.05 * torch.randn(full.shape, generator=g), dim=-1)
        roll = logq.gather(-1, batch.tok.unsqueeze(-1)).squeeze(-1).to(old.dtype) * batch.mask
    return LossInputs(None, old, roll, batch.mask, adv, logq=logq)  # type: ignore[arg-type]


def grads(eng: TrainingEngine, x: LossInputs, idx: torch.Tensor, batch: Batch, **kw):
    x = copy.copy(x)
    x.logp_old = x.logp_old.clone()
    loss, metrics, finite = eng.accumulate(x, idx, batch, **kw)
    assert finite
    return loss, metrics, {n: p.grad.clone() for n, p in eng.master.named_parameters() if p.grad is not None}, x


def assert_grads_close(got: dict, ref: dict, tol: float = 1e-6) -> None:
    """Every gradient within tol of the reference, relative to the reference's largest entry."""
    assert got.keys() == ref.keys()
    for name, r in ref.items():
        scale = r.abs().max().item()
        diff = (got[name] - r).abs().max().item()
        assert diff <= tol * scale or diff < 1e-12, (name, diff, scale)


def norm(g: dict) -> float:
    return torch.sqrt(sum((v.double() ** 2).sum() for v in g.values())).item()


def rel_error(got: dict, ref: dict) -> float:
    return norm({k: got[k].double() - ref[k].double() for k in ref}) / norm(ref)


def whole_and_micro(model, algo, budget, batch, seed=1):
    whole, micro = engine(model, algo, None), engine(model, algo, budget)
    x = inputs(whole, batch, seed)
    idx = torch.randperm(16, generator=torch.Generator().manual_seed(2))[:12]     # a mini-batch, shuffled
    assert len(micro.parts(idx.tolist(), batch)) >= 3
    return grads(whole, x, idx, batch), grads(micro, x, idx, batch)


@pytest.mark.parametrize("algo", quick_sample(list(REGISTRY), QUICK_ALGOS))
def test_micro_batches_give_the_whole_batch_gradient_fp32(tiny, algo):
    """Parts at the batch's padded width: each row's arithmetic is the whole batch's, so the
    weighted sum is the whole-batch gradient to 1e-6 (fp32)."""
    batch = make_batch(empty=algo == "gspo", trim=False)
    (loss_w, m_w, g_w, _), (loss_m, m_m, g_m, _) = whole_and_micro(tiny, algo, 160, batch)
    assert any(g.abs().max() > 0 for g in g_w.values())
    assert_grads_close(g_m, g_w, 1e-6)
    assert loss_m == pytest.approx(loss_w, rel=1e-6, abs=1e-9)
    assert m_m.keys() == m_w.keys()
    for k in m_w:
        assert m_m[k] == pytest.approx(m_w[k], rel=1e-5, abs=1e-7), k


@pytest.mark.parametrize("algo", quick_sample(list(REGISTRY), QUICK_ALGOS))
def test_trimmed_micro_batches_are_exact_in_float64(tiny, algo):
    batch = make_batch(empty=algo == "gspo", dtype=torch.float64)
    (_, _, g_w, _), (_, _, g_m, _) = whole_and_micro(copy.deepcopy(tiny).double(), algo, 80, batch)
    assert_grads_close(g_m, g_w, 1e-10)


@pytest.mark.parametrize("algo", quick_sample(list(REGISTRY), ["pg-seq-is", "gspo"]))
def test_rows_grouped_by_length_give_the_whole_batch_gradient(tiny, algo):
    """The default (`group_by_length`, no budget): the rows sorted by length and cut where the
    padding costs more than a pass; the gradient is the one padded batch's, exactly in float64
    and within fp32's own rounding in fp32."""
    for dtype, model, tol in ((torch.float64, copy.deepcopy(tiny).double(), 1e-10), (torch.float32, tiny, 1e-5)):
        batch = make_batch(n=64, empty=algo == "gspo", seed=15, dtype=dtype)
        whole, grouped = engine(model, algo, None), engine(model, algo, None, grouped=True)
        x = inputs(whole, batch, seed=16)
        idx = torch.randperm(64, generator=torch.Generator().manual_seed(17))
        assert len(grouped.parts(idx.tolist(), batch)) >= 2
        (_, _, g_w, _), (_, _, g_g, _) = grads(whole, x, idx, batch), grads(grouped, x, idx, batch)
        assert rel_error(g_g, g_w) < tol


@pytest.mark.parametrize("algo", ["pg-seq-is", "grpo", "gspo"])
def test_trimmed_micro_batches_in_fp32_stay_within_fp32_rounding(tiny, algo):
    """Trimmed parts attend over fewer padded keys, which rounds differently in fp32: the
    micro-batch gradient is as close to the float64 one as the whole batch's is."""
    batch = make_batch(empty=algo == "gspo")
    (_, _, g_w, _), (_, _, g_m, _) = whole_and_micro(tiny, algo, 80, batch)
    b64 = make_batch(empty=algo == "gspo", dtype=torch.float64)
    (_, _, g_64, _), _ = whole_and_micro(copy.deepcopy(tiny).double(), algo, 80, b64)
    fp32_error = rel_error(g_w, g_64)
    assert rel_error(g_m, g_w) < 1e-5
    assert rel_error(g_m, g_64) < 1.5 * fp32_error + 1e-6


@pytest.mark.parametrize("algo", ["grpo", "pg-seq-is", "gspo"])
def test_one_optimizer_step_is_the_same(tiny, algo):
    """The same clipped AdamW step. AdamW's first step moves each weight by about lr·g/|g|,
    so where a gradient is ~0 its last-bit noise shows in the update: compared to 1% of lr."""
    batch = make_batch(seed=3, trim=False)
    whole, micro = engine(tiny, algo, None), engine(tiny, algo, 120)
    x = inputs(whole, batch, seed=4)
    idx = torch.arange(16)
    before = [p.detach().clone() for p in whole.master.parameters()]
    _, norm_w, _, ok_w = whole.update(copy.copy(x), idx, batch)
    _, norm_m, _, ok_m = micro.update(copy.copy(x), idx, batch)
    assert ok_w and ok_m and norm_m == pytest.approx(norm_w, rel=1e-6)
    lr = whole.cfg.lr
    for (n, a), b, p0 in zip(whole.master.named_parameters(), micro.master.parameters(), before):
        assert (a - p0).abs().max() > 0.5 * lr, n                          # the step moved it
        assert (a - b).abs().max().item() <= 1e-2 * lr, n


def test_pi_old_from_the_micro_batches_equals_the_whole_forward(tiny):
    """One update per rollout batch: the whole batch's forward with grad doubles as π_old;
    in micro-batches each part writes its own."""
    batch = make_batch(seed=5, trim=False)
    whole, micro = engine(tiny, "grpo", None), engine(tiny, "grpo", 140)
    x = inputs(whole, batch, seed=6)
    order = torch.randperm(16, generator=torch.Generator().manual_seed(7))
    whole.sync_compute()
    first = __import__("runners.logprobs", fromlist=["x"]).response_logprobs(whole.compute, *batch.tensors)
    x_w = copy.copy(x)
    x_w.logp_old = first.detach() * batch.mask
    _, _, g_w, _ = grads(whole, x_w, order, batch, logp=first[order])
    x_m = copy.copy(x)
    x_m.logp_old = torch.zeros_like(batch.mask)
    _, _, g_m, filled = grads(micro, x_m, order, batch, fill_old=True)
    torch.testing.assert_close(filled.logp_old, x_w.logp_old, rtol=0, atol=1e-6)
    assert_grads_close(g_m, g_w)


def test_activation_checkpointing_changes_no_gradient(tiny):
    batch = make_batch(seed=8)
    plain, ckpt = engine(tiny, "grpo", None), engine(tiny, "grpo", None, ckpt=True)
    assert ckpt.compute.is_gradient_checkpointing
    x = inputs(plain, batch, seed=9)
    idx = torch.arange(16)
    assert_grads_close(grads(ckpt, x, idx, batch)[2], grads(plain, x, idx, batch)[2], tol=0.0)


@pytest.mark.parametrize("fmt, small", [("bf16", 2.0 ** -9), ("fp16", 2.0 ** -12)])
def test_16_bit_micro_batches_sum_in_fp32(tiny, fmt, small):
    """The parts' 16-bit gradients are summed in fp32 into the master: parts of 1.0 and seven of
    `small` (below half an ulp of 1.0 in the format: bf16 2⁻⁸, fp16 2⁻¹¹) sum to exactly
    1 + 7·small in fp32, where a 16-bit running sum stays at 1.0 after every part."""
    eng = engine(tiny, "grpo", 80, fmt)
    dt = next(eng.compute.parameters()).dtype
    assert dt == {"bf16": torch.bfloat16, "fp16": torch.float16}[fmt]
    for p in eng.master.parameters():
        p.grad = torch.full_like(p, 5.0)                    # a previous step's: the first part replaces it
    for k, value in enumerate([1.0] + [small] * 7):
        for pc in eng.compute.parameters():
            pc.grad = torch.full_like(pc, value)          # 16-bit, exact in the format
        eng._collect_grads(first=k == 0)
        assert all(pc.grad is None for pc in eng.compute.parameters())
    for name, p in eng.master.named_parameters():
        assert p.grad.dtype == torch.float32 and p.grad.unique().tolist() == [1.0 + 7 * small], name
    assert torch.tensor(1.0, dtype=dt) + torch.tensor(small, dtype=dt) == 1.0     # the 16-bit sum's fate


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_16_bit_micro_batches_are_as_close_to_fp32_as_the_whole_batch(tiny, fmt):
    """End to end with a 16-bit compute copy: the micro-batch gradient is as close to the fp32
    one as the whole 16-bit batch's is (a coarse check: the 16-bit forward/backward's own error,
    bf16 ~0.35, fp16 ~0.05, dwarfs the summation's; the exact check is the test above)."""
    batch = make_batch(seed=10)
    whole, micro = engine(tiny, "pg-seq-tis", None, fmt), engine(tiny, "pg-seq-tis", 80, fmt)
    x = inputs(whole, batch, seed=11)
    idx = torch.arange(16)
    _, _, g_w, _ = grads(whole, x, idx, batch)
    _, _, g_m, _ = grads(micro, x, idx, batch)
    _, _, g_32, _ = grads(engine(tiny, "pg-seq-tis", None), x, idx, batch)
    assert len(micro.parts(idx.tolist(), batch)) >= 3
    assert all(g.dtype == torch.float32 for g in g_m.values())
    assert rel_error(g_m, g_32) < 1.5 * rel_error(g_w, g_32)
    assert rel_error(g_m, g_w) < 0.1


@pytest.mark.parametrize("grouped", [False, True])
def test_parts_respect_the_budget(tiny, grouped):
    batch = make_batch(seed=12)
    eng = engine(tiny, "grpo", 50, grouped=grouped)
    rows = list(range(16))[::-1]
    parts = eng.parts(rows, batch)
    if grouped:                                                      # every row once, shortest first
        assert [r for p in parts for r in p] == sorted(rows, key=lambda r: (batch.lengths[r], r))
    else:
        assert [r for p in parts for r in p] == rows                 # every row once, in order
    for p in parts:
        cost = len(p) * max(batch.lengths[i] for i in p)
        assert cost <= 50 or len(p) == 1                             # a longer row stands alone
    assert engine(tiny, "grpo", None).parts(rows, batch) == [rows]
    eng.passes = 0
    lp = eng.logprobs(batch)
    assert eng.passes == len(eng.parts(list(range(16)), batch)) > 1
    # trimmed parts: the same log-probs up to fp32 rounding (attention over fewer padded keys)
    torch.testing.assert_close(lp, engine(tiny, "grpo", None).logprobs(batch), rtol=1e-6, atol=1e-6)


def test_a_non_finite_part_skips_the_step_and_still_fills_pi_old(tiny):
    """A part whose loss is NaN: no gradient, the step is skipped and counted (as for a whole
    batch), and with π_old taken from the update's forwards every row still gets its π_old
    (the step's mismatch metrics need it)."""
    batch = make_batch(seed=13, trim=False)
    eng = engine(tiny, "grpo", 100)
    x = inputs(engine(tiny, "grpo", None), batch, seed=14)
    real = eng.loss_fn

    def poisoned(mb, cfg):                       # NaN in the part holding row 0 (advantage set to 7)
        loss, m = real(mb, cfg)
        return (loss * float("nan") if (mb.advantages == 7).any() else loss), m

    x.advantages = x.advantages.clone()
    x.advantages[0] = 7.0
    eng.loss_fn = poisoned
    x_m = copy.copy(x)
    x_m.logp_old = torch.zeros_like(batch.mask)
    order = torch.arange(16)
    assert len(eng.parts(order.tolist(), batch)) >= 3
    loss, norm, _, applied = eng.update(x_m, order, batch, fill_old=True)
    assert not applied and norm != norm and loss != loss
    assert eng.scaler.skipped == 1 and all(p.grad is None for p in eng.master.parameters())
    torch.testing.assert_close(x_m.logp_old, x.logp_old, rtol=1e-6, atol=1e-6)
