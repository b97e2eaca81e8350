"""`--device auto|cpu|cuda[:i]`: resolution, one clear refusal where CUDA is absent (build, run,
sweep, mismatch), and on a CPU-only machine `bench run --device cpu` stores the very steps of a
run without the flag (same seed) even when told CUDA is there, with the device in the run's
provenance and the step's peak memory and tokens/s; micro-batches, activation checkpointing and
the built-in engine's batch from the command line."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
import torch
from sqlalchemy import select
from typer.testing import CliRunner

from bench.cli import app
from bench.device import DeviceError, peak_memory_mb, resolve_device
from bench.machine_metrics import MACHINE_METRICS as TIMING
from bench.store import Run, RunStep, open_store, session

NO_CUDA = not torch.cuda.is_available()


def test_resolve_device():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == resolve_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DeviceError, match="unknown device"):
        resolve_device("gpu")
    assert peak_memory_mb("cpu") > 10                     # this process's peak RSS, MiB


TRIM = """
import torch
from bench.device import release_free_memory, resident_mb
blocks = [torch.ones(24 * 1024) for _ in range(600)]     # 56 MiB of 96 KiB blocks: glibc's heap, not mmap
kept = blocks[49::50]                # a live block every 4.7 MiB: free() can trim no top past it
del blocks
before = resident_mb()
release_free_memory("cpu")
print(before, resident_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's")
@pytest.mark.slow
def test_release_free_memory_hands_free_heap_pages_back():
    """Freed tensors between live ones stay resident in glibc's heap until malloc_trim(0) gives
    their pages back: ~50 MiB freed around 12 live blocks must mostly leave the resident set."""
    before, after = map(float, subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True,
                                              check=True).stdout.split())
    assert before - after > 30, (before, after)


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1", "CUDA:0"])
def test_cuda_without_cuda_is_one_clear_error(name):
    with pytest.raises(DeviceError) as e:
        resolve_device(name)
    assert "CUDA is not available" in str(e.value) and "--device cpu" in str(e.value)


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("args", [
    ["run", "--algo", "grpo", "--device", "cuda"],
    ["sweep", "--algo", "grpo", "--dtype", "fp32", "--device", "cuda"],
    ["build", "--model", "tiny-math", "--device", "cuda:0"],
    ["mismatch", "--dtype", "fp16", "--device", "cuda"],
])
def test_every_command_refuses_cuda_without_cuda(args, tmp_path):
    r = CliRunner().invoke(app, [*args, "--db", f"sqlite:///{tmp_path}/s.db"])
    assert r.exit_code == 2, r.output
    assert "error:" in r.stderr and "CUDA is not available on this machine" in r.stderr
    assert "Traceback" not in r.output
    assert not (tmp_path / "s.db").exists()                              # refused before anything is written


def _steps(url: str, run_id: str) -> list[dict]:
    with session(open_store(url)) as s:
        rows = s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step)).all()
        return [{k: v for k, v in r.metrics.items() if not k.startswith(TIMING)} for r in rows]


@pytest.mark.integration
@pytest.mark.skipif(not NO_CUDA, reason="a run without the flag is a CPU run only where CUDA is absent")
def test_device_cpu_gives_the_steps_of_a_run_without_the_flag(tmp_path, monkeypatch):
    """Without the flag (auto) this machine runs on its CPU; `--device cpu` must give those very
    steps even where CUDA is present: its run sees a CUDA device (torch.cuda.is_available faked
    True), so a flag lost on the way (auto again) would put the run on a GPU that is not there."""
    # the emulated 16-bit kernels on every CPU: native bf16 GEMMs (AMX) round by their blocking, so
    # micro-batches moved k3 by 23% there, against ~3% emulated
    monkeypatch.setenv("BENCH_CPU_16BIT", "none")
    url = f"sqlite:///{tmp_path}/s.db"
    cli = CliRunner()
    r = cli.invoke(app, ["build", "--model", "tiny-math", "--limit", "48", "--k", "8", "--engine", "torch", "--dtype",
                         "fp32", "--band", "0.1", "0.9", "--threads", "1", "--json", "--db", url])
    assert r.exit_code == 0, r.output
    build = json.loads(r.stdout)["build_id"]
    base = ["run", "--algo", "grpo", "--dtype", "bf16", "--build", build, "--max-steps", "2", "--prompts-per-step",
            "4", "--samples-per-prompt", "4", "--eval-every", "2", "--eval-split-m", "1", "--seed", "3",
            "--threads", "1", "--json", "--db", url, "--checkpoint-dir", str(tmp_path / "ck")]
    runs = {}
    for name, extra in [("plain", []), ("cpu", ["--device", "cpu"]),
                        ("micro", ["--device", "cpu", "--max-tokens-per-microbatch", "120",
                                   "--gradient-checkpointing", "--rollout-max-batch", "5", "--max-steps", "1"])]:
        with monkeypatch.context() as m:
            if name != "plain":
                m.setattr(torch.cuda, "is_available", lambda: True)
                assert resolve_device("auto") == "cuda" and resolve_device("cpu") == "cpu"
            r = cli.invoke(app, [*base, *extra])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads(r.stdout)["id"]
    plain, cpu = _steps(url, runs["plain"]), _steps(url, runs["cpu"])
    assert len(plain) == 2 and plain == cpu                              # the same bits, step by step
    with session(open_store(url)) as s:
        for rid in runs.values():
            assert s.get(Run, rid).provenance["device"] == "cpu"
        micro = s.get(Run, runs["micro"])
        assert micro.config["max_tokens_per_microbatch"] == 120 and micro.config["gradient_checkpointing"] is True
        assert micro.config["rollout_max_batch"] == 5
        assert micro.status == "max_steps", micro.stop_reason
        step = s.scalars(select(RunStep).where(RunStep.run_id == runs["plain"])).first().metrics
    assert step["peak_memory_mb"] > 0 and step["train_tokens_per_s"] > 0 and step["micro_batches"] == 1
    assert 0 < step["rss_mb"] <= step["peak_memory_mb"]             # kept after the trim, within the peak
    m = _steps(url, runs["micro"])[0]
    assert m["micro_batches"] > 2
    # one update per batch: the first step's forward is π_old in both, so the rollouts are identical; μ and
    # π_old in bf16 depend on the GEMM shapes (decode rows 5 vs 16, micro-batches), a few % of k3 (measured 3%)
    assert m["reward"] == plain[0]["reward"] and m["kl_k3"] == pytest.approx(plain[0]["kl_k3"], rel=1e-1)


