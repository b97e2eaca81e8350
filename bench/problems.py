"""Problem sources: JSONL / parquet / CSV files, `datasets` saved to disk, the paper's data
shipped in bench/data (by name, offline), hub ids, and the synthetic MATH-style problems behind
the embedded `tiny-math` model (bench/synthetic.py). A problem's ids and a split's hash:
bench/problem_ids.py.

Every source yields `Problem(id, problem, answer)`. Ids are stable: the source's own id
column when it has one, else a hash of the problem text. A problem whose normalised text
(whitespace collapsed, case folded) repeats an earlier one is counted once: the first row
stays, and `load_source` reports the repeats (a build records and prints them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from bench.arithmetic import arithmetic_rows
from bench.errors import SourceError
from bench.problem_ids import last_boxed, normalise_text, problem_id
from bench.synthetic import synthetic_examples


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str


@dataclass
class ColumnMap:
    """Which columns of a source hold the id, the problem text and the answer.

    `solution` is used only when `answer` is absent: the answer is then the content of the
    solution's last `\\boxed{}` (how MATH ships its golds)."""

    id: str = "id"
    problem: str = "problem"
    answer: str = "answer"
    solution: str = "solution"


def drop_repeats(problems: list[Problem]) -> tuple[list[Problem], list[dict]]:
    """(problems with each normalised text once, first row kept; one entry per repeated text:
    the kept id, every id that held it, how many rows, and the golds when they disagree)."""
    first: dict[str, int] = {}
    groups: dict[str, list[Problem]] = {}
    unique: list[Problem] = []
    for p in problems:
        key = normalise_text(p.problem)
        if key in first:
            groups.setdefault(key, [unique[first[key]]]).append(p)
            continue
        first[key] = len(unique)
        unique.append(p)
    repeats = []
    for rows in groups.values():
        answers = list(dict.fromkeys(r.answer.strip() for r in rows))
        repeats.append({"id": rows[0].id, "rows": len(rows), "ids": list(dict.fromkeys(r.id for r in rows)),
                        **({"conflicting_answers": answers} if len(answers) > 1 else {})})
    return unique, repeats


# ---------------------------------------------------------------- loading

# The paper's data, shipped in bench/data (MIT, from sail-sg/Precision-RL; see LICENSE and
# SOURCE.md there): name -> file. These names load offline; a local path of the same name wins.
DATA_DIR = Path(__file__).parent / "data"
PACKAGED_SOURCES = {
    "sanity-r1d-1.5b": "sanity_r1d_1p5b.jsonl",   # the paper's perfectible split for R1-Distill-Qwen-1.5B (1,460)
    "aime24": "aime24.jsonl",                     # AIME 2024 (30), the paper's evaluation set
    "amc23": "amc23.jsonl",                       # AMC 2023 (83)
    "math500": "math500.jsonl",                   # MATH-500 (500)
}

# Hub ids that need a subset list (MATH is split by subject on EleutherAI's mirror). AIME24 is
# packaged above; its hub copy is `HuggingFaceH4/aime_2024:train`.
HUB_ALIASES = {
    "math": ("EleutherAI/hendrycks_math", ["algebra", "counting_and_probability", "geometry",
                                            "intermediate_algebra", "number_theory",
                                            "prealgebra", "precalculus"], "test"),
}


def packaged_data_path(name: str) -> Path:
    """The shipped file behind a packaged source name (`aime24`, `amc23`, `math500`,
    `sanity-r1d-1.5b`; case-insensitive). Raises SourceError for any other name."""
    try:
        return DATA_DIR / PACKAGED_SOURCES[name.lower()]
    except KeyError:
        raise SourceError(f"no packaged source {name!r}; packaged: {', '.join(PACKAGED_SOURCES)}") from None


def paper_reference() -> dict:
    """The paper's published results (runs per algorithm and precision pair, offline mismatch,
    inference-only accuracy) and the seeds' QuRL / Jet-RL figures, as shipped in
    bench/data/paper_reference.json."""
    return json.loads((DATA_DIR / "paper_reference.json").read_text(encoding="utf-8"))


@dataclass
class SourceSpec:
    """Where problems come from. `source` is a file path (.jsonl/.json/.parquet/.csv), a
    directory written by `datasets.save_to_disk`, `synthetic[:split]`, a packaged name
    (`sanity-r1d-1.5b`, `aime24`, `amc23`, `math500`: offline), `math`, or a hub id
    (`owner/name`, optionally `owner/name:split`). A local path wins over a packaged name of the
    same spelling, and a packaged name over the hub."""

    source: str
    columns: ColumnMap = field(default_factory=ColumnMap)
    limit: int | None = None
    seed: int = 0


FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def _rows_from_file(path: Path) -> list[dict]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = []
        with path.open(encoding="utf-8") as f:
            if suffix == ".json":
                data = json.load(f)
                return data if isinstance(data, list) else data.get("data", [])
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SourceError(f"{path}:{lineno}: malformed JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise SourceError(f"{path}:{lineno}: each line must be a JSON object")
                rows.append(row)
        return rows
    import pandas as pd

    if suffix == ".parquet":
        return pd.read_parquet(path).to_dict("records")
    if suffix == ".csv":
        return pd.read_csv(path, dtype=str, keep_default_na=False).to_dict("records")
    raise SourceError(f"{path}: unsupported file type {suffix!r} (use .jsonl, .json, .parquet or .csv)")


def _rows_from_hub(name: str) -> list[dict]:
    import datasets

    repo, _, split = name.partition(":")
    subsets: list[str | None] = [None]
    if repo.lower() in HUB_ALIASES:
        repo, subsets, default_split = HUB_ALIASES[repo.lower()]
        split = split or default_split
    rows: list[dict] = []
    try:
        for subset in subsets:
            ds = datasets.load_dataset(repo, subset, split=split or "test")
            rows.extend(ds.to_list())
    except Exception as e:  # network, auth, unknown id: one readable message
        raise SourceError(f"cannot load hub dataset {name!r} ({type(e).__name__}: {e}); offline, give a local "
                          "file or `datasets` directory instead") from None
    return rows


def _to_problems(rows: list[dict], cols: ColumnMap, where: str) -> list[Problem]:
    problems: list[Problem] = []
    bad: list[str] = []
    for i, row in enumerate(rows):
        text = row.get(cols.problem)
        answer = row.get(cols.answer)
        if (answer is None or str(answer).strip() == "") and row.get(cols.solution):
            answer = last_boxed(str(row[cols.solution]))
        if not isinstance(text, str) or not text.strip():
            bad.append(f"row {i}: no {cols.problem!r} text")
            continue
        if answer is None or str(answer).strip() == "":
            bad.append(f"row {i}: no answer (column {cols.answer!r} or a \\boxed{{}} in {cols.solution!r})")
            continue
        pid = row.get(cols.id)
        pid = str(pid) if pid not in (None, "") else problem_id(text)
        problems.append(Problem(pid, text, str(answer)))
    if bad:
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise SourceError(f"{where}: {len(bad)} bad row(s): {shown}")
    if not problems:
        raise SourceError(f"{where}: no problems")
    return problems


def _check_ids(problems: list[Problem], where: str) -> list[Problem]:
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise SourceError(f"{where}: duplicate id {dup!r}")
    return problems


def load_problems(spec: SourceSpec) -> list[Problem]:
    """Read a source into problems, each normalised text once. Raises SourceError with one
    readable message."""
    return load_source(spec)[0]


def drawn_by_seed(source: str) -> bool:
    """Whether `source` is generated from its seed (`arithmetic[:LEVELS]`, `synthetic[:SPLIT]`,
    `synthetic-hard`), so that another seed draws other problems; a file, a packaged set or a
    hub dataset reads the same rows whatever the seed."""
    return source.partition(":")[0] in ("arithmetic", "synthetic") or source == "synthetic-hard"


def load_source(spec: SourceSpec) -> tuple[list[Problem], dict]:
    """(problems, duplicate check): the problems with each normalised text once (the first row
    kept; `limit` counts these) and {"rows": rows read, "problems": problems kept, "repeated":
    texts that repeat, "extra_rows": rows dropped as repeats, "groups": one entry per repeated
    text among the problems returned (see `drop_repeats`)}. Rows that repeat a text may share
    an id; different texts under one id are an error."""
    src = spec.source
    if drawn_by_seed(src):              # arithmetic[:LEVELS], synthetic[:SPLIT], synthetic-hard
        kind, _, rest = src.partition(":")
        if kind == "arithmetic":
            rows = arithmetic_rows(rest, spec.limit, seed=spec.seed)
        else:
            split = "synthetic-hard" if src == "synthetic-hard" else (rest or "test")
            rows = synthetic_examples(split, spec.limit or 300, seed=spec.seed)
        return _checked(_to_problems(rows, ColumnMap(), src), None, src)
    path = Path(src)
    if path.is_dir():
        import datasets

        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as e:
            raise SourceError(f"{path}: not a dataset saved with save_to_disk ({e})") from None
        if isinstance(ds, datasets.DatasetDict):
            ds = ds["test"] if "test" in ds else ds[next(iter(ds))]
        rows = ds.to_list()
    elif path.exists():
        rows = _rows_from_file(path)
    elif src.lower() in PACKAGED_SOURCES:
        rows = _rows_from_file(packaged_data_path(src))
    elif src.lower() in HUB_ALIASES or (re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+(:\w+)?", src)
                                        and path.suffix.lower() not in FILE_SUFFIXES):
        rows = _rows_from_hub(src)
    else:
        raise SourceError(f"unknown source {src!r}: not a file, a dataset directory, 'synthetic', 'arithmetic', "
                          "a packaged name "
                          f"({', '.join(PACKAGED_SOURCES)}) or a hub id")
    return _checked(_to_problems(rows, spec.columns, src), spec.limit, src)


def _checked(problems: list[Problem], limit: int | None, where: str) -> tuple[list[Problem], dict]:
    n_rows = len(problems)
    unique, groups = drop_repeats(problems)
    unique = _check_ids(unique, where)
    if limit:
        unique = unique[:limit]
        kept = {p.id for p in unique}
        groups = [g for g in groups if g["id"] in kept]
    return unique, {"rows": n_rows, "problems": len(unique), "repeated": len(groups),
                    "extra_rows": sum(g["rows"] - 1 for g in groups), "groups": groups}
