"""Grading on math-verify, safe in threads, Ray workers and process pools.

math-verify's own timeouts use SIGALRM, which fails silently off the main thread (verl #3407:
whole runs trained on all-zero rewards). Here its timeouts are off and every parse/verify runs
in a pebble process pool whose per-task timeout kills the worker. Verdicts are cached by
(extracted answer, gold): with 40 rollouts per problem only ~9% of pairs are unique.

Verdicts: `correct`, `wrong`, `timeout`, `unparseable` (no `\\boxed{}` in the response, or
its content does not parse), each with a reason. Golds are normalised (`normalise`) and
wrapped in `$…$`, then `\\boxed{}`, before parsing: raw, 160 of the paper's 1,460 golds give
nothing.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Sequence

from .knobs import knob
from .problem_ids import last_boxed

CORRECT, WRONG, TIMEOUT, UNPARSEABLE = "correct", "wrong", "timeout", "unparseable"


@dataclass(frozen=True)
class Verdict:
    status: str               # correct | wrong | timeout | unparseable
    reason: str
    extracted: str | None     # content of the response's last \boxed{}

    @property
    def correct(self) -> bool:
        return self.status == CORRECT

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------- pure pieces (run in workers)

def normalise(answer: str) -> str:
    """What math-verify trips on, removed from golds and answers alike: surrounding whitespace
    and a trailing period, thin-space thousands separators (`20,\\!000`), and spaces around + − = (`a + b + c` parses
    to `a +`)."""
    answer = answer.strip().rstrip(".").strip().replace(",\\!", "").replace("\\!", "")
    return re.sub(r"\s*([+\-=])\s*", r"\1", answer)


@lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    """The gold parsed (None when it does not): once per worker, not once per answer graded
    against it (the pairs of one problem share their gold)."""
    from math_verify import parse

    gold = normalise(gold)
    for text in (f"${gold}$", f"\\boxed{{{gold}}}"):
        parsed = parse(text, parsing_timeout=None, fallback_mode="no_fallback")
        if parsed:
            return parsed
    return None


@lru_cache(maxsize=16384)
def _parse_answer(extracted: str):
    from math_verify import parse

    return parse(f"\\boxed{{{normalise(extracted)}}}", parsing_timeout=None) or None


def _grade_pair(extracted: str, gold: str) -> tuple[str, str]:
    """(status, reason) for one extracted answer against one gold; runs in a worker."""
    from math_verify import verify

    g = _parse_gold(gold)
    if g is None:
        return UNPARSEABLE, f"gold {gold!r} does not parse"
    a = _parse_answer(extracted)
    if a is None:
        return UNPARSEABLE, f"answer {extracted[:80]!r} does not parse"
    ok = normalise(extracted) == normalise(gold) or verify(g, a, timeout_seconds=None)
    return (CORRECT, "equivalent") if ok else (WRONG, f"{str(a[0])[:80]} != {str(g[0])[:80]}")


def _gold_parses(gold: str) -> bool:
    return _parse_gold(gold) is not None


def extract(response: str) -> str | None:
    """The content of the response's last `\\boxed{}` (one box only: two boxes are never glued,
    Math-Verify #44); None when there is none or its braces do not balance."""
    return last_boxed(response)


# ------------------------------------------------------------- the pool

@lru_cache(maxsize=None)
def _warm() -> None:
    """Make this process ready to grade, once: silence math-verify's warning that its own
    timeouts are off (they are: the pool's hard timeout replaces them), then grade one pair
    that needs sympy, since a process's first verdict builds math-verify's LaTeX parser and
    sympy's caches (~0.1 s on an idle 2-core CPU, over a second on a loaded one). The grader's
    process warms before its pool forks, so workers start warm; a worker that did not inherit
    it (a start method other than fork) warms as its pool initializer. Pebble's hard timeout
    counts from a task's acknowledgement, after the initializer, so a cold start never counts
    against the first answer a worker grades, e.g. in the worker started after a hostile answer
    killed one (a cold first verdict timed out at 1 s on a loaded CI machine)."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _grade_pair("0.5", r"\frac{1}{2}")


def _apply_all(fn, args_list: list[tuple]) -> list:
    """fn over a chunk of items in one worker; an item's exception becomes its result."""
    out = []
    for a in args_list:
        try:
            out.append(fn(*a))
        except Exception as e:  # sympy errors may not pickle: send their text
            out.append(RuntimeError(f"{type(e).__name__}: {e}"))
    return out


