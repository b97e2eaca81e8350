"""Mixture-of-experts models (bench/moe.py, bench/routes.py, bench/router_metrics.py): every format
reaches the experts and the router (exact codes on hand-built expert weights), the two engines'
arithmetic on them, the +router32 formats, route recording in the built-in engine, router replay
and the router agreement metrics (hand-computed)."""

import copy
import math

import pytest
import torch
from typer.testing import CliRunner

from bench import formats, moe
from bench.engines import Sampling
from bench.engines.torch_engine import TorchEngine
from bench.errors import ConfigError, PrecisionError
from bench.model_formats import RolloutWeights
from bench.formats import FORMATS
from bench.model_formats import prepare_compute_model
from bench.precision import ALL_PAIRS, Precision, parse_list
from bench.router_metrics import at_positions, flips, router_flip_frac, router_metrics, router_token_flip_frac
from bench.routes import TrainRoutes, pad_routes, replayed, routed
from bench.tinymath import TinyMoeConfig, build_tokenizer, new_model
from runners.logprobs import pack, response_logprobs

INT8, FP8, NVFP4 = FORMATS["int8"], FORMATS["fp8"], FORMATS["nvfp4"]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def small_moe(tok, hidden=32, layers=2, experts=4, seed=0):
    """A random Mixtral of the tiny-math-moe kind: I = 32 (nvfp4's blocks of 16 fit)."""
    m = new_model(tok, TinyMoeConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                                     intermediate_size=32, num_experts=experts, top_k=2), seed=seed)
    return m.eval()


def experts_of(model, layer=0):
    return model.model.layers[layer].mlp.experts


def gate_of(model, layer=0):
    return model.model.layers[layer].mlp.gate


# ------------------------------------------------------------------ finding the layers

@pytest.mark.slow
def test_moe_blocks_are_found_and_dense_models_have_none(tok):
    from bench.tinymath import TinyConfig

    m = small_moe(tok)
    assert len(moe.moe_blocks(m)) == 2 and moe.is_moe(m)
    assert [g is gate_of(m, i) for i, g in enumerate(moe.routers(m))] == [True, True]
    dense = new_model(tok, TinyConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=64))
    assert not moe.is_moe(dense) and moe.routers(dense) == []


# ------------------------------------------------------------------ exact codes on hand-built experts

def _hand_experts(tok):
    """Layer 0's experts of a small model with expert 0's and expert 1's first gate_up row set by
    hand (every other weight zero): expert 1's row is expert 0's times 2."""
    m = small_moe(tok)
    ex = experts_of(m)
    with torch.no_grad():
        ex.gate_up_proj.zero_()
        ex.down_proj.zero_()
        row = torch.zeros(32)
        row[:4] = torch.tensor([7.9375, 1.5 * 0.0625, 2.5 * 0.0625, -0.5 * 0.0625])   # amax 127 · 2^-4
        ex.gate_up_proj[0, 0] = row
        ex.gate_up_proj[1, 0] = 2 * row
    return m


@pytest.mark.slow
def test_int8_quantizes_each_expert_per_output_channel(tok):
    m = _hand_experts(tok)
    q = moe.QuantExperts(experts_of(m), INT8)
    # expert 0: scale amax/127 = 2^-4; w/s = 127, 1.5 → 2, 2.5 → 2, -0.5 → 0 (half to even)
    # expert 1: its own scale 2^-3, the same codes. One scale over both experts (2^-3) would
    # give expert 0 the codes 64 (63.5 → 64), 1 (0.75), 1 (1.25), 0 instead.
    assert q.gate_up_proj_codes.shape == (4, 64, 32) and q.gate_up_proj_codes.dtype == torch.int8
    assert torch.equal(q.gate_up_proj_codes[0, 0, :4], torch.tensor([127, 2, 2, 0], dtype=torch.int8))
    assert torch.equal(q.gate_up_proj_codes[1, 0, :4], torch.tensor([127, 2, 2, 0], dtype=torch.int8))
    assert q.gate_up_proj_scale[0, 0].item() == 2 ** -4 and q.gate_up_proj_scale[1, 0].item() == 2 ** -3
    assert q.gate_up_proj_scale[0, 1].item() == 1.0                     # an all-zero row: scale 1
    assert q.down_proj_codes.shape == (4, 32, 32) and not q.down_proj_codes.any()


