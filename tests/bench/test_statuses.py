"""The run statuses (bench/statuses.py): one table, and what the sweep, resume and the
leaderboard read from it."""

from bench import statuses
from leaderboard.queries import sanity


def test_every_named_status_is_a_row_and_every_row_a_verdict():
    names = {statuses.RUNNING, statuses.CONVERGED, statuses.PLATEAUED, statuses.COLLAPSED, statuses.FUTILE,
             statuses.DIVERGED, statuses.MISCALIBRATED, statuses.MAX_STEPS, statuses.FAILED, statuses.SKIPPED}
    assert names == set(statuses.STATUSES)
    assert all(s.verdict in statuses.VERDICTS and s.name == k for k, s in statuses.STATUSES.items())
    assert [k for k, s in statuses.STATUSES.items() if s.verdict == "PASS"] == ["converged"]


def test_finished_resumable_and_the_verdict():
    assert set(statuses.FINISHED) == {"converged", "plateaued", "collapsed", "futile", "diverged", "miscalibrated",
                                      "max_steps"}
    assert set(statuses.RESUMABLE) == {"running", "failed"}
    assert not set(statuses.FINISHED) & set(statuses.RESUMABLE)
    for status, want in (("converged", "PASS"), ("running", "RUNNING"), ("max_steps", "UNDECIDED"),
                         ("failed", "NO VERDICT"), ("miscalibrated", "FAIL"), ("diverged", "FAIL"), ("futile", "FAIL"),
                         (None, "NO VERDICT"), ("no-such-status", "NO VERDICT")):
        assert statuses.verdict(status) == want == sanity(status), status