@dataclass
class GradeConfig:
    """The grader's settings as `bench grade` takes them, each a knob (bench/knobs.py: the
    command's options are generated from these fields and checked by `check`)."""

    timeout: float = knob(5.0, help="Hard per-answer timeout.", unit="seconds", gt=0)
    workers: int | None = knob(None, help="Grader processes (default: up to 2).", unit="processes", ge=1)


class Grader:
    """Grades (response, gold) pairs in a process pool with a hard per-answer timeout.

    Usable as a context manager; `close()` stops the workers."""

    def __init__(self, workers: int | None = None, timeout: float = 5.0, max_answer_chars: int = 2000,
                 chunk: int = 32):
        # math-verify (sympy, the LaTeX grammar) is imported and warmed in this process before
        # the pool forks its workers, so they start with it: a pool's first verdicts come ~0.6 s
        # sooner on a 2-core CPU (0.75 → 0.15 s for a new grader and 16 answers), paid once per
        # process, not by every worker of every grader (a sweep's runs, the test suite's)
        _warm()
        from pebble import ProcessPool

        self.timeout = timeout
        self.max_answer_chars = max_answer_chars
        self.chunk = chunk
        self.workers = workers or min(2, os.cpu_count() or 1)
        self._pool = ProcessPool(max_workers=self.workers, initializer=_warm)
        self.cache: dict[tuple[str, str], Verdict] = {}
        self.hits = 0

    def __enter__(self) -> "Grader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None

    def _run(self, fn, args_list: list[tuple]) -> list:
        """Run fn over args in the pool; each result is the value or the raised exception.
        Items travel in chunks (one task per item costs more in IPC than grading it); a chunk
        that exceeds the timeout or kills its worker is graded again item by item, each with
        its own hard timeout, so a hostile answer costs at most twice the timeout."""
        size = max(1, min(self.chunk, -(-len(args_list) // (4 * self.workers))))
        chunks = [args_list[i:i + size] for i in range(0, len(args_list), size)]
        futures = [self._pool.schedule(_apply_all, args=(fn, c), timeout=self.timeout) for c in chunks]
        out = []
        for c, f in zip(chunks, futures):
            try:
                out.extend(f.result())
            except Exception:
                out.extend(self._run_each(fn, c))
        return out

    def _run_each(self, fn, args_list: list[tuple]) -> list:
        futures = [self._pool.schedule(fn, args=a, timeout=self.timeout) for a in args_list]
        out = []
        for f in futures:
            try:
                out.append(f.result())
            except FutureTimeout:
                out.append(TimeoutError(f"no verdict within {self.timeout:g}s"))
            except Exception as e:  # a crash in sympy or the worker: never a silent zero
                out.append(e)
        return out

    def grade(self, responses: Sequence[str], golds: Sequence[str]) -> list[Verdict]:
        if len(responses) != len(golds):
            raise ValueError("responses and golds differ in length")
        keys: list[tuple[str, str] | Verdict] = []
        todo: dict[tuple[str, str], None] = {}
        for resp, gold in zip(responses, golds):
            ext = extract(resp)
            if ext is None:
                keys.append(Verdict(UNPARSEABLE, "no \\boxed{} in response", None))
                continue
            if len(ext) > self.max_answer_chars:
                keys.append(Verdict(UNPARSEABLE, f"boxed answer longer than {self.max_answer_chars} chars", ext[:80]))
                continue
            key = (ext, gold.strip())
            keys.append(key)
            if key in self.cache or key in todo:
                self.hits += 1
            else:
                todo[key] = None
        for key, res in zip(todo, self._run(_grade_pair, list(todo))):
            if isinstance(res, TimeoutError):
                v = Verdict(TIMEOUT, str(res), key[0])
            elif isinstance(res, Exception):
                v = Verdict(UNPARSEABLE, f"grader error: {type(res).__name__}: {res}"[:200], key[0])
            else:
                v = Verdict(res[0], res[1], key[0])
            self.cache[key] = v
        return [k if isinstance(k, Verdict) else self.cache[k] for k in keys]

    def unparseable_golds(self, golds: Sequence[str]) -> list[str]:
        """The golds that do not parse (or time out while parsing): list and exclude them."""
        uniq = list(dict.fromkeys(g.strip() for g in golds))
        res = self._run(_gold_parses, [(g,) for g in uniq])
        return [g for g, ok in zip(uniq, res) if ok is not True]