def test_fp8_quantizes_each_expert_per_output_channel(tok):
    m = small_moe(tok)
    ex = experts_of(m)
    with torch.no_grad():
        ex.gate_up_proj.zero_()
        ex.gate_up_proj[0, 0, :4] = torch.tensor([448.0, 5.25, 9.5, -0.25]) / 64    # amax 448 · 2^-6
        ex.gate_up_proj[1, 0, :4] = 2 * ex.gate_up_proj[0, 0, :4]
    q = moe.QuantExperts(ex, FP8)
    # expert 0: scale 2^-6, w/s = 448, 5.25 → 5 (spacing 0.5 in [4, 8), tie to the even 1.010),
    # 9.5 → 10 (spacing 1 in [8, 16), tie to 1.010), -0.25 exact; expert 1: scale 2^-5, the same
    # codes. One scale over both experts (2^-5) would give expert 0 224, 2.5, 5, -0.125.
    assert q.gate_up_proj_scale[0, 0].item() == 2 ** -6 and q.gate_up_proj_scale[1, 0].item() == 2 ** -5
    for e in (0, 1):
        assert q.gate_up_proj_codes[e, 0, :4].float().tolist() == [448.0, 5.0, 10.0, -0.25]


def test_nvfp4_gives_each_expert_its_own_global_scale(tok):
    m = small_moe(tok)
    ex = experts_of(m)
    with torch.no_grad():
        ex.gate_up_proj.zero_()
        ex.gate_up_proj[0, 0, :4] = torch.tensor([6.0, 3.0, 1.5, 0.5])       # expert 0: amax 6
        ex.gate_up_proj[1, 0, :4] = torch.tensor([9.0, 4.5, 2.25, 0.75])     # expert 1: amax 9
    q = moe.QuantExperts(ex, NVFP4)
    # expert 0 on its own: g = 6/(448·6) = 1/448, block scale e4m3(6/6·448) = 448 → 1: codes 2·value
    # exactly. One global scale over both experts (g = 9/2688) would make that block's scale
    # e4m3(298.7) = 288 → 288·9/2688 = 0.964.
    assert q.gate_up_proj_scale[0, 0, 0].item() == 1.0
    assert torch.equal(q.gate_up_proj_codes[0, 0, :4], torch.tensor([12, 6, 3, 1], dtype=torch.int8))
    assert q.gate_up_proj_scale[1, 0, 0].item() == 1.5                        # 9/6, the same for expert 1
    assert torch.equal(q.gate_up_proj_gemm[0, 0, :4], ex.gate_up_proj[0, 0, :4].detach())


def test_the_router_is_quantized_like_any_linear_layer(tok):
    m = small_moe(tok)
    g = gate_of(m)
    with torch.no_grad():
        g.weight.zero_()
        g.weight[0, :3] = torch.tensor([2.54, 0.03, -1.0])                  # amax 2.54 → scale 0.02
    q = moe.QuantRouter(g, INT8)
    assert torch.equal(q.codes[0, :3], torch.round(torch.tensor([2.54, 0.03, -1.0]) / (torch.tensor(2.54) / 127))
                       .to(torch.int8))
    assert q.codes[0, :3].tolist() == [127, 2, -50]                           # 1.5 → 2, -50.0 (rounding of 1/0.02)
    assert q.top_k == 2


# ------------------------------------------------------------------ formats on the whole model

@pytest.mark.parametrize("name", list(formats.FORMATS))
def test_every_rollout_format_reaches_experts_and_router(tok, name):
    m = small_moe(tok)
    fmt = formats.get(name)
    w = RolloutWeights(copy.deepcopy(m), fmt).model
    ex, g = experts_of(w), gate_of(w)
    if fmt.quant is not None:
        assert isinstance(ex, moe.QuantExperts) and isinstance(g, moe.QuantRouter)
        assert ex.gate_up_proj_codes.dtype == fmt.quant.code_dtype and g.codes.dtype == fmt.quant.code_dtype
    elif fmt.router32:
        assert isinstance(g, moe.Router32) and g.weight.dtype == torch.float32
        assert ex.gate_up_proj.dtype == fmt.dtype and ex._bench_mode == "native"
    else:
        assert ex.gate_up_proj.dtype == ex.down_proj.dtype == g.weight.dtype == fmt.dtype
        if fmt.dtype != torch.float32:
            assert ex._bench_mode == g._bench_mode == "native"


