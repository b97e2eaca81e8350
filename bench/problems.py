"""Problem sources: JSONL / parquet / CSV files, `datasets` saved to disk, the paper's data
shipped in bench/data (by name, offline), hub ids, and the synthetic MATH-style generator
behind the embedded `tiny-math` model.

Every source yields `Problem(id, problem, answer)`. Ids are stable: the source's own id
column when it has one, else a hash of the problem text. A problem whose normalised text
(whitespace collapsed, case folded) repeats an earlier one is counted once: the first row
stays, and `load_source` reports the repeats (a build records and prints them).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from bench.errors import BenchError


class SourceError(BenchError, ValueError):
    """A problem source that cannot be read; the message names the problem."""


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


def problem_id(text: str) -> str:
    """Stable id for a problem without one: the first 12 hex digits of sha1(text)."""
    return hashlib.sha1(text.strip().encode("utf-8")).hexdigest()[:12]


def normalise_text(text: str) -> str:
    """The text duplicates are judged on: runs of whitespace made one space, case folded."""
    return " ".join(text.split()).casefold()


def split_hash(pairs) -> str:
    """Content hash of a split: sha256 (hex) of the compact JSON array of [id, gold answer]
    pairs sorted by id (UTF-8, no whitespace). Equal hashes mean the same problems with the
    same golds, whatever store or machine built them."""
    canon = json.dumps(sorted([str(i), str(a)] for i, a in pairs), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


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


_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None if absent
    or unbalanced. Searched from the end for "box" (in both commands: `\\boxed` 1 character
    after the backslash, `\\fbox` 2), so a long response costs what its tail costs."""
    end = len(text)
    while True:
        p = text.rfind("box", 0, end)
        if p < 1:
            return None
        m = _BOX_OPEN.match(text, p - 1) or (_BOX_OPEN.match(text, p - 2) if p >= 2 else None)
        if m:
            break
        end = p + 2                     # the next "box" starts before p
    i = j = m.end()
    depth = 1
    while j < len(text):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
        j += 1
    return None


# ---------------------------------------------------------------- synthetic tiny-math

SYNTHETIC_SPLITS = ("train", "test", "synthetic-hard")
SYNTHETIC_KINDS = ("add", "sub", "mul", "two-step")


def _synthetic_item(kind: str, rng: random.Random) -> tuple[str, str, str]:
    """One problem: (kind, problem text, worked solution ending in \\boxed{answer})."""
    if kind == "add":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return kind, f"Compute {a}+{b}.", f"{a}+{b}={a + b}. \\boxed{{{a + b}}}"
    if kind == "sub":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return kind, f"Compute {a}-{b}.", f"{a}-{b}={a - b}. \\boxed{{{a - b}}}"
    if kind == "mul":
        a, b = rng.randint(2, 29), rng.randint(2, 9)
        return kind, f"Compute {a}*{b}.", f"{a}*{b}={a * b}. \\boxed{{{a * b}}}"
    if kind == "two-step":
        return (kind, *_two_step(rng.randint(2, 29), rng.randint(2, 9), rng.randint(0, 99)))
    raise ValueError(kind)


def _two_step(a: int, b: int, c: int) -> tuple[str, str]:
    p = a * b
    return f"Compute {a}*{b}-{c}.", f"{a}*{b}={p}. {p}-{c}={p - c}. \\boxed{{{p - c}}}"


