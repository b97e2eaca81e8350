"""Stopping a run or a sweep by a signal, across processes: Ctrl-C (SIGINT) and a scheduler's,
`timeout`'s or `kill PID`'s SIGTERM stop a native run within the step it is in and record it
`failed`, reason `interrupted` (resumable); a sweep of cells in their own processes passes a
SIGTERM sent to it alone on to its cells (runners/ledger.py `run_to_end`, runners/sweep.py).

A run started in the background of a non-interactive shell inherits SIGINT ignored (POSIX), as
every program there does: the processes here are started with SIGINT at its default, as from a
terminal."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bench.cli import app
from bench.store import Run, open_store, session

pytestmark = pytest.mark.integration

LONG = ["--dtype", "fp32", "--max-steps", "200", "--eval-every", "100", "--prompts-per-step", "4",
        "--samples-per-prompt", "4", "--eval-split-m", "1", "--threads", "1"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A store of its own (the runs left `failed` here are no other test's business) and a build."""
    tmp = tmp_path_factory.mktemp("signals")
    url = f"sqlite:///{tmp / 'store.db'}"
    r = CliRunner().invoke(app, ["build", "--model", "tiny-math", "--limit", "48", "--k", "8", "--engine", "torch",
                                 "--dtype", "fp32", "--band", "0.1", "0.9", "--json", "--db", url],
                           env={"BENCH_HOME": str(tmp / "home")})
    assert r.exit_code == 0, r.output
    return url, json.loads(r.stdout)["build_id"], tmp


def _start(args: list[str], tmp) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench.cli", *args], env={**os.environ, "BENCH_HOME": str(tmp)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,       # _kill stops its cells and their graders with it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _kill(proc: subprocess.Popen) -> str:
    """SIGKILL the command and all it started (cells, graders, the resource tracker that holds its
    stderr open), so a failed test leaves no training behind; the tail of its stderr."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        return proc.communicate(timeout=30)[1][-2000:]
    except subprocess.TimeoutExpired:
        return "(its stderr stayed open)"


def _running(url: str, before: set[str], n: int, proc: subprocess.Popen, at: int = 3) -> dict[str, int]:
    """The `n` runs started since `before`, once each is running at step `at` or later: {id: step}."""
    engine, t0, runs = open_store(url), time.time(), {}
    while time.time() < t0 + 300 and proc.poll() is None:
        with session(engine) as s:
            runs = {r.id: r.step for r in s.scalars(select(Run).where(Run.status == "running"))
                    if r.id not in before}
        if len(runs) == n and min(runs.values()) >= at:
            return runs
        time.sleep(0.05)
    pytest.fail(f"{n} runs were not running at step {at} after {time.time() - t0:.0f} s (exit code {proc.poll()}, "
                f"running {runs}): {_kill(proc)}")


def _ids(url: str) -> set[str]:
    with session(open_store(url)) as s:
        return set(s.scalars(select(Run.id)))


def _ended(proc: subprocess.Popen, sig: signal.Signals) -> str:
    try:
        err = proc.communicate(timeout=90)[1]
    except subprocess.TimeoutExpired:
        pytest.fail(f"it went on for 90 s after {sig.name}: {_kill(proc)}")
    assert proc.returncode != 0, err
    assert "Traceback" not in err, err[-2000:]
    return err


def _assert_interrupted(url: str, started: dict[str, int], err: str) -> None:
    with session(open_store(url)) as s:
        for run_id, at in started.items():
            run = s.get(Run, run_id)
            assert (run.status, run.stop_reason) == ("failed", "interrupted"), (run.status, run.stop_reason,
                                                                                 err[-2000:])
            assert at <= run.step <= at + 2          # stopped within the step it was in (a progress read lags)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_mid_run_stops_it_within_a_step_and_records_it_resumable(built, sig):
    url, build, tmp = built
    before = _ids(url)
    proc = _start(["run", "--algo", "grpo", *LONG, "--build", build, "--db", url], tmp / "home")
    started = _running(url, before, 1, proc)
    proc.send_signal(sig)
    _assert_interrupted(url, started, _ended(proc, sig))


def test_a_sigterm_to_a_sweep_alone_stops_the_cells_in_their_own_processes(built):
    """`kill PID` of `bench sweep --jobs 2` (its cells' processes get no signal of their own): the
    sweep passes it on, both cells record themselves interrupted, and no further cell starts."""
    url, build, tmp = built
    before = _ids(url)
    proc = _start(["sweep", "--algo", "pg-seq-is,gspo,cispo", *LONG, "--build", build, "--jobs", "2", "--db", url],
                  tmp / "home")
    started = _running(url, before, 2, proc)
    proc.send_signal(signal.SIGTERM)
    err = _ended(proc, signal.SIGTERM)
    _assert_interrupted(url, started, err)
    assert _ids(url) - before == set(started), err[-2000:]               # the third cell never started