@pytest.mark.parametrize("name", [n for n, f in formats.FORMATS.items() if f.train])
def test_every_training_format_reaches_experts_and_router(tok, name):
    m = small_moe(tok)
    fmt = formats.get(name)
    c = prepare_compute_model(copy.deepcopy(m), name)
    ex, g = experts_of(c), gate_of(c)
    assert [p.shape for p in c.parameters()] == [p.shape for p in m.parameters()]      # the trainer pairs by order
    if fmt.quant is not None:          # fp8: fp32 weights, quantized in the forward
        assert ex.gate_up_proj.dtype == g.weight.dtype == torch.float32
    elif fmt.router32:
        assert g.weight.dtype == torch.float32 and ex.gate_up_proj.dtype == fmt.dtype
    else:
        assert ex.gate_up_proj.dtype == g.weight.dtype == fmt.dtype
    ids = torch.tensor([tok.encode("Q: Compute 3+4.\nA: 3+4=7.")])
    c.train()
    c(input_ids=ids, labels=ids).loss.backward()
    assert ex.gate_up_proj.grad is not None and ex.gate_up_proj.grad.abs().sum() > 0
    assert g.weight.grad is not None and g.weight.grad.abs().sum() > 0


def test_fp8_training_forward_of_the_experts_is_the_rollout_arithmetic(tok):
    """The training engine's fp8 experts (W8A8STE from fp32 weights) compute what the rollout
    engine's QuantExperts compute from their codes, bit for bit (no fused activation, no split-K)."""
    m = small_moe(tok)
    train = prepare_compute_model(copy.deepcopy(m), "fp8")
    q = moe.QuantExperts(experts_of(m), FP8)
    x = torch.randn(10, 32, generator=torch.Generator().manual_seed(1)).bfloat16()
    idx = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2], [1, 3], [2, 0], [3, 1], [0, 3], [2, 1]])
    wts = torch.rand(10, 2, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(experts_of(train)(x, idx, wts), q(x, idx, wts))


def test_rollout_kernels_fuse_the_experts_activation_and_split_k(tok, monkeypatch):
    monkeypatch.setenv("BENCH_CPU_16BIT", "none")
    e = TorchEngine("x", "bf16", model=small_moe(tok), tokenizer=tok)
    ex, g = experts_of(e.model), gate_of(e.model)
    assert ex._bench_fused and ex._bench_mode == g._bench_mode == "split_k"
    monkeypatch.setenv("BENCH_CPU_16BIT", "all")
    e = TorchEngine("x", "bf16", model=small_moe(tok), tokenizer=tok)
    assert experts_of(e.model)._bench_mode == "native" and experts_of(e.model)._bench_fused
    e = TorchEngine("x", "nvfp4", model=small_moe(tok), tokenizer=tok)
    assert experts_of(e.model).split_k == gate_of(e.model).split_k == 4


def test_linear_16_modes_by_hand():
    # K = 4 in two fp32 slices is exact here; one rounding to bf16 at the end: 1 + 2^-9 → 1 (ties to even)
    x = torch.tensor([[1.0, 2 ** -9, 0.0, 0.0]]).bfloat16()
    w = torch.tensor([[1.0, 1.0, 0.0, 0.0]]).bfloat16()
    assert moe.linear_16(x, w, "upcast").item() == 1.0 and moe.linear_16(x, w, "upcast").dtype == torch.bfloat16
    assert moe.linear_16(x, w, "split_k").item() == 1.0
    assert moe.linear_16(x.float(), w.float(), "upcast").item() == 1 + 2 ** -9       # fp32 weight: fp32


def test_a_weight_sync_requantizes_every_expert(tok):
    m = small_moe(tok)
    e = TorchEngine("x", "int8", model=copy.deepcopy(m), tokenizer=tok, track_updates=True)
    with torch.no_grad():
        experts_of(m).down_proj[2] *= 3.0
        gate_of(m).weight[1, 0] += 0.5
    e.update_weights(m.named_parameters())
    ex, g = experts_of(e.model), gate_of(e.model)
    want_c, want_s = INT8.quantize(experts_of(m).down_proj[2].detach())
    assert torch.equal(ex.down_proj_codes[2], want_c) and torch.equal(ex.down_proj_scale[2], want_s)
    assert torch.equal(g.codes, INT8.quantize(gate_of(m).weight.detach())[0])
    # the sync statistics count the experts and routers with the linear weights
    lin = sum(p.numel() for n, p in m.named_parameters()
              if n.endswith(("proj.weight", "gate_up_proj", "down_proj", "gate.weight")) or n == "lm_head.weight"
              or n == "model.embed_tokens.weight")
    assert 0 < e.sync_stats["rollout_weights_moved"] < 1
    assert e.weights.linear_names >= {"model.layers.0.mlp.experts.down_proj", "model.layers.1.mlp.gate.weight"}
    assert lin > 0


def test_router32_formats_parse_train_and_stay_out_of_all():
    assert formats.canonical("bf16-router32") == "bf16+router32"
    assert Precision.parse("fp16+router32") == Precision("fp16+router32", "fp16+router32")
    assert Precision.parse("rollout=bf16+router32,train=bf16").train == "bf16"
    assert not {p.rollout for p in ALL_PAIRS} & set(formats.MOE_FORMATS)
    assert parse_list("bf16+router32;fp16") == [Precision("bf16+router32", "bf16+router32"), Precision("fp16", "fp16")]
    from bench.engines.vllm_engine import vllm_format_kwargs

    with pytest.raises(PrecisionError, match="fp32 router"):
        vllm_format_kwargs("bf16+router32")


# ------------------------------------------------------------------ router metrics by hand

def test_router_flip_metrics_by_hand():
    # 1 sequence, 3 tokens (the third masked out), 2 layers, top-2:
    #   token 0: layer 0 {0,1} vs {1,0} (same set, other order), layer 1 {2,3} vs {2,3}: no flip
    #   token 1: layer 0 {0,1} vs {0,2}: flip; layer 1 same
    #   token 2 (masked): every layer differs, must not count
    a = torch.tensor([[[[0, 1], [2, 3]], [[0, 1], [2, 3]], [[0, 1], [2, 3]]]])
    b = torch.tensor([[[[1, 0], [2, 3]], [[0, 2], [3, 2]], [[2, 3], [0, 1]]]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert flips(a, b).tolist() == [[[False, False], [True, False], [True, True]]]
    assert router_flip_frac(a, b, mask) == 1 / 4            # 1 of 4 (token, layer) pairs
    assert router_token_flip_frac(a, b, mask) == 1 / 2      # 1 of 2 tokens
    # the mismatch split: d = log π − log μ = 0.1 on the unflipped token, −0.2 on the flipped one
    mu = torch.tensor([[-1.0, -2.0, -3.0]], dtype=torch.float64)
    pi = torch.tensor([[-0.9, -2.2, -9.0]], dtype=torch.float64)
    r = router_metrics(a, b, mu, pi, mask)
    assert r["router_tokens"] == 2.0
    assert r["kl_k3_router_unflipped"] == pytest.approx(math.expm1(0.1) - 0.1, rel=1e-9)
    assert r["kl_k3_router_flipped"] == pytest.approx(math.expm1(-0.2) + 0.2, rel=1e-9)
    assert r["abs_logp_diff_mean_router_flipped"] == pytest.approx(0.2, rel=1e-9)
    assert r["abs_logp_diff_mean_router_unflipped"] == pytest.approx(0.1, rel=1e-9)


def test_router_metrics_skip_unknown_routes_and_empty_groups():
    a = torch.tensor([[[[0, 1]], [[-1, -1]]]])               # token 1: the rollout did not record it
    b = torch.tensor([[[[0, 1]], [[2, 3]]]])
    mask = torch.ones(1, 2)
    r = router_metrics(a, b, torch.zeros(1, 2), torch.zeros(1, 2), mask)
    assert r["router_tokens"] == 1.0 and r["router_flip_frac"] == 0.0
    assert math.isnan(r["kl_k3_router_flipped"]) and r["kl_k3_router_unflipped"] == 0.0


def test_at_positions_and_pad_routes():
    r = torch.arange(2 * 4 * 1 * 2).view(2, 4, 1, 2)
    pos = torch.tensor([[1, 2], [0, 3]])
    got = at_positions(r, pos)
    assert got[0, 0].tolist() == r[0, 1].tolist() and got[1, 1].tolist() == r[1, 3].tolist()
    p = pad_routes([torch.tensor([[[1, 2]]], dtype=torch.int16), None], 3, 1, 2)
    assert p.tolist() == [[[[1, 2]], [[-1, -1]], [[-1, -1]]], [[[-1, -1]], [[-1, -1]], [[-1, -1]]]]


def test_replayed_weights_by_hand():
    # logits ln 1, ln 2, ln 3, ln 4: p = .1 .2 .3 .4; own top-2 {3, 2}; replay {0, 1} → weights
    # p_0, p_1 renormalised: 1/3, 2/3; a row with an unknown route keeps its own experts
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]]))
    own = torch.tensor([[3, 2], [3, 2]])
    rep = torch.tensor([[0, 1], [-1, -1]])
    w, e = replayed(logits, own, rep, True, torch.float32)
    assert e.tolist() == [[0, 1], [3, 2]]
    assert w[0].tolist() == pytest.approx([1 / 3, 2 / 3]) and w[1].tolist() == pytest.approx([4 / 7, 3 / 7])
    w, _ = replayed(logits, own, rep, False, torch.float32)
    assert w[0].tolist() == pytest.approx([0.1, 0.2])


