"""Every Python package of the checkout ships: a non-editable install takes only the packages
setuptools discovers from pyproject.toml (bench/cli was once missing, which only an editable
install hid), and every directory of Python code under the four top-level packages must be one
(a directory of modules without __init__.py is not discovered: namespaces are off)."""

import tomllib
from pathlib import Path

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
