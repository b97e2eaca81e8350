"""The run statuses (bench/statuses.py): one table, and what the sweep, resume and the
leaderboard read from it."""

from datetime import datetime, timedelta

from bench import statuses


def test_every_named_status_is_a_row_and_every_row_a_verdict():
    names = {statuses.RUNNING, statuses.CONVERGED, statuses.PLATEAUED, statuses.COLLAPSED, statuses.FUTILE,
             statuses.DIVERGED, statuses.MISCALIBRATED, statuses.MAX_STEPS, statuses.FAILED, statuses.SKIPPED,
             statuses.INTERRUPTED, statuses.EVALUATED}
    assert names == set(statuses.STATUSES)
    assert all(s.verdict in statuses.VERDICTS and s.name == k for k, s in statuses.STATUSES.items())
    assert [k for k, s in statuses.STATUSES.items() if s.verdict == "PASS"] == ["converged"]


def test_finished_resumable_and_the_verdict():
    assert set(statuses.FINISHED) == {"converged", "plateaued", "collapsed", "futile", "diverged", "miscalibrated",
                                      "max_steps", "evaluated"}
    assert set(statuses.RESUMABLE) == {"running", "failed", "interrupted"}
    assert statuses.NOT_IN_CELLS == ("evaluated",) and "interrupted" not in statuses.STORED
    assert not set(statuses.FINISHED) & set(statuses.RESUMABLE)
    for status, want in (("converged", "PASS"), ("running", "RUNNING"), ("max_steps", "UNDECIDED"),
                         ("failed", "NO VERDICT"), ("interrupted", "NO VERDICT"),
                         ("evaluated", "NO VERDICT"), ("miscalibrated", "FAIL"), ("diverged", "FAIL"),
                         ("futile", "FAIL"),
                         (None, "NO VERDICT"), ("no-such-status", "NO VERDICT")):
        assert statuses.verdict(status) == want, status


def test_a_running_run_silent_past_the_limit_reads_interrupted():
    now = datetime(2026, 12, 4, 12, 0, 0)
    just = now - timedelta(seconds=statuses.DEAD_AFTER_S)
    assert statuses.live_status("running", just, now) == "running"                     # at the limit: alive
    assert statuses.live_status("running", just - timedelta(seconds=1), now) == "interrupted"
    assert statuses.live_status("converged", now - timedelta(days=3), now) == "converged"  # ended: as stored
    assert statuses.live_status("running", None, now) == "running"                    # nothing to judge by
    assert statuses.last_sign(just, now) == just and statuses.last_sign(None, now) == now
    assert statuses.last_sign(float("nan"), now) == now and statuses.last_sign(None, None) is None
