"""The one base class of user errors.

A `BenchError` is bad input or a state the user can fix: its message is the whole story (what
is wrong and what to write instead). The CLI shows it as one `error:` line and exits 2; every
other exception is a bug (or a failure while working) and shows its traceback, exit 1.
Each stage's own error class (PrecisionError, BuildError, RunError, StoreError, ...) derives
from it; `ConfigError` is a setting out of its bounds (bench/knobs.py).
"""

from __future__ import annotations


def did_you_mean(name: str, choices) -> str:
    """" (did you mean 'x'?)" for the closest of `choices` to a misspelt `name` (difflib's ratio
    ≥ 0.6, case ignored), else ""."""
    import difflib

    lower = {str(c).lower(): str(c) for c in choices}
    close = difflib.get_close_matches(str(name).strip().lower(), list(lower), n=1, cutoff=0.6)
    return f" (did you mean {lower[close[0]]!r}?)" if close else ""


class BenchError(Exception):
    """Bad input: the message says what is wrong and what to do instead (CLI: one line, exit 2)."""


class ConfigError(BenchError, ValueError):
    """A setting out of its declared bounds or of the wrong type; the message names the knob
    (its CLI flag) and the bound."""


class PrecisionError(BenchError, ValueError):
    """A dtype or precision pair that cannot be parsed or run; the message says what to write."""


class SourceError(BenchError, ValueError):
    """A problem source that cannot be read; the message names the problem."""
