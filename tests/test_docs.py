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
    test modules by basename); only the suite-wide checks (docs, packaging, the order of the
    suite's files: tests/xdist_order.py) sit at the top."""
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    misplaced = [str(f.relative_to(ROOT)) for f in files
                 if f.parent != ROOT / "tests" and not (ROOT / f.parent.relative_to(ROOT / "tests")).is_dir()]
    assert not misplaced, misplaced
    top = sorted(f.name for f in files if f.parent == ROOT / "tests")
    assert top == ["test_docs.py", "test_packaging.py", "test_xdist_order.py"], top
    names = [f.name for f in files]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


# What the pages say about statuses, formats and the demo, checked against the code that decides it
# (issue: docs that contradicted bench/statuses.py, bench/formats.py and bench.sh).

_VERDICT_WORD = re.compile(r"(?<![\w-])(PASS|FAIL|UNDECIDED)(?![\w-])")
_TICKED = re.compile(r"`([^`\n]+)`")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _prose(md: Path) -> str:
    """The page without its fenced code blocks (commands, not claims)."""
    return re.sub(r"```.*?```", "", md.read_text(), flags=re.S)


def _table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.lstrip().startswith("|")]


def _status_claims(text: str) -> list[tuple[str, str, str]]:
    """(status, verdict the text gives it, where) for each place that pairs a status with a
    verdict: a table row whose first cell names the status in backticks and whose later cells
    say PASS / FAIL / UNDECIDED (the leftmost counts); `VERDICT (status` as in "FAIL (max_steps
    at 80)"; `status` (VERDICT); and the statuses listed after "a FAIL status ("."""
    from bench.statuses import STATUSES

    claims = []
    for row in _table_rows(text):
        names = _TICKED.findall(row[0]) if row else []
        rest = " | ".join(row[1:])
        m = _VERDICT_WORD.search(rest)
        claims += [(n, m.group(1), " | ".join(row)[:120]) for n in names if m and n in STATUSES]
    for m in re.finditer(r"(?<![\w-])(PASS|FAIL|UNDECIDED) \(`?([a-z_]+)`?\b", text):
        if m.group(2) in STATUSES:
            claims.append((m.group(2), m.group(1), m.group(0)))
    for m in re.finditer(r"`([a-z_]+)` \((PASS|FAIL|UNDECIDED)\)", text):
        if m.group(1) in STATUSES:
            claims.append((m.group(1), m.group(2), m.group(0)))
    for m in re.finditer(r"FAIL status(?:es)?\s*\(([^);]*)", text):
        for word in re.findall(r"[a-z_]+", m.group(1)):
            if word in STATUSES:
                claims.append((word, "FAIL", m.group(0)[:120]))
    return claims


def _status_table_words(text: str) -> list[str]:
    """The backticked words of the first column of every table headed `| status |`, and those
    after "status" in a row's first cell (`status `futile`, `skipped``)."""
    words, in_status_table = [], False
    for line in text.splitlines():
        if not line.lstrip().startswith("|"):
            in_status_table = False
            continue
        first = line.strip().strip("|").split("|")[0].strip()
        if first == "status":
            in_status_table = True
            continue
        if in_status_table or first.startswith("status `"):
            words += [w for w in _TICKED.findall(first) if re.fullmatch(r"[a-z_]+", w)]
    return words