def _is_test(problem: str, test_fraction: float) -> bool:
    """Train/test assignment by hash of the text, so a problem never lands in both."""
    return int(hashlib.sha1(problem.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < test_fraction


# The supervised training pool of the shipped tiny-math weights (bench/tinymath.py TrainConfig
# defaults): synthetic_examples("train", SFT_POOL, seed=SFT_SEED, distinct=False).
SFT_POOL = 20000
SFT_SEED = 0
# synthetic-hard's difficulty knob: a*b at least this. Base accuracy of the first 64 (fp32 avg@4,
# T=0.6): >= 180 → 0.19–0.23, >= 182 → 0.13, >= 190 → 0.08–0.11, >= 200 → 0.06–0.08.
HARD_MIN_PRODUCT = 182


@functools.lru_cache(maxsize=1)
def _hard_candidates(test_fraction: float = 0.1) -> tuple[tuple[int, int, int], ...]:
    """Every (a, b, c) of synthetic-hard, in a fixed order: two-step problems "Compute a*b-c."
    at the hard end of the trained range (a*b >= HARD_MIN_PRODUCT: the largest products, a
    three-digit minuend; a in 21..29, b in 7..9, c in 0..99; 1,422 problems), held out twice
    over: on the train side of the train/test hash (never in the test split, so never in a
    build's split) and not in the supervised pool the shipped weights were trained on (so
    never seen by the model). Operands outside the trained range (a >= 30, c >= 100, b >= 10)
    are no use: the model scores 0–4% there, and RL on the split cannot reach them."""
    sft = {r["problem"] for r in synthetic_examples("train", SFT_POOL, seed=SFT_SEED, distinct=False)}
    out = []
    for a in range(2, 30):
        for b in range(2, 10):
            if a * b < HARD_MIN_PRODUCT:
                continue
            for c in range(100):
                text = _two_step(a, b, c)[0]
                if not _is_test(text, test_fraction) and text not in sft:
                    out.append((a, b, c))
    return tuple(out)


def _synthetic_hard(n: int, seed: int) -> list[dict]:
    """The first `n` of a seeded shuffle of `_hard_candidates()` (so the first 64 stay the
    first 64 whatever `n`)."""
    cands = list(_hard_candidates())
    if n > len(cands):
        raise SourceError(f"cannot draw {n} distinct synthetic synthetic-hard problems (there are {len(cands)})")
    random.Random(f"synthetic-hard:{seed}").shuffle(cands)
    out = []
    for a, b, c in cands[:n]:
        text, sol = _two_step(a, b, c)
        out.append({"id": f"syn-synthetic-hard-{problem_id(text)}", "kind": "two-step", "problem": text,
                    "solution": sol, "answer": last_boxed(sol)})
    return out


def synthetic_examples(split: str, n: int, seed: int = 0, test_fraction: float = 0.1,
                       distinct: bool = True) -> list[dict]:
    """`n` synthetic problems of `split` ("train", "test" or "synthetic-hard"), with kind,
    worked solution and answer. Deterministic in (split, n, seed); kinds cycle evenly.
    `distinct=False` draws with repeats (a training pool larger than the small kinds allow).

    `synthetic-hard`, the tiny preset's stand-in for AIME, is held-out two-step problems from
    the hardest end of the trained range (see `_hard_candidates`). The shipped base model
    solves 0.125–0.141 of the first 64 (the tiny preset's benchmark: avg@4 at T=0.6, top-p 0.95,
    64 tokens, torch engine, the trainer's eval seeds for steps 0/10/20; fp32 0.125/0.137/0.137,
    bf16 0.129/0.141/0.137, fp16 0.125/0.137/0.137). It fails mostly at the second step, the
    three-digit subtraction, which training on a split of the same kinds improves: pg-seq-is in
    fp32 on the default tiny build (tiny preset, 60 steps) read 0.125, 0.148, 0.148, 0.117,
    0.145, 0.191, 0.176 at steps 0, 10, …, 60 while split accuracy rose 0.49 → 0.81 (each
    reading ±0.02 of sampling noise)."""
    if split not in SYNTHETIC_SPLITS:
        raise SourceError(f"unknown synthetic split {split!r}; choose one of {', '.join(SYNTHETIC_SPLITS)}")
    if split == "synthetic-hard":
        return _synthetic_hard(n, seed)
    rng = random.Random(f"{split}:{seed}")
    kinds = list(SYNTHETIC_KINDS)
    seen: set[str] = set()
    out: list[dict] = []
    misses = {k: 0 for k in kinds}
    turn = 0
    while len(out) < n:
        if not kinds:
            raise SourceError(f"cannot draw {n} distinct synthetic {split} problems")
        kind, text, sol = _synthetic_item(kinds[turn % len(kinds)], rng)
        fresh = not (distinct and text in seen)
        if _is_test(text, test_fraction) != (split == "test"):
            fresh = False
        if not fresh:
            misses[kind] += 1
            if misses[kind] > 2000:          # this kind has no distinct problems left: drop it
                kinds.remove(kind)
            continue
        misses[kind] = 0
        turn += 1
        seen.add(text)
        out.append({"id": f"syn-{split}-{problem_id(text)}", "kind": kind, "problem": text,
                    "solution": sol, "answer": last_boxed(sol)})
    return out


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


def load_source(spec: SourceSpec) -> tuple[list[Problem], dict]:
    """(problems, duplicate check): the problems with each normalised text once (the first row
    kept; `limit` counts these) and {"rows": rows read, "problems": problems kept, "repeated":
    texts that repeat, "extra_rows": rows dropped as repeats, "groups": one entry per repeated
    text among the problems returned (see `drop_repeats`)}. Rows that repeat a text may share
    an id; different texts under one id are an error."""
    src = spec.source
    if src == "synthetic" or src.startswith("synthetic:") or src == "synthetic-hard":
        split = "synthetic-hard" if src == "synthetic-hard" else (src.partition(":")[2] or "test")
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
        raise SourceError(f"unknown source {src!r}: not a file, a dataset directory, 'synthetic', a packaged name "
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
