"""A problem's identity and gold: a stable id for a problem without one, the text duplicates are
judged on, the gold a MATH-style solution holds (its last `\\boxed{}`), and the content hash of a
split (its ids and golds), which builds, runs and bundles record."""

from __future__ import annotations

import hashlib
import json
import re


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
