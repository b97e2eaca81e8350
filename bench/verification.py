"""What a run's re-runs establish, one vocabulary for the report, the pages, the site and JSON.

A stored or imported run is *claimed*: its numbers are what it says. `bench runs verify` re-runs
steps of it and compares every stored number (runners/verify.py): from step 0 (`--steps N`) or
from a checkpoint it kept (`--window A:B`). Against the run's deciding window — the steps whose
re-run re-computes every evaluation the rule that decided its verdict read (bench/verdicts.py
`deciding_window`) — the best re-run that agreed gives its level:

    claimed                      nothing re-run
    first N of M steps re-run    from step 0, ending before the deciding window does
    steps A+1–B of M re-run      a window that misses part of the deciding window
    deciding window re-run       a re-run covering the deciding window
    fully re-run                 a re-run covering every step of the run

A re-run that differed makes the run *re-run differs* whatever else agreed (on another device or
CPU kind only within a tolerance: a looser check, said so). A PASS or FAIL is **verified** only
from *deciding window re-run* up. A window from a kept checkpoint at A proves that the deciding
evaluations follow from the state the run recorded at A; the evaluations before A, which the
rules' state also reads (the peak, that nothing decided earlier), are its claims until a re-run
from step 0 covers them (*fully re-run*).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

CLAIMED, PARTLY, WINDOW, FULLY, DIFFERS = ("claimed", "partly re-run", "deciding window re-run", "fully re-run",
                                           "re-run differs")
LEVELS = (DIFFERS, CLAIMED, PARTLY, WINDOW, FULLY)          # weakest first


@dataclass(frozen=True)
class Level:
    level: str            # one of LEVELS
    text: str             # in words, with its steps
    verified: bool        # deciding window re-run or fully re-run, and no re-run differed

    def to_dict(self) -> dict:
        return asdict(self)


def _digests(v: dict) -> str:
    """", state digests not comparable (scheme 1)" where the re-run could not compare the run's
    state digests (a run stored before digest scheme 2: bench/statedigest.py), else "". Its
    metrics and evaluations were still compared, bit for bit; the level stands."""
    note = v.get("digests")
    return f", state digests {note}" if isinstance(note, str) and note.startswith("not comparable") else ""


def level(run_step: int, window: tuple[int, int] | None, verifications: list[dict]) -> Level:
    """The level of a run of `run_step` steps whose verdict's deciding window is `window` (None:
    no verdict yet, so only a full re-run counts as more than partial), given its verifications
    (dicts with window_start, steps, verdict and first_difference)."""
    differing = [v for v in verifications if v.get("verdict") == "differs"]
    if differing:
        d = differing[0].get("first_difference") or {}
        where = "" if differing[0].get("tolerance") is None else " (on another device or CPU kind)"
        return Level(DIFFERS, f"re-run differs at step {d.get('step', '?')} ({d.get('metric', '?')}){where}", False)
    best = Level(CLAIMED, "claimed (not re-run)", False)
    for v in verifications:
        start, end = int(v.get("window_start") or 0), int(v["steps"])
        if start == 0 and end >= run_step:
            cand = Level(FULLY, f"fully re-run ({run_step} steps{_digests(v)})", True)
        elif window is not None and start <= window[0] and end >= window[1]:
            cand = Level(WINDOW, f"deciding window re-run (steps {start + 1}–{end} of {run_step}{_digests(v)})", True)
        else:
            cand = Level(PARTLY, f"first {end} of {run_step} steps re-run" if start == 0
                         else f"steps {start + 1}–{end} of {run_step} re-run", False)
        if LEVELS.index(cand.level) > LEVELS.index(best.level):
            best = cand
    return best


def cell_text(levels: list[Level]) -> str:
    """A cell over its seeds: "3/3 seeds: deciding window re-run", or the weakest first."""
    if not levels:
        return CLAIMED
    worst = min(levels, key=lambda x: LEVELS.index(x.level))
    if all(x.level == CLAIMED for x in levels):
        return "claimed (not re-run)"
    verified = sum(x.verified for x in levels)
    if worst.level == DIFFERS:
        return f"{sum(x.level == DIFFERS for x in levels)}/{len(levels)} seeds: {worst.text}"
    if verified == len(levels):
        return f"{verified}/{len(levels)} seeds verified ({worst.level})"
    return f"{verified}/{len(levels)} seeds verified; weakest: {worst.text}"
