"""vLLM's fused q/k/v and gate/up projections in the rollout engine (bench/fused_projections.py):
one GEMM a group, each member its columns, the members' weights views of the group's, and the
same numbers as one GEMM a member, through weight syncs, for every kind of member."""

import copy

import pytest
import torch
from torch import nn

from bench import formats
from bench.engines import Sampling
from bench.engines.torch_engine import TorchEngine
from bench.model_formats import RolloutWeights, apply_rollout_kernels
from bench.fused_projections import FusedProjection, fuse_projections, unfuse_projections
from bench.models import TINY_MATH_DIR


def _attn_like(bias: bool):
    """Members of 32, 16 and 16 columns: a GEMM of fewer than 16 columns takes another kernel on
    some CPUs' BLAS (an Intel AMX Xeon's MKL rounds a 2-column member of a 5-row activation
    otherwise), the shapes of no real projection (bench/fused_projections.py)."""
    torch.manual_seed(0)
    m = nn.Module()
    m.q_proj, m.k_proj, m.v_proj = (nn.Linear(8, 32, bias=bias), nn.Linear(8, 16, bias=bias),
                                    nn.Linear(8, 16, bias=bias))
    return m


@pytest.mark.parametrize("bias", [False, True])
def test_members_return_their_columns_of_one_gemm(bias):
    m = _attn_like(bias)
    x = torch.randn(5, 8)
    with torch.no_grad():
        want = [m.q_proj(x), m.k_proj(x), m.v_proj(x)]
        assert fuse_projections(m) == 1 and fuse_projections(m) == 0        # once
        group = m.q_proj._bench_fused_group
        assert isinstance(group, FusedProjection) and group.base["weight"].shape == (64, 8)
        calls = []
        real = group._forward
        group._forward = lambda t: calls.append(t) or real(t)
        got = [m.q_proj(x), m.k_proj(x), m.v_proj(x)]
    assert len(calls) == 1                                                  # one GEMM for the three
    assert [g.shape[-1] for g in got] == [32, 16, 16]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert group._x is None and group._y is None                            # dropped once all took theirs


def test_a_new_or_modified_input_is_computed_anew():
    m = _attn_like(False)
    fuse_projections(m)
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    with torch.no_grad():
        q = m.q_proj(x)
        k = m.k_proj(y)                                  # another input: not x's columns
        assert torch.equal(k, y @ m.k_proj.weight.t())
        q2 = m.q_proj(x)
        x.mul_(2)                                        # modified in place: its version moved
        k2 = m.k_proj(x)
    assert torch.equal(q, q2) and torch.equal(k2, x @ m.k_proj.weight.t())


def test_a_sync_in_place_reaches_the_group():
    m = _attn_like(True)
    fuse_projections(m)
    base = m.q_proj._bench_fused_group.base["weight"]
    assert m.k_proj.weight.data_ptr() == base[32:48].data_ptr()            # a view, no copy
    with torch.no_grad():
        m.k_proj.weight.copy_(torch.ones(16, 8))
        m.k_proj.bias.zero_()
        x = torch.randn(4, 8)
        assert torch.allclose(m.k_proj(x), x.sum(-1, keepdim=True).expand(4, 16), atol=1e-5)
        m.q_proj(x), m.v_proj(x)


def test_mixed_members_are_left_alone():
    m = _attn_like(False)
    m.v_proj = nn.Linear(8, 16).to(torch.bfloat16)                         # another dtype
    assert fuse_projections(m) == 0 and "forward" not in m.q_proj.__dict__
    m = _attn_like(False)
    m.k_proj = nn.Linear(8, 16, bias=True)                                  # a bias on one member only
    assert fuse_projections(m) == 0
    m = _attn_like(False)
    m.v_proj.weight = m.k_proj.weight                                       # a weight shared by two members
    assert fuse_projections(m) == 0


def test_a_copied_group_refuses_rather_than_compute_stale():
    m = copy.deepcopy(_fused(_attn_like(True)))              # the copy's members own their weights again
    with torch.no_grad(), pytest.raises(RuntimeError, match="no longer shares the group's weight"):
        m.q_proj(torch.randn(2, 8))
    assert unfuse_projections(m) == 3
    with torch.no_grad():
        x = torch.randn(2, 8)
        assert torch.equal(m.k_proj(x), torch.nn.functional.linear(x, m.k_proj.weight, m.k_proj.bias))


def _fused(m):
    fuse_projections(m)
    return m


@pytest.mark.parametrize("name", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("cpu", ["none", "all"])
def test_fused_layers_give_the_unfused_numbers_through_syncs(name, cpu, monkeypatch):
    """A tiny Llama in the rollout format with its kernels, fused and not: the same logits bit
    for bit, before and after a sync of new weights (split-K 16-bit or quantized members)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.setenv("BENCH_CPU_16BIT", cpu)
    torch.manual_seed(0)
    master = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2)).eval()
    fmt = formats.get(name)
    engines = []
    for fuse in (False, True):
        w = RolloutWeights(copy.deepcopy(master), fmt)
        got = apply_rollout_kernels(w.model, fmt, "cpu")
        assert got["fused_projections"] == 4
        if not fuse:
            own = {n: m.__dict__["_bench_own_forward"] for n, m in w.model.named_modules()
                   if "_bench_own_forward" in m.__dict__}
            assert unfuse_projections(w.model) == 10         # 2 layers × (q, k, v, gate, up)
            assert all(m.__dict__.get("forward") is own[n] for n, m in w.model.named_modules() if n in own)
            assert any(f is not None for f in own.values()) == (name == "bf16" and cpu == "none")  # split-K back
        engines.append(w)
    ids = torch.randint(0, 50, (3, 7))
    for sync in range(2):
        with torch.no_grad():
            a, b = (w.model(input_ids=ids).logits for w in engines)
        assert torch.equal(a, b)
        with torch.no_grad():
            for p in master.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        for w in engines:
            w.load(master.named_parameters())


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8", "nvfp4"])
def test_rollouts_with_fused_projections_are_bit_identical(fmt):
    """Whole rollouts of tiny-math with the engine's kernels, fused projections undone in one
    engine: token ids and μ identical."""
    prompts = [f"Q: Compute {a}+{b}.\nA: " for a, b in [(3, 4), (12, 30), (7, 8)]]
    out = []
    for fuse in (False, True):
        eng = TorchEngine(str(TINY_MATH_DIR), fmt)
        if not fuse:
            unfuse_projections(eng.model)
        out.append([s for row in eng.generate(prompts, 4, Sampling(1.0, 1.0, 24, seed=2)) for s in row])
    assert [s.token_ids for s in out[0]] == [s.token_ids for s in out[1]]
    assert [s.logprobs for s in out[0]] == [s.logprobs for s in out[1]]
