"""A run's records (runners/ledger.py): the one writer of a run's rows. What each record does
to the row, the one rewind both trainers resume through (the native trainer's checkpoint load
and verl's follower end in the same rows), the heartbeat and the end."""

import os
import signal
import time

import pytest
from sqlalchemy import select

from bench.precision import Precision
from bench.store import Eval, Run, RunDecision, RunDigest, RunStep, open_store, session
from runners import ledger
from runners.presets import get_preset
from runners.verl_follow import Follower, replay_for_resume
from conftest import add_model_and_build

FP16 = Precision("fp16", "fp16")
SPLIT = {0: 0.5, 5: 0.9, 10: 0.7}          # split accuracy at the evaluations


@pytest.fixture
def store(tmp_path):
    engine = open_store(f"sqlite:///{tmp_path / 's.db'}")
    with session(engine) as s:
        add_model_and_build(s, "b0")
    return engine


def history(store, run_id: str, trainer: str = "native") -> None:
    """Ten steps as either trainer records them: evaluations at 0, 5 and 10, a decision of the
    futility rule at 5 and of the converged rule at 10, digests at every evaluation."""
    with session(store) as s:
        ledger.create(s, run_id, 1, "b0", "grpo", FP16, trainer, "torch",
                      {"preset": "tiny", "max_steps": 20}, None, {})
    for step in range(0, 11):
        metrics = {"reward": step / 10, "kl_k3": 1e-4, **({"eval/split": SPLIT[step]} if step in SPLIT else {})}
        ledger.record_step(store, run_id, step, metrics, wall=float(step),
                           kl_warning_step=None, converged=step == 10)
        if step in SPLIT:
            ledger.record_evaluations(store, run_id, step, {"split": (4, SPLIT[step]), "aime24": (2, 0.1)})
            ledger.record_digest(store, run_id, step, f"d{step}")
    ledger.record_decisions(store, run_id, {"futile": (5, "futile", "low")}, lambda r: False)
    ledger.record_decisions(store, run_id, {"converged": (10, "converged", "bound")}, lambda r: True)


def rows(store, run_id: str) -> dict:
    with session(store) as s:
        run = s.get(Run, run_id)
        return {"run": (run.status, run.step, run.peak_accuracy, run.final_accuracy, run.steps_to_target),
                "steps": list(s.scalars(select(RunStep.step).where(RunStep.run_id == run_id).order_by(RunStep.step))),
                "evals": sorted(s.execute(select(Eval.step, Eval.benchmark).where(Eval.run_id == run_id)).all()),
                "decisions": sorted(s.execute(select(RunDecision.rule, RunDecision.step)
                                              .where(RunDecision.run_id == run_id)).all()),
                "digests": list(s.scalars(select(RunDigest.step).where(RunDigest.run_id == run_id)
                                          .order_by(RunDigest.step)))}


def test_records_set_the_runs_peak_final_step_and_target(store):
    history(store, "r1")
    got = rows(store, "r1")
    assert got["run"] == ("running", 10, 0.9, 0.7, 10)         # peak at 5, final at 10, converged at 10
    assert got["steps"] == list(range(11)) and got["digests"] == [0, 5, 10]
    assert ("converged", 10) in got["decisions"] and ("futile", 5) in got["decisions"]


def test_a_non_finite_metric_is_stored_as_null_and_a_non_finite_score_not_at_all(store):
    history(store, "r1")
    ledger.record_step(store, "r1", 11, {"loss": float("nan"), "grad_norm": float("inf"), "reward": 0.5}, 11.0, None)
    ledger.record_evaluations(store, "r1", 11, {"aime24": (2, float("nan"))})
    with session(store) as s:
        m = s.scalars(select(RunStep).where(RunStep.run_id == "r1", RunStep.step == 11)).one().metrics
        assert m["loss"] is None and m["grad_norm"] is None and m["reward"] == 0.5
        assert not s.scalars(select(Eval).where(Eval.run_id == "r1", Eval.step == 11)).all()


def test_rewind_keeps_what_the_checkpoint_saw(store):
    history(store, "r1")
    kept = ledger.rewind(store, "r1", 7)
    got = rows(store, "r1")
    # the evaluation of step 10 is gone: the peak and final accuracy are those of 0 and 5, no target reached
    assert got["run"] == ("running", 7, 0.9, 0.9, None)
    assert got["steps"] == list(range(8)) == [s for s, _ in kept]
    assert got["digests"] == [0, 5] and got["decisions"] == [("futile", 5)]
    assert {b for s, b in got["evals"]} == {"split", "aime24"} and max(s for s, _ in got["evals"]) == 5


