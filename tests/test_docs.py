"""The README and the docs site: the generated CLI page is fresh, every relative link resolves, no
link leaves the repository, the README keeps its shape, and the README's picture script draws
from a store."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_cli_reference_is_fresh():
    """docs/cli.md is what docs/gen_cli.py writes from the Typer app today: a command or option
    added, removed or reworded without regenerating the page fails here."""
    gen = _load(DOCS / "gen_cli.py", "gen_cli")
    committed = (DOCS / "cli.md").read_text()
    assert committed == gen.render(), "docs/cli.md is stale: run `python docs/gen_cli.py` and commit it"


def test_cli_reference_lists_every_command():
    import typer

    from bench.cli import app

    root = typer.main.get_command(app)
    ctx = typer.Context(root, info_name="bench")
    text = (DOCS / "cli.md").read_text()
    for name in root.list_commands(ctx):
        assert f"## `bench {name}`" in text


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("md", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_in_the_repository_and_resolve(md: Path):
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)       # code blocks hold no links
    for target in LINK.findall(text):
        assert not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I), f"{md.name}: link leaves the repo: {target}"
        path = target.split("#", 1)[0]
        if not path:
            continue
        dest = (md.parent / path).resolve()
        assert dest.exists(), f"{md.relative_to(ROOT)}: broken link {target}"
        assert ROOT in dest.parents or dest == ROOT, f"{md.name}: link outside the repository: {target}"


def test_readme_shape():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md is {len(lines)} lines (at most 150)"
    code = [ln for ln in lines[:6] if ln.startswith("./bench.sh")]
    assert [c.split()[0:2] for c in code] == [["./bench.sh", "demo"], ["./bench.sh", "test"]], lines[:6]
    text = "\n".join(lines)
    assert "docs/img/demo_split_accuracy.png" in text
    assert "| sanity |" in text or "┃ sanity ┃" in text


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.rglob("*.md"):
        rel = page.relative_to(DOCS).as_posix()
        assert rel in nav, f"docs/{rel} is not in mkdocs.yml's nav"


def test_plot_demo_draws_the_chosen_cells(tmp_path):
    """benchmarks/plot_demo.py on a small store: picks the newest build with both cells, one line
    per run, writes the PNG; a cell missing from every build is one clear message."""
    from bench.store import Build, Eval, Model, Run, open_store, session

    url = f"sqlite:///{tmp_path / 'bench.db'}"
    engine = open_store(url)
    with session(engine) as s:
        m = Model(name="tiny-math", path="/x", weights_hash="h")
        s.add(m)
        s.flush()
        for b in ("old", "new"):
            s.add(Build(id=b, model_id=m.id, source="synthetic", engine="torch", dtype="bf16", k=8, lo=0.2,
                        hi=0.8, seed=0, settings_hash=b, status="complete", n_problems=40, n_kept=20))
        s.flush()
        cells = [("new", "fp16", "fp16"), ("new", "mxfp4", "fp16"), ("new", "bf16", "bf16"), ("old", "fp16", "fp16")]
        for i, (b, r, t) in enumerate(cells):
            s.add(Run(id=f"r{i}", model_id=m.id, build_id=b, algo="pg-seq-is", rollout_dtype=r, train_dtype=t,
                      trainer="native", engine="torch", config={"seed": 0}, status="max_steps", step=2))
            s.flush()
            for step in range(3):
                s.add(Eval(run_id=f"r{i}", step=step, benchmark="split", n=4, score=0.4 + 0.05 * step))
                s.add(Eval(run_id=f"r{i}", step=step, benchmark="synthetic-hard", n=4, score=0.1))
    plot_demo = _load(ROOT / "benchmarks" / "plot_demo.py", "plot_demo")
    pairs = [plot_demo.Precision.parse(d) for d in plot_demo.DEMO_DTYPES]
    build, data = plot_demo.curves(url, "pg-seq-is", pairs, None)
    assert build == "new"
    assert sorted(k[1] for k in data) == ["r0", "r1"]
    assert data[(pairs[0], "r0", 0)] == [(0, 0.4), (1, 0.45), (2, 0.5)]
    out = tmp_path / "img" / "demo.png"
    assert plot_demo.main(["--db", url, "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="no build has runs"):
        plot_demo.main(["--db", url, "--out", str(out), "--dtype", "rollout=int8,train=fp32"])


def test_site_builds_strictly(tmp_path):
    """`mkdocs build --strict` (what ./bench.sh test runs): a broken link or anchor, or a page
    missing from the nav, fails. Without `--quiet`, which would hide the warnings strict counts."""
    import subprocess

    import importlib.util

    from conftest import missing_service

    if not (importlib.util.find_spec("mkdocs") and importlib.util.find_spec("material")):
        missing_service("the docs extra (mkdocs, mkdocs-material) is not installed: pip install -e '.[docs]'")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ,
                                                                      "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stderr[-3000:]


def test_the_module_map_lists_every_module():
    """docs/development.md's module map names every module of the packages (issue 36): a new
    module without a line there fails here."""
    text = (ROOT / "docs" / "development.md").read_text()
    section = text[text.index("## Module map"):text.index("## Knobs and errors")]
    missing = []
    for pkg in ("bench", "bench/cli", "bench/engines", "bench/store", "runners", "leaderboard", "leaderboard/pages",
                "datasets_build"):
        for f in sorted((ROOT / pkg).glob("*.py")):
            if f.name != "__init__.py" and f"`{f.name}`" not in section and f"{f.stem}.py" not in section:
                missing.append(f"{pkg}/{f.name}")
    assert not missing, missing


def test_the_tests_mirror_the_packages():
    """tests/ mirrors the packages (issue 36): a test file lives in tests/<package>/ beside the
    code it tests (tests/bench/engines/ for bench/engines/), its name unique (pytest imports
    test modules by basename); only the suite-wide checks (docs, packaging) sit at the top."""
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    misplaced = [str(f.relative_to(ROOT)) for f in files
                 if f.parent != ROOT / "tests" and not (ROOT / f.parent.relative_to(ROOT / "tests")).is_dir()]
    assert not misplaced, misplaced
    top = sorted(f.name for f in files if f.parent == ROOT / "tests")
    assert top == ["test_docs.py", "test_packaging.py"], top
    names = [f.name for f in files]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