# ------------------------------------------------------------------ routes in the engines, replay

def _rollout(tok, model, fmt="bf16", n=4, max_tokens=12):
    e = TorchEngine("x", fmt, model=copy.deepcopy(model), tokenizer=tok, record_routes=True)
    prompts = ["Q: Compute 3+4.\nA: ", "Q: Compute 12*7-5.\nA: "]
    samples = e.generate(prompts, n, Sampling(max_tokens=max_tokens, seed=3))
    pids = [tok.encode(p, add_special_tokens=False) for p in prompts for _ in range(n)]
    return [s for row in samples for s in row], pids


def test_the_rollout_engine_records_a_route_for_every_position_it_ran(tok):
    m = small_moe(tok)
    flat, pids = _rollout(tok, m, "fp32")
    for s, p in zip(flat, pids):
        assert s.routes.shape == (len(p) + len(s.token_ids) - 1, 2, 2)
        assert (s.routes >= 0).all() and (s.routes < 4).all()
    # fp32 in both engines: the trainer's one prefill routes every scored position alike
    ids, attn, tk, pos, mask = pack(pids, [s.token_ids for s in flat], tok.pad_token_id)
    session = TrainRoutes(m, *ids.shape)
    with torch.no_grad(), routed(session):
        response_logprobs(m, ids, attn, tk, pos)
    rollout = pad_routes([s.routes for s in flat], ids.shape[1], 2, 2)
    assert router_flip_frac(at_positions(rollout, pos), at_positions(session.chosen, pos), mask) == 0.0
    e = TorchEngine("x", "fp32", model=copy.deepcopy(m), tokenizer=tok)              # not asked: no routes
    assert e.generate(["Q: 1+1.\nA: "], 1, Sampling(max_tokens=4))[0][0].routes is None


