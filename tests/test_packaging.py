"""Every Python package of the checkout ships: a non-editable install takes only the packages
setuptools discovers from pyproject.toml (bench/cli was once missing, which only an editable
install hid), and every directory of Python code under the four top-level packages must be one
(a directory of modules without __init__.py is not discovered: namespaces are off)."""

import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from setuptools import find_packages

ROOT = Path(__file__).parent.parent
TOPS = ("bench", "datasets_build", "runners", "leaderboard")


def test_every_package_is_discovered_from_pyproject():
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find.get("namespaces") is False
    shipped = set(find_packages(str(ROOT), include=find["include"]))
    code_dirs = {str(p.parent.relative_to(ROOT)).replace("/", ".")
                 for top in TOPS for p in (ROOT / top).rglob("*.py")}
    assert code_dirs - shipped == set(), f"directories of code that would not ship: {sorted(code_dirs - shipped)}"
    assert {p.split(".")[0] for p in shipped} == set(TOPS)            # nothing else (tests, benchmarks, tools)
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert set(data) <= shipped, f"package data of packages that do not ship: {sorted(set(data) - shipped)}"


def test_no_library_function_is_longer_than_eighty_lines():
    """The house rule (docs/development.md): a function past 80 lines is split by concern first.
    Migrations (generated revisions) are not library code."""
    import ast

    root = Path(__file__).parents[1]
    long = []
    for package in ("bench", "runners", "leaderboard", "datasets_build"):
        for f in sorted((root / package).rglob("*.py")):
            if "migrations" in f.parts:
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                    long.append(f"{f.relative_to(root)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


# ------------------------------------------------------------------ the GPU recipe of docs/your-model.md
# No CUDA machine runs bench's CI, so the page's installs are checked by pip's own resolver against
# the package registry: `pip install --dry-run` resolves each environment's requirements exactly as
# the page writes them (metadata only, nothing installed).

def _recipe_environments() -> dict[str, list[str]]:
    """{environment: the requirement words of its `pip install` lines} in docs/your-model.md's
    install section (the `--no-deps -e .` of bench into verl's environment left out: no resolution)."""
    import re
    import shlex

    page = (ROOT / "docs" / "your-model.md").read_text()
    install = page.split("## 1. Install", 1)[1].split("\n## ", 1)[0]
    envs: dict[str, list[str]] = {}
    for block in re.findall(r"```\n(.*?)```", install, re.S):
        for line in block.splitlines():
            words = shlex.split(line.split("#", 1)[0].split("&&")[-1])
            if len(words) < 3 or words[0] not in ("pip", ".venv-verl/bin/pip") or words[1] != "install" \
                    or "--no-deps" in words:
                continue
            env = ".venv-verl" if words[0].startswith(".venv-verl") else ".venv"
            envs.setdefault(env, []).extend(str(ROOT) + w[1:] if w.startswith(".[") else w for w in words[2:])
    return envs


def _resolver(tmp_path: Path) -> str:
    """A throwaway environment's python with a current pip: pip 25 and newer read a wheel's
    metadata on its own (PEP 658) where older ones download the wheel (GBs of CUDA libraries)."""
    import subprocess
    import sys

    env = tmp_path / "resolver"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
    python = str(env / "bin" / "python")
    _pip(python, ["install", "--quiet", "pip>=25"])
    return python


def _pip(python: str, args: list[str]):
    import subprocess

    from conftest import missing_service

    r = subprocess.run([python, "-m", "pip", *args, "--disable-pip-version-check"], capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0 and ("NewConnectionError" in r.stderr or "Network is unreachable" in r.stderr):
        missing_service(f"no package registry: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-3000:]


def _resolve(python: str, requirements: list[str], report: Path) -> dict[str, str]:
    """{distribution: version} pip's resolver picks for `requirements` (a dry run: nothing installed)."""
    import json

    _pip(python, ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), *requirements])
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}


@pytest.mark.registry
def test_the_gpu_recipe_resolves(tmp_path):
    """The one-GPU environment and verl's resolve as docs/your-model.md writes them: a CUDA build of
    torch (it pulls NVIDIA's libraries), the vLLM that verl 0.9.1 pins in both, and in verl's a
    transformers below 5.11."""
    envs = _recipe_environments()
    assert set(envs) == {".venv", ".venv-verl"}, envs
    python = _resolver(tmp_path)
    # the two resolutions wait on the registry about half the time: side by side 62 s, in turn 110 s (Zen 3)
    with ThreadPoolExecutor(2) as pool:
        gpu, verl = pool.map(lambda env: _resolve(python, envs[env], tmp_path / f"{env[1:]}.json"),
                             (".venv", ".venv-verl"))
    assert gpu["bench"] == "0.1.0" and any(name.startswith("nvidia-") for name in gpu), sorted(gpu)
    assert verl["verl"] == "0.9.1" and any(name.startswith("nvidia-") for name in verl)
    assert gpu["vllm"] == verl["vllm"] and gpu["torch"] == verl["torch"], (gpu["vllm"], verl["vllm"])
    major, minor = (int(x) for x in verl["transformers"].split(".")[:2])
    assert (major, minor) < (5, 11)
