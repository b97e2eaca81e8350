"""The reward function bench hands to verl (`reward.custom_reward_function.path`): bench's
grader, so verl's Ray workers grade exactly as the native trainer does, in a process pool
with hard timeouts (no SIGALRM: math-verify's own timeout fails silently off the main
thread, verl #3407). Needs only bench's grader and math-verify in verl's environment."""

from __future__ import annotations

_GRADER = None


def _grader():
    global _GRADER
    if _GRADER is None:
        from bench.grading import Grader

        _GRADER = Grader()
    return _GRADER


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """{"score": 1.0 | 0.0, "acc": bool, "pred": the extracted answer or ""}."""
    (v,) = _grader().grade([solution_str], [str(ground_truth)])
    return {"score": float(v.correct), "acc": v.correct, "pred": v.extracted or ""}
