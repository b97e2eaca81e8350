"""`bench check` (runners/check.py, bench/cli/check.py): its metrics by hand, and end to end on
the embedded default with the shipped contract — every pair holds, and each fault of the
calibration gate's tests (a rollout temperature, RoPE's inv_freq in bf16, a stale lm_head) breaks
a named line at fp16 and at bf16 with the place it enters named; a rollout engine that does not
repeat itself and a fault injected into one layer are found where they are."""

import json
import math
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from bench.cli import app
from bench.cli.check import shipped_contract
from bench.contract import judge_pair, load
from bench.precision import Precision
from runners.check import (bucket_rows, judged_values, layer_table, measure, position_kl, token_metrics,
                           where_it_enters)
from runners.check_config import CheckConfig

L = math.log


def test_token_metrics_by_hand():
    # two sequences: (μ .5, π .4), (μ .25, π .5) and (μ .5 = π .5, then padding); d = log π − log μ
    mu = torch.tensor([[L(.5), L(.25)], [L(.5), 0.0]])
    pi = torch.tensor([[L(.4), L(.5)], [L(.5), 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    d = [L(.8), L(2.0), 0.0]
    # whole distributions over two tokens (the sampled one first)
    dist_mu = torch.tensor([[[.5, .5], [.25, .75]], [[.5, .5], [.5, .5]]]).log()
    dist_pi = torch.tensor([[[.4, .6], [.5, .5]], [[.5, .5], [.9, .1]]]).log()
    m = token_metrics(mu, pi, mask, dist_mu, dist_pi)
    assert m["tokens"] == 3
    assert m["kl_k1_token"] == pytest.approx(-sum(d) / 3)
    assert m["kl_k3"] == pytest.approx(((.8 - 1 - d[0]) + (2 - 1 - d[1])) / 3)
    assert m["chi2_token"] == pytest.approx((.64 + 4 + 1) / 3 - 1)
    assert m["abs_logp_diff_mean"] == pytest.approx((-d[0] + d[1]) / 3)
    assert m["abs_logp_diff_max"] == pytest.approx(L(2.0))
    assert m["token_mult_prob_error"] == pytest.approx((1.25 + 2 + 1) / 3)
    kl1 = .5 * L(.5 / .4) + .5 * L(.5 / .6)
    kl2 = .25 * L(.25 / .5) + .75 * L(.75 / .5)
    assert m["kl_full"] == pytest.approx((kl1 + kl2 + 0) / 3)                 # the padded position is left out
    assert m["tok_kl_max"] == pytest.approx(kl2)                             # sequence 1's largest
    assert m["tok_kl_max_mean"] == pytest.approx(kl2 / 2)                    # (kl2 + 0) / 2 sequences
    assert position_kl(dist_mu, dist_pi)[1, 1].item() == pytest.approx(.5 * L(.5 / .9) + .5 * L(.5 / .1))
    plain = token_metrics(mu, pi, mask)
    assert plain["kl_full"] is None and plain["tok_kl_max"] is None and plain["kl_k3"] == m["kl_k3"]
    # a token μ never draws (probability 0) adds nothing to the KL
    assert position_kl(torch.tensor([[[0.0, -math.inf]]]), torch.tensor([[[L(.5), L(.5)]]])).item() == \
        pytest.approx(L(2.0))


def test_buckets_and_layer_table_by_hand():
    mu = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    pi = torch.tensor([[L(2.0), 0.0], [L(.5), 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    entropy = torch.tensor([[0.05, 2.0], [0.5, 0.0]])
    rows = bucket_rows(mu, pi, mask, torch.tensor([20, 1]), entropy, None)
    assert [(r["bucket"], r["tokens"]) for r in rows["length"]] == [("1–16 tokens", 1), ("17–32 tokens", 2)]
    assert rows["length"][0]["abs_logp_diff_mean"] == pytest.approx(L(2.0))           # the 1-token sequence
    assert [(r["bucket"], r["tokens"]) for r in rows["entropy"]] == [("0–0.1 nats", 1), ("0.1–1 nats", 1),
                                                                      ("≥ 1 nats", 1)]
    assert rows["entropy"][0]["kl_k3"] == pytest.approx(2 - 1 - L(2.0))
    ref = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0, 0.0])}
    roll = {"a": torch.tensor([3.0, 4.5]), "b": torch.tensor([1.0, 0.0])}
    train = {"a": torch.tensor([3.0, 3.0]), "b": torch.tensor([1.0, 0.0])}
    t = layer_table(roll, train, ref)
    assert [r["layer"] for r in t] == ["a", "b"]
    assert t[0]["rollout"] == pytest.approx(0.1) and t[0]["train"] == pytest.approx(0.2)    # ‖Δ‖ / ‖h‖ = 0.5 / 5
    assert t[0]["divergence"] == pytest.approx(0.3) and t[1]["divergence"] == 0.0
    assert layer_table({}, train, ref) == []


# ------------------------------------------------------------------ end to end on tiny-math

CFG = CheckConfig(prompts=16, n=4, threads=1)


def _judge(results):
    terms = load(shipped_contract("tiny-math", "torch"))
    out = {}
    for r in results:
        verdicts = judge_pair(terms, r.pair.name, judged_values(r))
        broken = [v for v in verdicts if not v.ok]
        out[r.pair.name] = (broken, where_it_enters(r, broken))
    return out


def _temperature(eng, rollout):
    generate = eng.generate
    eng.generate = lambda prompts, n, sampling, start=0: generate(prompts, n, replace(sampling, temperature=0.7),
                                                                  start)


def _rope(eng, rollout):
    for name, buf in eng.model.named_buffers():
        if "inv_freq" in name:
            buf.data = buf.data.to(torch.bfloat16)


def _stale_head(eng, rollout):
    """The engine's head holds an older policy (the master's + 0.01 noise), as a reload that
    misses a tied head leaves it (tests/bench/test_calibration.py's fault)."""
    head = eng.model.lm_head
    g = torch.Generator().manual_seed(0)
    w = head.weight.detach().float()
    head.weight = torch.nn.Parameter((w + 0.01 * torch.randn(w.shape, generator=g)).to(head.weight.dtype))


FAULTS = {"temperature": (_temperature, "after the head"),
          "rope": (_rope, "model.rotary_emb.inv_freq is bfloat16"),
          "lm_head": (_stale_head, "the mismatch enters at head")}


@pytest.mark.integration
@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_breaks_a_line_at_fp16_and_bf16_and_says_where(fault):
    hook, where = FAULTS[fault]
    pairs = [Precision("fp16", "fp16"), Precision("bf16", "bf16")]
    got = _judge(measure(CFG, pairs, engine_hook=hook))
    for pair in ("fp16", "bf16"):
        broken, enters = got[pair]
        assert broken, (fault, pair)
        assert where in enters, (fault, pair, enters)
    if fault == "rope":
        assert "buffers" in {v.metric for v in got["bf16"][0]}


@pytest.mark.integration
def test_a_rollout_engine_that_does_not_repeat_itself_fails_the_noise_floor():
    def jitter(eng, rollout):
        generate = eng.generate
        calls = []

        def noisy(*a, **k):
            calls.append(1)
            out = generate(*a, **k)
            for row in out:
                for s in row:
                    s.logprobs = [x + 1e-6 * len(calls) for x in s.logprobs]
            return out
        eng.generate = noisy

    (broken, enters), = _judge(measure(CFG, [Precision("fp16", "fp16")], engine_hook=jitter)).values()
    assert "noise_rollout" in {v.metric for v in broken}
    assert "the rollout engine does not repeat itself" in enters


@pytest.mark.integration
def test_a_fault_injected_into_one_layer_shows_at_that_layer():
    def scale_mlp(eng, rollout):
        with torch.no_grad():
            eng.model.model.layers[1].mlp.down_proj.weight.mul_(1.02)

    (broken, enters), = _judge(measure(CFG, [Precision("fp16", "fp16")], engine_hook=scale_mlp)).values()
    assert "layer:layers.1.mlp" in {v.metric for v in broken}
    assert "layer:layers.0.mlp" not in {v.metric for v in broken}
    assert "the mismatch enters at layers.1.mlp" in enters


@pytest.mark.integration
def test_check_every_pair_with_the_shipped_contract(tmp_path):
    """The README's CI gate: `bench check --dtype all` on main passes with the contract bench ships,
    writes JUnit (a case per pair × line) and stores its report; a missing pair fails closed."""
    from junitparser import JUnitXml
    from sqlalchemy import select

    from bench.store import CheckReport, open_store, session

    url = f"sqlite:///{tmp_path / 'store.db'}"
    xml = tmp_path / "check.xml"
    r = CliRunner().invoke(app, ["check", "--dtype", "all", "--threads", "1", "--junit", str(xml), "--json",
                                 "--db", url])
    data = json.loads(r.stdout)
    assert r.exit_code == 0, [(p["pair"], [v for v in p["verdicts"] if not v["ok"]]) for p in data["pairs"]]
    assert data["ok"] and len(data["pairs"]) == 35
    head32 = {p["pair"]: p["flags"] for p in data["pairs"]}
    assert head32["bf16+head32→bf16"] and head32["bf16→bf16+head32"] and not head32["bf16+head32"]
    (suite,) = list(JUnitXml.fromfile(str(xml)))
    assert suite.failures == 0 and suite.tests == sum(len(p["verdicts"]) for p in data["pairs"]) > 35 * 15
    with session(open_store(url)) as s:
        (rep,) = s.scalars(select(CheckReport)).all()
        assert rep.ok and len(rep.pairs) == 35 and rep.conditions["contract_digest"]
    # a pair the contract has no lines for fails closed, exit 1, the line named
    empty = tmp_path / "empty.toml"
    empty.write_text('version = 1\nmodel = "tiny-math"\nengine = "torch"\n')
    r = CliRunner().invoke(app, ["check", "--dtype", "fp32", "--contract", str(empty), "--prompts", "2", "--n", "1",
                                 "--db", url])
    assert r.exit_code == 1 and "FAIL fp32 (pair): the contract has no lines for fp32 (fails closed)" in r.stdout
    # bad input: exit 2, nothing measured
    r = CliRunner().invoke(app, ["check", "--dtype", "fp32", "--contract", str(tmp_path / "nope.toml"), "--db", url])
    assert r.exit_code == 2 and "no contract file" in r.output


def test_the_noise_floor_by_hand():
    from runners.check import _noise

    inf = math.inf
    a = torch.tensor([[[0.0, -inf], [L(.5), L(.5)]]])
    b = torch.tensor([[[0.0, -inf], [L(.5), L(.5) + 2.0 ** -20]]])        # a multiple of fp32's step there
    assert _noise(a, a.clone(), torch.ones(1, 2)) == 0.0                  # −inf on both sides is equal
    assert _noise(a, b, torch.ones(1, 2)) == 2.0 ** -20
    assert _noise(a, b, torch.tensor([[1.0, 0.0]])) == 0.0              # off the mask
    assert math.isnan(_noise(a, a.masked_fill(a == 0.0, math.nan), torch.ones(1, 2)))


def test_a_contract_of_another_model_or_engine_is_refused(tmp_path):
    other = tmp_path / "other.toml"
    other.write_text('version = 1\nmodel = "tiny-math-moe"\nengine = "torch"\n')
    r = CliRunner().invoke(app, ["check", "--dtype", "fp32", "--contract", str(other), "--db",
                                 f"sqlite:///{tmp_path / 's.db'}"])
    assert r.exit_code == 2 and "the contract of tiny-math-moe with the torch engine" in " ".join(r.output.split())


def test_full_vocabulary_kl_from_a_top_k_is_a_lower_bound_by_hand():
    """μ over four tokens known only at its top 2: KL ≥ Σ_top μ log(μ/π) + r_μ log(r_μ/r_π) (the
    tail as one bucket), equal to the whole KL when the tail is known, below it otherwise."""
    mu = torch.tensor([.5, .3, .15, .05])
    pi = torch.tensor([.4, .4, .1, .1])
    full = float((mu * (mu / pi).log()).sum())
    top2 = torch.tensor([[[L(.5), L(.3), -math.inf, -math.inf]]])
    got = position_kl(top2, pi.log().view(1, 1, 4)).item()
    want = .5 * L(.5 / .4) + .3 * L(.3 / .4) + .2 * L(.2 / .2)
    assert got == pytest.approx(want) and got <= full
    assert position_kl(mu.log().view(1, 1, 4), pi.log().view(1, 1, 4)).item() == pytest.approx(full)


def test_position_kl_one_sequence_at_a_time_equals_the_whole_batch():
    """Taken one sequence at a time (to bound its float64 temporaries) KL is the same bits as over
    the whole [N, T, V] at once, top-k rows (−inf) included."""
    from runners.check import _position_kl

    g = torch.Generator().manual_seed(0)
    mu = torch.randn(3, 5, 50, generator=g).log_softmax(-1)
    mu[1, :, 20:] = -math.inf                               # a top-20 row, as vLLM returns
    pi = torch.randn(3, 5, 50, generator=g).log_softmax(-1)
    assert torch.equal(position_kl(mu, pi), _position_kl(mu, pi))
    assert position_kl(mu[:0], pi[:0]).shape == (0, 5)


def test_nonfinite_log_probs_are_counted_per_side_and_named():
    """A format that overflows (fp16 on Gemma 3 270M measured 2026-12-04: every metric NaN) is
    said so, with how many tokens on which side; tokens off the mask are not counted."""
    import torch

    from bench.cli.mismatch import _pair_line
    from runners.offline_mismatch import nonfinite_counts

    mu = torch.tensor([[-1.0, float("nan"), float("-inf")], [-0.5, -0.1, float("nan")]])
    pi = torch.tensor([[-1.0, -2.0, -3.0], [float("inf"), -0.1, -0.2]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    counts = nonfinite_counts(mu, pi, mask)
    assert counts == {"nonfinite_mu": 2, "nonfinite_pi": 1}
    line = _pair_line("fp16", {"prob_abs_diff_mean": float("nan"), "kl_k1": float("nan"), "tokens": 5, **counts})
    assert line.endswith("— 2 of 5 tokens non-finite in μ (rollout); 1 of 5 tokens non-finite in π (training): "
                         "the format overflows on this model")
    assert "non-finite" not in _pair_line("bf16", {"prob_abs_diff_mean": 1e-3, "kl_k1": 1e-2, "tokens": 5,
                                                   "nonfinite_mu": 0, "nonfinite_pi": 0})


def test_row_chunks_cover_every_row_within_the_budget():
    from runners.check import row_chunks

    assert row_chunks(128, 64, 85) == [slice(0, 128)]                          # tiny-math: one chunk
    chunks = row_chunks(128, 128, 49_152)                                       # SmolLM2: 10 rows a chunk
    assert chunks[0] == slice(0, 10) and chunks[-1] == slice(120, 128) and len(chunks) == 13
    assert row_chunks(3, 128, 262_144, budget=1) == [slice(0, 1), slice(1, 2), slice(2, 3)]   # at least one row


@pytest.mark.integration
def test_a_batch_measured_in_chunks_of_sequences_agrees_with_one_chunk(monkeypatch):
    """A model with a large vocabulary is measured a few sequences at a time (its [N, T, V] rows
    would not fit): the same tokens, the same metrics and layer table up to the scoring forwards'
    batch shapes, the same noise floor."""
    import runners.check as check

    pairs = [Precision("fp32", "fp32"), Precision("fp16", "fp16")]
    cfg = replace(CFG, prompts=6, n=2)
    whole = measure(cfg, pairs)
    monkeypatch.setattr(check, "CHUNK_BYTES", 5 * 64 * 85 * 4)             # at most 5 rows of tiny-math a chunk
    seen = []
    real = check.row_chunks
    monkeypatch.setattr(check, "row_chunks", lambda *a: seen.append(real(*a)) or seen[-1])
    parts = measure(cfg, pairs)
    assert len(seen) == 2 and all(len(c) >= 2 for c in seen)                 # each rollout format in chunks
    for a, b in zip(whole, parts):
        assert a.metrics["tokens"] == b.metrics["tokens"] and a.metrics["noise_train"] == b.metrics["noise_train"]
        for k, v in a.metrics.items():
            assert b.metrics[k] == pytest.approx(v, rel=1e-3, abs=1e-12), k
        assert [r["layer"] for r in a.layers] == [r["layer"] for r in b.layers]
        for x, y in zip(a.layers, b.layers):
            assert y["divergence"] == pytest.approx(x["divergence"], rel=1e-3, abs=1e-12)
    assert parts[0].layers and all(r["divergence"] == 0 for r in parts[0].layers)   # fp32 both sides: bit for bit


@pytest.mark.slow
def test_a_check_measures_on_what_its_contract_was_derived_on(tmp_path):
    """A contract derived at 2 problems × 1 response records it; a check against it measures so
    unless told otherwise, and the stored conditions say so."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    c = tmp_path / "c.toml"
    r = CliRunner().invoke(app, ["check", "--dtype", "fp32", "--prompts", "2", "--n", "1", "--threads", "1",
                                 "--derive-contract", "1", "--contract", str(c), "--db", url])
    assert r.exit_code == 0, r.output
    assert load(c).measured == {"prompts": 2, "n": 1, "max_tokens": 64, "source": "synthetic-hard"}
    r = CliRunner().invoke(app, ["check", "--contract", str(c), "--threads", "1", "--json", "--db", url])
    data = json.loads(r.stdout)
    assert r.exit_code == 0 and [p["pair"] for p in data["pairs"]] == ["fp32"]        # the contract's pairs
    assert {k: data["conditions"][k] for k in ("prompts", "n", "max_tokens", "source")} == load(c).measured
    r = CliRunner().invoke(app, ["check", "--contract", str(c), "--threads", "1", "--n", "2", "--json", "--db", url])
    assert r.exit_code in (0, 1) and json.loads(r.stdout)["conditions"]["n"] == 2      # as told (its maxima may break)
    # widening with repeats measured otherwise is refused before measuring, the file unchanged
    before = c.read_text()
    r = CliRunner().invoke(app, ["check", "--dtype", "fp32", "--n", "2", "--derive-contract", "1", "--contract", str(c),
                                 "--db", url])
    assert r.exit_code == 2 and "derive with the same" in r.output and c.read_text() == before
    # a contract that judges no pair is refused, never an empty pass
    empty = tmp_path / "empty.toml"
    empty.write_text('version = 1\nmodel = "tiny-math"\nengine = "torch"\n[pair.fp16]\nkl_k3 = 1\n')
    r = CliRunner().invoke(app, ["check", "--contract", str(empty), "--db", url])
    assert r.exit_code == 2 and "judges no pair" in r.output
