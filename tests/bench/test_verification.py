"""Verification levels (bench/verification.py) and the deciding window they are measured against
(bench/verdicts.py `deciding_window`), by hand."""

from bench import verdicts
from bench.verification import CLAIMED, DIFFERS, FULLY, PARTLY, WINDOW, Level, cell_text, level

CFG = {"eval_every": 5, "max_steps": 80, "stop": {"futility": True, "plateau": False, "hold": 3, "target": 0.95,
                                                   "confidence": 0.9, "futility_window": 10}}


def _ev(status, step, scores, **kw):
    return verdicts.Evidence(status=status, step=step, config=CFG, problems=200,
                             evals=[(5 * i, a, 4) for i, a in enumerate(scores)], **kw)


def test_deciding_windows_by_hand():
    # converged at 60 on its last 3 evaluations (50, 55, 60, pooled 0.97): re-run 46–60, from the state at 45
    rising = [0.5 + 0.045 * i for i in range(10)] + [0.97] * 3
    ev = _ev("converged", 60, rising)
    assert verdicts.decide(ev).rule == "converged" and verdicts.deciding_window(ev) == (45, 60)
    # futile at its 10th evaluation (steps 0–45, all 0.6): from the start
    ev = _ev("futile", 45, [0.6] * 10)
    assert verdicts.decide(ev).rule == "futile" and verdicts.deciding_window(ev) == (0, 45)
    # collapsed: from its peak's evaluation (step 25) on, so from the state at 20
    fall = [0.5, 0.55, 0.6, 0.62, 0.64, 0.65, 0.5, 0.3]
    ev = _ev("collapsed", 35, fall)
    d = verdicts.decide(ev)
    assert d.rule == "collapsed" and verdicts.deciding_window(ev, d) == (20, 35)
    # the calibration gate: step 0; a run that claims no end: none
    assert verdicts.deciding_window(_ev("miscalibrated", 0, [], calibration={"ok": False})) == (0, 0)
    assert verdicts.deciding_window(_ev("running", 10, [0.5, 0.5, 0.5])) is None


def _v(start, end, verdict="bit-identical", **kw):
    return {"window_start": start, "steps": end, "verdict": verdict, "first_difference": None, "tolerance": None,
            **kw}


def test_levels_by_hand():
    window = (40, 55)                         # a 55-step run converged on 41–55
    assert level(55, window, []) == Level(CLAIMED, "claimed (not re-run)", False)
    assert level(55, window, [_v(0, 3)]) == Level(PARTLY, "first 3 of 55 steps re-run", False)
    assert level(55, window, [_v(45, 55)]) == Level(PARTLY, "steps 46–55 of 55 re-run", False)
    assert level(55, window, [_v(0, 3), _v(40, 55)]) == Level(WINDOW, "deciding window re-run (steps 41–55 of 55)",
                                                              True)
    assert level(55, window, [_v(40, 55), _v(0, 55)]) == Level(FULLY, "fully re-run (55 steps)", True)
    bad = _v(40, 55, "differs", first_difference={"step": 50, "metric": "eval split"})
    assert level(55, window, [_v(0, 55), bad]) == Level(DIFFERS, "re-run differs at step 50 (eval split)", False)
    assert level(55, None, [_v(0, 20)]).level == PARTLY          # no verdict yet: only a full re-run is more
    assert level(55, None, [_v(0, 55)]).verified
    # a run stored before digest scheme 2: every value bit-identical, its digests not comparable; the level
    # stands and says so
    old = _v(0, 55, digests="not comparable (scheme 1)")
    assert level(55, window, [old]) == Level(FULLY, "fully re-run (55 steps, state digests not comparable "
                                                    "(scheme 1))", True)
    assert level(55, window, [_v(40, 55, digests="not comparable (scheme 1)")]).text == (
        "deciding window re-run (steps 41–55 of 55, state digests not comparable (scheme 1))")
    assert level(55, window, [_v(0, 55, digests="not compared (another device or CPU kind)")]).text == \
        "fully re-run (55 steps)"


def test_cell_texts_by_hand():
    w, f, c = (Level(WINDOW, "deciding window re-run (steps 41–55 of 55)", True),
               Level(FULLY, "fully re-run (55 steps)", True), Level(CLAIMED, "claimed (not re-run)", False))
    assert cell_text([w, f]) == "2/2 seeds verified (deciding window re-run)"
    assert cell_text([w, c]) == "1/2 seeds verified; weakest: claimed (not re-run)"
    assert cell_text([c, c]) == "claimed (not re-run)"
    assert cell_text([w, Level(DIFFERS, "re-run differs at step 50 (eval split)", False)]) == \
        "1/2 seeds: re-run differs at step 50 (eval split)"