@pytest.mark.parametrize("md", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_status_words_and_verdicts_agree_with_statuses(md: Path):
    """A status a page tabulates is one of bench/statuses.py's, and the verdict a page gives it
    is the one statuses.py gives it (`max_steps` is UNDECIDED, never FAIL)."""
    from bench.statuses import STATUSES, verdict

    text = _prose(md)
    unknown = [w for w in _status_table_words(text) if w not in STATUSES]
    assert not unknown, f"{md.name}: not a status of bench/statuses.py: {unknown}"
    wrong = [f"{s}: {v} in {where!r}, statuses.py says {verdict(s)}" for s, v, where in _status_claims(text)
             if verdict(s) != v]
    assert not wrong, f"{md.name}: {wrong}"


def _gate_says_failed(text: str) -> list[str]:
    """Paragraphs about the calibration gate that say it ends a run `failed`."""
    return [p.strip()[:160] for p in re.split(r"\n\s*\n", text)
            if re.search(r"calibration", p, re.I)
            and re.search(r"\bends?\s+(?:the run\s+|a run\s+|it\s+)?`?failed`?(?!\s+(?:to|by))", p)]


def test_the_calibration_gate_ends_a_run_miscalibrated():
    """The step-0 calibration gate ends a run `miscalibrated` (a FAIL), not `failed` (an error,
    no verdict): bench/statuses.py."""
    from bench.statuses import MISCALIBRATED, verdict

    bad = {md.name: hits for md in _pages() if (hits := _gate_says_failed(_prose(md)))}
    assert not bad, bad
    assert verdict(MISCALIBRATED) == "FAIL"
    assert f"ends `{MISCALIBRATED}`" in (DOCS / "training.md").read_text()


# a format name as prose writes it: nvfp4, NVFP4, `fp8`; not the BF16 of AVX512-BF16, nor fp8_per_channel
_FORMAT = re.compile(r"(?<![\w+=-])`?((?:bf16|fp16)\+(?:head|router)32|fp32|bf16|fp16|fp8|int8|nvfp4|mxfp4)`?"
                     r"(?![\w+→=-])", re.I)
_LIST_SEP = re.compile(r"\s*(?:,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+|/)\s*")


def _format_lists(text: str) -> list[list[str]]:
    """Runs of three or more format names that only list separators (`,`, `and`, `or`, `/`)
    join: "fp32, bf16, fp16, fp8, int8, nvfp4", "{fp32, bf16, …}", and "`fp16`, `fp8` (W8A8
    e4m3), `nvfp4` (W4A4)": a gloss in parentheses after a name is blanked first."""
    text = re.sub(_FORMAT.pattern + r"(\s\([^()\n]*\))", lambda m: m.group(0)[:m.start(2) - m.start()]
                  + " " * len(m.group(2)), text, flags=re.I)
    lists, run, end = [], [], None
    for m in _FORMAT.finditer(text):
        if run and _LIST_SEP.fullmatch(text[end:m.start()]):
            run.append(m.group(1).lower())
        else:
            if len(set(run)) >= 3:
                lists.append(run)
            run = [m.group(1).lower()]
        end = m.end()
    if len(set(run)) >= 3:
        lists.append(run)
    return lists


@pytest.mark.parametrize("md", [p for p in _pages() if p.name != "results.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_format_lists_name_every_registered_format(md: Path):
    """A list of formats that names nvfp4 names mxfp4 too (docs/results.md is exempt: its lists
    are what was measured on a date), so a list written before mxfp4 was registered fails."""
    text = _prose(md)
    short = [", ".join(lst) for lst in _format_lists(text) if "nvfp4" in lst and "mxfp4" not in lst]
    assert not short, f"{md.name}: format lists without mxfp4: {short}"


@pytest.mark.parametrize("md", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_backticked_format_names_are_registered(md: Path):
    """Every format name a page puts in backticks is in bench/formats.py's registry (or an alias):
    `fp8`, `rollout=nvfp4,train=fp16`, `nvfp4→fp16`, `bf16;fp16`, `all16` pass; `fp4` would not."""
    from bench.formats import canonical

    looks_like_format = re.compile(r"(?:[a-z]*fp\d+|bf\d+|int\d+)(?:\+[a-z]+\d+)?", re.I)
    unknown = []
    for code in _TICKED.findall(md.read_text()):
        for piece in re.split(r"[;,→\s]+|\b(?:rollout|train)=", code):
            piece = piece.strip().strip("\"'")
            if looks_like_format.fullmatch(piece):
                try:
                    canonical(piece)
                except Exception:
                    unknown.append(f"{piece} in `{code}`")
    assert not unknown, f"{md.name}: formats bench/formats.py does not know: {unknown}"


def _demo_branch() -> str:
    text = (ROOT / "bench.sh").read_text()
    start = text.index("\n  demo)")
    return text[start:text.index(";;", start)].replace("\\\n", " ")


def _demo_dtypes(verb: str) -> list[str]:
    """The display names of the cells of the demo's `bench VERB --dtype "..."` line in bench.sh."""
    from bench.precision import parse_list

    line = next(ln for ln in _demo_branch().splitlines() if ln.strip().startswith(f"bench {verb} "))
    return sorted(p.name for p in parse_list(re.search(r'--dtype "([^"]+)"', line).group(1)))


def _sections(text: str) -> list[tuple[str, str]]:
    parts = re.split(r"(?m)^(#+ .*)$", text)
    return [("", parts[0])] + list(zip(parts[1::2], parts[2::2]))


def _demo_claims(text: str) -> list[str]:
    """The sentences (table rows, picture captions) that say what the demo trains: in a section
    about the demo or naming it, and naming a cell, a control or what it trains; a sentence about
    the offline mismatch (`bench mismatch`), or one about what the demo ran before ("until", "left the demo"), is
    not such a claim."""
    claims = []
    for heading, body in _sections(re.sub(r"```.*?```", "", text, flags=re.S)):
        demo_section = "demo" in heading.lower()
        for para in re.split(r"\n\s*\n", body):
            lines = para.splitlines()
            units = lines if lines and lines[0].lstrip().startswith("|") else \
                re.split(r"(?<=[.!?])\s+(?=[A-Z*`(\[!])", " ".join(lines))
            for s in units:
                if not (demo_section or re.search(r"\bdemo\b", s, re.I)):
                    continue
                if not re.search(r"\b(?:trains?|cells?|controls?)\b", s, re.I):
                    continue
                if re.search(r"\b(?:offline|until|left|no longer|before)\b", s, re.I):
                    continue
                claims.append(s)
    return claims


def _demo_page_errors(text: str, cells: list[str], mismatch: list[str]) -> list[str]:
    from bench.precision import parse_list

    trained = {f for c in cells for f in c.split("→")}
    errors = []
    for s in _demo_claims(text):
        extra = {m.lower() for m in _FORMAT.findall(s)} - trained
        if extra:
            errors.append(f"the demo does not train {sorted(extra)}: {s[:160]!r}")
    for heading, body in _sections(text):
        if "demo" not in heading.lower():
            continue
        for block in re.findall(r"```.*?```", body, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                m = re.match(r"\s*bench (sweep|mismatch) .*--dtype \"([^\"]+)\"", line)
                if m:
                    got = sorted(p.name for p in parse_list(m.group(2)))
                    want = cells if m.group(1) == "sweep" else mismatch
                    if got != want:
                        errors.append(f"bench {m.group(1)} --dtype {got}, bench.sh runs {want}")
    return errors


DEMO_PAGES = ("docs/quickstart.md", "docs/concepts.md", "docs/index.md", "README.md")


@pytest.mark.parametrize("page", DEMO_PAGES)
def test_the_demo_trains_what_the_pages_say(page: str):
    """The demo's cells as the pages describe them are those bench.sh's `demo)` branch sweeps
    (pg-seq-is at fp16 and rollout=mxfp4,train=fp16), and a demo command a page prints is the one
    bench.sh runs: no page claims an nvfp4 or bf16 cell the demo no longer trains."""
    cells, mismatch = _demo_dtypes("sweep"), _demo_dtypes("mismatch")
    assert cells == ["fp16", "mxfp4→fp16"], cells      # the controls the pages describe
    errors = _demo_page_errors((ROOT / page).read_text(), cells, mismatch)
    assert not errors, f"{page}: {errors}"


def test_adding_an_algorithm_works_as_the_page_says(monkeypatch):
    """docs/adding-an-algorithm.md's three blocks, run: its row joins the table, its loss registers
    under that name, and its by-hand test passes against the helpers of tests/runners/test_corrections.py."""
    import runners.algos as algos
    from bench.algorithms import SPECS, Algorithm

    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "adding-an-algorithm.md").read_text(), re.S)
    row, loss, test = blocks
    spec = eval(row, {"Algorithm": Algorithm})
    monkeypatch.setitem(SPECS, spec.name, spec)
    monkeypatch.setattr(algos, "REGISTRY", dict(algos.REGISTRY))
    exec(loss, dict(vars(algos)))
    assert spec.name in algos.REGISTRY and spec.name not in ("pg-seq-tis", "grpo-token-tis")
    helpers = _load(ROOT / "tests" / "runners" / "test_corrections.py", "_corrections_helpers")
    ns = dict(vars(helpers))
    exec(test, ns)
    ns[re.search(r"def (test_\w+)", test).group(1)]()


# the quickstart's commands, run as written at small sizes (the options a command repeats take the
# last value, so the sizes are appended): a command a page shows that no longer runs fails here
_SMALL = {"build": ["--limit", "12", "--k", "4", "--band", "0", "1"], "mismatch": ["--limit", "2", "--n", "2"],
          "sweep": ["--max-steps", "2", "--eval-every", "2", "--prompts-per-step", "2", "--samples-per-prompt", "2",
                    "--jobs", "1"], "report": []}


def _quickstart_commands() -> list[list[str]]:
    import shlex

    text = (DOCS / "quickstart.md").read_text().split("## The demo, step by step", 1)[1]
    block = re.search(r"```\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    return [shlex.split(line.split("#", 1)[0])[1:] for line in block.splitlines() if line.startswith("bench ")]


@pytest.mark.integration
def test_the_quickstarts_commands_run_at_small_sizes(tmp_path, monkeypatch):
    """docs/quickstart.md's step-by-step demo, each command as the page writes it, in one store:
    the build, the offline mismatch of every format it names, the two cells and the report that
    lists them."""
    from typer.testing import CliRunner

    from bench.cli import app

    monkeypatch.setenv("BENCH_HOME", str(tmp_path))
    url = f"sqlite:///{tmp_path / 's.db'}"
    commands = _quickstart_commands()
    assert [c[0] for c in commands] == ["build", "mismatch", "sweep", "report"], commands
    for words in commands:
        r = CliRunner().invoke(app, [*words, *_SMALL[words[0]], "--db", url])
        assert r.exit_code == 0, (words, r.output)
    assert "pg-seq-is" in r.stdout and "mxfp4→fp16" in r.stdout and "fp16" in r.stdout, r.stdout
