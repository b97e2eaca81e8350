"""The tolerance contract of `bench check` (bench/contract.py) and its JUnit report
(bench/junit.py): judgments by hand, failing closed, derivation, widening, the TOML round trip
and its refusals, and the XML read back by a JUnit parser."""

import math

import pytest

from bench.contract import Contract, ContractError, Line, derive, dumps, judge_pair, load, widen
from bench.junit import junit_xml

C = Contract(model="tiny-math", engine="torch", pairs={
    "fp16": {"kl_k3": Line("bound", 1e-6), "noise_rollout": Line("bitwise"),
             "token_mult_prob_error": Line("bound", 1e-3), "kl_k1_token": Line("bound", 1e-4)},
    "fp8→fp16": {"kl_k3": Line("bound", 1e-3)}}, margin=4.0, derived="by hand")


def _by_metric(verdicts):
    return {v.metric: v for v in verdicts}


def test_bound_and_bitwise_lines_by_hand():
    got = _by_metric(judge_pair(C, "fp16", {"kl_k3": 9e-7, "noise_rollout": 0.0, "token_mult_prob_error": 1.0005,
                                            "kl_k1_token": -5e-5}))
    assert all(v.ok for v in got.values())                  # 9e-7 ≤ 1e-6; 0 bitwise; |1.0005 − 1| ≤ 1e-3; |−5e-5|
    got = _by_metric(judge_pair(C, "fp16", {"kl_k3": 2e-6, "noise_rollout": 3e-8, "token_mult_prob_error": 1.002,
                                            "kl_k1_token": -2e-4}))
    assert not any(v.ok for v in got.values())
    assert got["kl_k3"].reason == "2e-06 beyond the bound 1e-06"
    assert got["noise_rollout"].reason == "3e-08 differs from 0 (bitwise)"
    assert got["token_mult_prob_error"].reason == "1.002 (ideal 1) beyond the bound 0.001"
    assert got["kl_k1_token"].reason == "-0.0002 beyond the bound 0.0001"                 # a signed metric's size


def test_the_contract_fails_closed():
    got = _by_metric(judge_pair(C, "fp16", {"kl_k3": 1e-7, "new_metric": 0.0}))
    assert not got["new_metric"].ok and "no contract line" in got["new_metric"].reason      # measured, no line
    assert not got["noise_rollout"].ok and got["noise_rollout"].reason.startswith("not measured")   # line, no value
    assert got["kl_k3"].ok
    assert not _by_metric(judge_pair(C, "fp16", {"kl_k3": math.nan}))["kl_k3"].ok           # NaN fails a bound
    assert not _by_metric(judge_pair(C, "fp16", {"noise_rollout": math.inf}))["noise_rollout"].ok
    (only,) = judge_pair(C, "bf16", {"kl_k3": 0.0})
    assert not only.ok and only.metric == "(pair)" and "no lines for bf16" in only.reason
    assert judge_pair(C, "fp16", {"kl_k3": None, "noise_rollout": 0.0, "token_mult_prob_error": 1.0,
                                  "kl_k1_token": 0.0})[0].reason.startswith("not measured")


def test_derive_bounds_each_metric_at_margin_times_its_largest_deviation():
    runs = {"fp16": [{"kl_k3": 1e-7, "noise": 0.0, "tmpe": 1.0, "token_mult_prob_error": 1.0002, "gone": None},
                     {"kl_k3": 3e-7, "noise": 0.0, "tmpe": 0.0, "token_mult_prob_error": 1.0001, "gone": 1.0}]}
    c = derive(runs, 4.0, "tiny-math", "torch", "test")
    lines = c.pairs["fp16"]
    assert lines["kl_k3"] == Line("bound", pytest.approx(1.2e-6))
    assert lines["noise"] == Line("bitwise")
    assert lines["tmpe"] == Line("bound", 4.0)                                # not a known ideal: from 0
    assert lines["token_mult_prob_error"].bound == pytest.approx(4 * 2e-4)    # from its ideal 1
    assert "gone" not in lines                                                # not measured in every repeat
    with pytest.raises(ContractError, match="cannot bound"):
        derive({"fp16": [{"noise": math.inf}]}, 4.0, "tiny-math", "torch", "")


def test_widen_keeps_the_looser_line():
    a = Contract("tiny-math", "torch", {"fp16": {"k": Line("bound", 1.0), "z": Line("bitwise"), "only_a": Line(
        "bitwise")}}, derived="a")
    b = Contract("tiny-math", "torch", {"fp16": {"k": Line("bound", 2.0), "z": Line("bound", 0.5)},
                                        "bf16": {"k": Line("bitwise")}}, derived="b")
    w = widen(a, b)
    assert w.pairs["fp16"] == {"k": Line("bound", 2.0), "z": Line("bound", 0.5), "only_a": Line("bitwise")}
    assert w.pairs["bf16"] == {"k": Line("bitwise")} and w.derived == "a; b"
    with pytest.raises(ContractError, match="cannot widen"):
        widen(a, Contract("other", "torch", {}))


