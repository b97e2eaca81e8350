"""Where the models run: `--device auto|cpu|cuda[:i]` (auto = the first CUDA device when one
is available, else the CPU), whether a device can run a format (`device_supports`), and the
per-step resource numbers the trainer logs.

On CUDA the 16-bit matmuls are the GPU's own (bench/kernels.py upcasts only on CPUs that
lack 16-bit GEMM); everything else (fp32 master weights, fp32 log-softmax, dynamic loss
scaling in fp16, the formats' quantizers) is the same code on either device.
"""

from __future__ import annotations

import functools
import os
import re
import sys

from bench.errors import BenchError


class DeviceError(BenchError, ValueError):
    """A device that cannot be used here; the message says what to write instead."""


def resolve_device(name: str | None = "auto") -> str:
    """`auto` → `cuda` when torch sees a CUDA device, else `cpu`; `cpu`; `cuda` or `cuda:i`
    (refused with one message when CUDA is absent or i is out of range)."""
    import torch

    text = (name or "auto").strip().lower()
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return "cpu"
    m = re.fullmatch(r"cuda(?::(\d+))?", text)
    if not m:
        raise DeviceError(f"unknown device {name!r}; choose auto, cpu, cuda or cuda:i")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA (a CPU-only build)"
        raise DeviceError(f"--device {text}: CUDA is not available on this machine (torch {torch.__version__}, "
                          f"{build}); use --device cpu, or --device auto to take a GPU only when there is one")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise DeviceError(f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                          f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1})")
    return text


def device_supports(dtype: str, device: str = "cpu") -> bool:
    """Whether `device` can run the format: matmuls in its storage dtype (fp16 on old CPUs /
    GPUs may be missing) and, for a W8A8 format, its quantize–matmul."""
    import torch

    from . import formats

    fmt = formats.get(dtype)
    try:
        a = torch.ones(16, 64, dtype=fmt.dtype, device=device)       # K = 64: whole blocks of every format
        ok = bool(torch.isfinite((a @ a.t()).float()).all())
        if ok and fmt.quant is not None:
            ok = bool(torch.isfinite(fmt.matmul(a, *fmt.quantize(a.float())).float()).all())
        return ok
    except (RuntimeError, TypeError):
        return False


def is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def reset_peak_memory(device) -> None:
    """Start a new peak-memory window (CUDA); a CPU process's peak RSS cannot be reset."""
    if is_cuda(device):
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device) -> float:
    """CUDA: the most memory torch allocated on `device` since `reset_peak_memory`
    (torch.cuda.max_memory_allocated); CPU: the process's peak resident set size so far
    (resource.getrusage ru_maxrss), which never decreases. MiB."""
    if is_cuda(device):
        import torch

        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 2 ** 10      # bytes on macOS, KiB on Linux


def resident_mb() -> float:
    """This process's resident set now (MiB; Linux /proc, else the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except OSError:
        return peak_memory_mb("cpu")


def release_free_memory(device) -> None:
    """Hand the C heap's free pages back to the system (glibc `malloc_trim(0)`) after a step on a
    CPU. A step's tensors change shape with its response lengths; glibc keeps the freed blocks of
    tensors under its mmap threshold (which rises to 32 MiB as large blocks are freed) in its
    heaps, fragmented, so the resident set grows step after step though the live tensors do not
    (benchmarks/run_memory.py). Nothing on CUDA or without glibc; no value computed changes."""
    if is_cuda(device) or not sys.platform.startswith("linux"):
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (musl, no libc found); looked up once."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def synchronize(device) -> None:
    """Wait for the device's queued work (for honest timings on CUDA); nothing on a CPU."""
    if is_cuda(device):
        import torch

        torch.cuda.synchronize(device)