def test_sync_statistic_of_a_large_model_keeps_a_sample(monkeypatch):
    """rollout_update_to_step of a model with more than TRACK_SAMPLE linear weights is the
    median over a fixed sample (its fp32 copy on the device stays small); the fraction moved
    still counts every weight."""
    import copy

    import bench.model_formats as fm
    from bench import formats
    from bench.models import load_model, resolve_model

    model = load_model(resolve_model("tiny-math"))
    full = fm.RolloutWeights(copy.deepcopy(model), formats.get("int8"), track=True)
    monkeypatch.setattr(fm, "TRACK_SAMPLE", 20_000)
    sampled = fm.RolloutWeights(copy.deepcopy(model), formats.get("int8"), track=True)
    assert 20_000 <= sum(v.numel() for v in sampled.prev.values()) < 21_000
    assert sum(v.numel() for v in full.prev.values()) > 600_000
    g = torch.Generator().manual_seed(0)
    new = [(n, p.detach() + 1e-3 * torch.randn(p.shape, generator=g)) for n, p in model.named_parameters()]
    a, b = full.load(new, track=True), sampled.load(new, track=True)
    assert a["rollout_weights_moved"] == b["rollout_weights_moved"]
    assert b["rollout_update_to_step"] == pytest.approx(a["rollout_update_to_step"], rel=0.05)


def test_every_format_runs_on_the_cpu():
    """`device_supports` probes each format's storage GEMM and quantize–matmul on whole blocks of
    every block format (mxfp4's 32 included: a 16-wide probe refused it as a bad input)."""
    from bench import formats
    from bench.device import device_supports

    assert [f for f in formats.FORMATS if not device_supports(f, "cpu")] == []


def test_cpu_detection_without_an_x86_flag_list():
    """The 16-bit path where /proc/cpuinfo has no x86 `flags` line (issue 37): Arm Linux reads its
    `Features`, macOS (no /proc/cpuinfo) its sysctl keys, and a machine offering neither takes the
    emulated kernels; all with the detection input faked."""
    from bench.kernels import cpu_features, native_16bit

    def no_sysctl(key):
        raise AssertionError("sysctl asked although /proc/cpuinfo answered")

    x86 = cpu_features("fpu sse2 avx2 avx512f avx512_bf16", None, no_sysctl)
    assert native_16bit(x86) == {"bf16"}
    graviton3 = cpu_features(None, "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm",
                             no_sysctl)
    assert native_16bit(graviton3) == {"bf16", "fp16"}
    graviton2 = cpu_features(None, "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp", no_sysctl)
    assert native_16bit(graviton2) == {"fp16"}
    m2 = {"hw.optional.arm.FEAT_BF16": "1", "hw.optional.arm.FEAT_FP16": "1"}
    assert native_16bit(cpu_features(None, None, m2.get)) == {"bf16", "fp16"}
    m1 = {"hw.optional.arm.FEAT_BF16": "0", "hw.optional.arm.FEAT_FP16": "1"}
    assert native_16bit(cpu_features(None, None, m1.get)) == {"fp16"}
    assert native_16bit(cpu_features(None, None, lambda key: None)) == frozenset()      # nothing to read


def test_cpu_name_carries_the_x86_family_and_model(monkeypatch):
    """A virtual machine's model name may be the vendor's alone ("AMD EPYC" for a Zen 4 and a
    Zen 5 alike): the family and model numbers tell the two apart in provenance and in every
    benchmark's printout; an Arm /proc/cpuinfo (no family line) keeps the name as it is."""
    from bench import kernels
    from bench.provenance import cpu_name, cpu_summary

    zen5 = {"model name": "AMD EPYC", "cpu family": "26", "model\t": "2", "flags": "avx2 avx512_bf16"}
    monkeypatch.setattr(kernels, "cpuinfo_field", zen5.get)
    monkeypatch.delenv("BENCH_CPU_16BIT", raising=False)
    assert cpu_name() == "AMD EPYC (family 26, model 2)"
    assert cpu_summary().startswith("AMD EPYC (family 26, model 2), ") and cpu_summary().endswith(
        " cores, 16-bit flags: avx2, avx512_bf16")
    arm = {"model name": "Neoverse-V1", "Features": "fp asimd bf16"}
    monkeypatch.setattr(kernels, "cpuinfo_field", arm.get)
    assert cpu_name() == "Neoverse-V1"
    assert cpu_summary().endswith("16-bit flags: bf16")