def test_router_replay_routes_the_trainer_forward_as_the_rollout(tok):
    m = small_moe(tok)
    flat, pids = _rollout(tok, m, "nvfp4")           # a coarse rollout: its routes differ from the trainer's
    ids, attn, tk, pos, mask = pack(pids, [s.token_ids for s in flat], tok.pad_token_id)
    rollout = pad_routes([s.routes for s in flat], ids.shape[1], 2, 2)
    c = prepare_compute_model(copy.deepcopy(m), "bf16").eval()
    used = []
    hooks = [experts_of(c, i).register_forward_pre_hook(lambda mod, args, i=i: used.append((i, args[1].clone())))
             for i in range(2)]
    plain = TrainRoutes(c, *ids.shape)
    with torch.no_grad(), routed(plain):
        lp_own = response_logprobs(c, ids, attn, tk, pos)
    used.clear()
    replay = TrainRoutes(c, *ids.shape, replay=rollout)
    with torch.no_grad(), routed(replay):
        lp_replay = response_logprobs(c, ids, attn, tk, pos)
    for h in hooks:
        h.remove()
    a, own = at_positions(rollout, pos), at_positions(plain.chosen, pos)
    assert router_flip_frac(a, own, mask) > 0                      # without replay the trainer routes otherwise
    # the metrics keep what the trainer would have chosen: layer 0 (its input does not depend on
    # routing) as without replay, and not the rollout's routes it was given
    assert torch.equal(replay.chosen[:, :, 0], plain.chosen[:, :, 0])
    assert router_flip_frac(a, at_positions(replay.chosen, pos), mask) > 0
    # the experts the forward used: the rollout's at every position it recorded → 0 flips
    for layer, idx in used:
        got = idx.view(*ids.shape, 2)
        known = (rollout[:, :, layer] >= 0).all(-1)
        assert not flips(got[known].unsqueeze(1), rollout[:, :, layer][known].unsqueeze(1)).any()
    assert not torch.equal(lp_own, lp_replay)