def test_both_trainers_resume_through_one_rewind(store):
    """The native trainer's load_checkpoint and verl's replay_for_resume end in the same rows: peak,
    final accuracy, target, decisions (verl's resume once left the peak and final of the lost steps)."""
    history(store, "native1")
    history(store, "verl1", trainer="verl")
    ledger.rewind(store, "native1", 7)                                    # NativeTrainer.load_checkpoint
    follower = Follower(store, "verl1", get_preset("tiny", eval_every=5, max_steps=20), split_size=8)
    replay_for_resume(follower, 7)
    assert rows(store, "native1") == rows(store, "verl1")
    assert [step for step, _, _ in follower.state.evals] == [5]          # the stop state rebuilt from the kept steps


def test_skip_adds_a_row_for_a_seed_never_started_or_marks_a_started_one(store):
    rid = ledger.skip(store, "b0", "grpo", FP16, {"seed": 2}, "torch", "seed 0 failed")
    history(store, "r2")
    assert ledger.skip(store, "b0", "grpo", FP16, {}, "torch", "seed 0 failed", run_id="r2") == "r2"
    with session(store) as s:
        assert [(r.status, r.seed, r.stop_reason) for r in (s.get(Run, rid), s.get(Run, "r2"))] == [
            ("skipped", 2, "seed 0 failed"), ("skipped", None, "seed 0 failed")]


def test_run_to_end_beats_while_training_and_records_the_end_or_the_failure(store, monkeypatch):
    history(store, "r1")
    with session(store) as s:
        first = s.get(Run, "r1").heartbeat_at

    def train():
        time.sleep(0.5)
        return "converged", "bound reached"

    monkeypatch.setattr(ledger, "HEARTBEAT_S", 0.05)
    ledger.run_to_end(store, "r1", train)
    with session(store) as s:
        run = s.get(Run, "r1")
        assert (run.status, run.stop_reason) == ("converged", "bound reached") and run.heartbeat_at > first

    def broken():
        raise ValueError("disk full")

    history(store, "r3")
    with pytest.raises(ValueError):
        ledger.run_to_end(store, "r3", broken)
    with session(store) as s:
        assert (s.get(Run, "r3").status, s.get(Run, "r3").stop_reason) == ("failed", "ValueError: disk full")


def test_a_sigterm_during_training_is_recorded_as_ctrl_c_and_the_handlers_restored(store):
    history(store, "r4")
    before = signal.getsignal(signal.SIGTERM)

    def killed():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)                              # the handler raises at the next bytecode, long before
        return "converged", "never"

    with pytest.raises(ledger.Terminated):
        ledger.run_to_end(store, "r4", killed)
    with session(store) as s:
        assert (s.get(Run, "r4").status, s.get(Run, "r4").stop_reason) == ("failed", "interrupted")
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_interrupt_while_the_first_is_recorded_is_held_until_the_record_is_made(store, monkeypatch):
    """Ctrl-C twice, or a sweep passing a SIGTERM on to a cell that had the group's: the record of
    the first interrupt is made whole, then the second is raised."""
    history(store, "r5")
    fail = ledger.fail
    # SIGINT handled as from a terminal (a pytest-xdist worker has it ignored, and an ignored one stays so)
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)

    def slow_fail(store_, run_id, e):
        os.kill(os.getpid(), signal.SIGINT)         # arrives in the middle of the record
        time.sleep(0.2)
        fail(store_, run_id, e)

    monkeypatch.setattr(ledger, "fail", slow_fail)

    def broken():
        raise ValueError("disk full")

    try:
        with pytest.raises(KeyboardInterrupt):
            ledger.run_to_end(store, "r5", broken)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)        # ignored (a script's background job): stays so
        history(store, "r6")
        with pytest.raises(ValueError):
            ledger.run_to_end(store, "r6", broken)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old_int)
    with session(store) as s:
        assert (s.get(Run, "r5").status, s.get(Run, "r5").stop_reason) == ("failed", "ValueError: disk full")


def test_an_interrupt_as_a_new_run_commits_is_recorded_against_its_row(store):
    """A Ctrl-C that lands as a new run's row is committed (a sweep interrupting a cell that has just
    started) is held until the row exists, then recorded there: failed, interrupted, resumable,
    where it once left the row `running` with no process behind it; `train` never runs."""
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)     # as from a terminal (see above)
    trained = []

    def create():
        with session(store) as s:
            ledger.create(s, "r7", 1, "b0", "grpo", FP16, "native", "torch", {"preset": "tiny"}, None, {})
            os.kill(os.getpid(), signal.SIGINT)     # arrives before the commit
            time.sleep(0.2)

    try:
        with pytest.raises(KeyboardInterrupt):
            ledger.run_to_end(store, "r7", lambda: trained.append(1) or ("converged", "never"), create)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, old_int)
    assert not trained
    with session(store) as s:
        assert (s.get(Run, "r7").status, s.get(Run, "r7").stop_reason) == ("failed", "interrupted")


def test_a_run_whose_row_could_not_be_made_raises_its_error_and_records_nothing(store):
    def create():
        raise RuntimeError("database is locked")

    with pytest.raises(RuntimeError, match="locked"):
        ledger.run_to_end(store, "r8", lambda: ("converged", "never"), create)
    with session(store) as s:
        assert s.get(Run, "r8") is None