def test_toml_round_trip_and_refusals(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(dumps(C))
    back = load(p)
    assert back.pairs == C.pairs and (back.model, back.engine, back.margin, back.derived) == (
        "tiny-math", "torch", 4.0, "by hand")
    assert back.digest() == C.digest()
    for text, msg in (('version = 2\n', "version 2"), ("version = 1\n[pairs.fp16]\nk = { judgment = 'close' }\n",
                                                       "judgment 'close'"),
                      ("version = 1\n[pairs.fp16]\nk = { judgment = 'bound', bound = inf }\n", "finite bound"),
                      ("version = [\n", "is not TOML")):
        p.write_text(text)
        with pytest.raises(ContractError, match=msg):
            load(p)
    with pytest.raises(ContractError, match="no contract file"):
        load(tmp_path / "missing.toml")


def test_junit_has_a_case_per_line_and_names_the_broken_ones(tmp_path):
    from junitparser import Failure, JUnitXml

    verdicts = judge_pair(C, "fp16", {"kl_k3": 2e-6, "noise_rollout": 0.0, "token_mult_prob_error": 1.0,
                                      "kl_k1_token": 0.0}) + judge_pair(C, "fp8→fp16", {"kl_k3": 1e-4})
    p = tmp_path / "check.xml"
    p.write_text(junit_xml(verdicts, {"model": "tiny-math", "contract_digest": C.digest()}, 1.5,
                           {"fp16": "the mismatch enters at layers.0.mlp"}))
    xml = JUnitXml.fromfile(str(p))
    (suite,) = list(xml)
    assert (suite.name, suite.tests, suite.failures, suite.time) == ("bench check", 5, 1, 1.5)
    cases = {(c.classname, c.name): c for c in suite}
    assert set(cases) == {("bench.check.fp16", m) for m in ("kl_k3", "noise_rollout", "token_mult_prob_error",
                                                              "kl_k1_token")} | {("bench.check.fp8→fp16", "kl_k3")}
    (failure,) = cases[("bench.check.fp16", "kl_k3")].result
    assert isinstance(failure, Failure) and failure.message == "2e-06 beyond the bound 1e-06"
    assert failure.text == "the mismatch enters at layers.0.mlp"
    assert cases[("bench.check.fp8→fp16", "kl_k3")].is_passed
    assert {p.name: p.value for p in suite.properties()}["model"] == "tiny-math"


def test_a_malformed_contract_is_one_message_and_strings_round_trip(tmp_path):
    p = tmp_path / "c.toml"
    for text, msg in (("version = 1\npairs = 3\n", "must be a table of pairs"),
                      ("version = 1\n[pairs]\nfp16 = 1\n", "must be a table of metric lines"),
                      ("version = 1\n[pairs.fp16]\nkl_k3 = 1e-6\n", "write { judgment"),
                      ("version = 1\n[pairs.fp16]\nk = { judgment = 'bound', bound = true }\n", "finite bound")):
        p.write_text(text)
        with pytest.raises(ContractError, match=msg):
            load(p)
    odd = Contract('tiny "math"', "torch", {"fp8→fp16": {"layer:layers.0.mlp": Line("bound", 0.1 + 0.2)}},
                   margin=4.0, derived='seeds "0-4", path all')
    p.write_text(dumps(odd))
    back = load(p)
    assert (back.model, back.derived, back.pairs) == (odd.model, odd.derived, odd.pairs)   # 0.30000000000000004 exact


def test_what_a_contract_was_measured_on_round_trips_and_is_not_mixed(tmp_path):
    on = {"prompts": 32, "n": 4, "max_tokens": 128, "source": "arithmetic"}
    c = derive({"fp16": [{"kl_k3": 1e-6}]}, 4.0, "smollm2-135m", "torch", "today", measured=on)
    p = tmp_path / "c.toml"
    p.write_text(dumps(c))
    assert "[measured]\nprompts = 32\nn = 4\nmax_tokens = 128\nsource = \"arithmetic\"" in p.read_text()
    assert load(p) == c and load(p).measured == on
    other = derive({"fp16": [{"kl_k3": 2e-6}]}, 4.0, "smollm2-135m", "torch", "later", measured={**on, "n": 2})
    with pytest.raises(ContractError, match="derive with the same"):
        widen(c, other)
    old = derive({"fp16": [{"kl_k3": 2e-6}]}, 4.0, "smollm2-135m", "torch", "before")       # no `measured`
    assert widen(old, c).measured == on and widen(c, old).measured == on
    for bad in ("prompts = \"32\"", "prompts = true", "tokens = 3"):
        p.write_text(f'version = 1\nmodel = "m"\nengine = "torch"\n[measured]\n{bad}\n')
        with pytest.raises(ContractError, match="`measured` holds"):
            load(p)


def test_every_shipped_contract_loads_and_says_what_it_was_measured_on():
    from bench.cli.check import CONTRACTS

    files = sorted(CONTRACTS.glob("*.toml"))
    assert {f.name for f in files} >= {"tiny-math.torch.toml", "smollm2-135m.torch.toml", "gemma3-270m.torch.toml"}
    for f in files:
        c = load(f)
        model, engine = f.name.removesuffix(".toml").rsplit(".", 1)
        assert (c.model, c.engine) == (model, engine) and c.derived
        assert set(c.measured) == {"prompts", "n", "max_tokens", "source"}
        assert {"fp32", "bf16"} <= set(c.pairs)
        assert ("fp16" in c.pairs) == (model != "gemma3-270m")     # fp16 overflows on Gemma 3 (docs/results.md)
    smol = load(CONTRACTS / "smollm2-135m.torch.toml")
    assert sum(k.startswith("layer:") for k in smol.pairs["bf16"]) == 63       # embedding, 30 × 2, norm, head
    gemma = load(CONTRACTS / "gemma3-270m.torch.toml")
    assert sum(k.startswith("layer:") for k in gemma.pairs["bf16"]) == 39      # embedding, 18 × 2, norm, head