def test_router32_routes_as_the_fp32_router_on_the_same_hidden_states(tok):
    """Each router of the training engine's bf16 / fp16 copies and of their +router32 copies,
    fed the same 16-bit hidden states: router32's top-2 sets are the fp32 router's (its logits
    are the fp32 GEMM of the upcast states), the 16-bit router's are not, on some tokens.

    (On whole sequences the flips also come from the 16-bit layers before each router, whose
    rounding router32 keeps: with 3,000 tokens through two layers, bf16+router32 flipped 40
    top-2 sets where bf16 flipped 36 on an AVX512-BF16 CPU, and fewer on an AVX2 one; that
    count measures the model, not the format, so the test does not assert it.)"""
    m = small_moe(tok, hidden=64, layers=2, experts=8, seed=1)
    g = torch.Generator().manual_seed(0)
    flipped = {}
    for f in ("bf16", "bf16+router32", "fp16", "fp16+router32"):
        gates = [b.gate for b in moe.moe_blocks(prepare_compute_model(copy.deepcopy(m), f).eval())]
        n = 0
        for gate, ref in zip(gates, [b.gate for b in moe.moe_blocks(m)], strict=True):
            h = torch.randn(4096, 64, generator=g).to(FORMATS[f].dtype)
            with torch.no_grad():
                _, _, idx = gate(h)
                _, _, want = ref(h.float())
            n += int(flips(idx.unsqueeze(1), want.unsqueeze(1)).sum())
        flipped[f] = n
    assert flipped["bf16+router32"] == 0 and flipped["fp16+router32"] == 0
    assert flipped["bf16"] > 0


# ------------------------------------------------------------------ the CLI and the knobs

def test_training_script_on_a_shrunken_moe(tmp_path):
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.cli import app

    out = tmp_path / "tmm"
    r = CliRunner().invoke(app, ["model", "train", "tiny-math-moe", "--steps", "2", "--batch-size", "4", "--hidden",
                                 "32", "--layers", "1", "--experts", "4", "--top-k", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["steps"] == 2
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == "mixtral" and model.config.num_local_experts == 4
    assert model.config.num_experts_per_tok == 2 and moe.is_moe(model) and moe.config_is_moe(str(out))
    text = "Q: Compute 3+4.\nA: 3+4=7. \\boxed{7}"
    assert AutoTokenizer.from_pretrained(out).tokenize(text) == list(text)
    r = CliRunner().invoke(app, ["model", "train", "tiny-math-moe", "--experts", "4", "--top-k", "5"])
    assert r.exit_code == 2 and "--top-k must lie in [1, --experts]" in r.output


def test_router_replay_refuses_staleness_and_recompute():
    from runners.presets import get_preset

    with pytest.raises(ConfigError, match="router-replay"):
        get_preset("tiny", router_replay=True, staleness=1)
    with pytest.raises(ConfigError, match="router-replay"):
        get_preset("tiny", router_replay=True, gradient_checkpointing=True)
    assert get_preset("tiny", router_replay=True).router_replay


def test_checkpoint_names_are_what_the_shipped_checkpoint_holds():
    """vLLM's weight pushes write a Mixtral's parameters under the checkpoint's names: the same
    keys and values as the safetensors file transformers saved for tiny-math-moe."""
    from safetensors import safe_open

    from bench.models import TINY_MATH_MOE_DIR, load_model, resolve_model

    m = load_model(resolve_model("tiny-math-moe"))
    got = dict(moe.checkpoint_names(m.named_parameters()))
    f = safe_open(str(TINY_MATH_MOE_DIR / "model.safetensors"), "pt")
    assert set(got) == set(f.keys())
    assert all(torch.equal(got[k].detach().bfloat16(), f.get_tensor(k)) for k in f.keys())
    assert "model.layers.2.block_sparse_moe.experts.7.w3.weight" in got
