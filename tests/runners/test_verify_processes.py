"""A run and its re-runs in separate processes, as a user makes them (the CLI, each command its own
interpreter, each with another PYTHONHASHSEED): `bench runs verify` from step 0 of an untouched
run exits 0 bit-identical with every state digest compared, at fp32, fp16, bf16 and under
`--staleness 2`; so do a window from a kept checkpoint, `bench runs extend`, a resume after the
run was killed with SIGKILL, and `bench results add --verify full`, which labels the run "fully
re-run". The same run started in another process, from another BENCH_HOME and working directory,
stores the same config fingerprint, metrics and digests, and its export's run member is the same
bytes (hash randomisation, paths and time do not enter what bench compares or signs).

Before digest scheme 2 an honest run failed every one of these: its digests hashed the
process-wide torch and Python RNG states, which the OS seeds anew in every interpreter
(bench/statedigest.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = ["--prompts-per-step", "2", "--samples-per-prompt", "2", "--threads", "1"]
_SEEDS = iter(range(1, 10_000))


def _env(home: Path) -> dict:
    env = {**os.environ, "BENCH_HOME": str(home), "PYTHONHASHSEED": str(next(_SEEDS) * 7919 % 4_294_967_295)}
    env.pop("BENCH_DB_URL", None)
    return env


def bench(home: Path, *args, expect: int = 0, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`bench ARGS` in a new interpreter (a new PYTHONHASHSEED each time); its exit code checked."""
    p = subprocess.run([sys.executable, "-m", "bench.cli", *map(str, args)], env=_env(home), cwd=cwd,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == expect, f"bench {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p


def as_json(p: subprocess.CompletedProcess) -> dict:
    return json.loads(p.stdout)


def verify(home: Path, url: str, run: str, *args) -> dict:
    """`bench runs verify RUN ARGS --json` in its own process: exit 0, bit-identical, every state
    digest of the window compared."""
    got = as_json(bench(home, "runs", "verify", run, *args, "--json", "--db", url))
    assert (got["verdict"], got["differences"], got["digests"]) == ("bit-identical", 0, None), got
    return got


def _db(url: str) -> sqlite3.Connection:
    return sqlite3.connect(url.removeprefix("sqlite:///"))


def digests(url: str, run: str) -> list[tuple]:
    with _db(url) as c:
        return c.execute("SELECT step, digest, scheme FROM run_digests WHERE run_id = ? ORDER BY step",
                         (run,)).fetchall()


def steps(url: str, run: str) -> list[tuple]:
    """(step, reward, metrics but those that time the machine) of each stored step."""
    with _db(url) as c:
        rows = c.execute("SELECT step, reward, metrics FROM run_steps WHERE run_id = ? ORDER BY step",
                         (run,)).fetchall()
    return [(step, reward, _untimed(json.loads(m))) for step, reward, m in rows]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A store holding a real 12-problem tiny-math build (k 2, fp32, band [0, 1]), made by its own process."""
    tmp = tmp_path_factory.mktemp("processes")
    url = f"sqlite:///{tmp / 'store.db'}"
    bench(tmp / "home", "build", "--limit", "12", "--k", "2", "--engine", "torch", "--dtype", "fp32", "--band", "0",
          "1", "--db", url, "--json")
    return {"tmp": tmp, "url": url, "home": tmp / "home"}


def _copy_store(built, name: str) -> str:
    """A copy of the built store for one test (tests of this file may run on two workers)."""
    from runners.results_repo import _copy_store

    dst = built["tmp"] / f"{name}.db"
    _copy_store(Path(built["url"].removeprefix("sqlite:///")), dst)          # the WAL too
    return f"sqlite:///{dst}"


@pytest.mark.parametrize("dtype, extra, again", [("fp32", [], False), ("fp16", [], False), ("bf16", [], True),
                                                 ("fp32", ["--staleness", "2"], False)],
                         ids=["fp32", "fp16", "bf16", "staleness2"])
def test_verify_from_step_0_in_another_process_is_bit_identical(built, dtype, extra, again):
    url = _copy_store(built, f"v-{dtype}-{len(extra)}")
    run = as_json(bench(built["home"], "run", "--algo", "grpo", "--dtype", dtype, "--max-steps", "3", "--eval-every",
                        "1", *extra, *SMALL, "--db", url, "--json"))["id"]
    assert [d[0] for d in digests(url, run)] == [0, 1, 2, 3]
    got = verify(built["home"], url, run, "--steps", "3")
    assert got["steps"] == 3 and got["same_kind"]
    if again:           # bf16, whose kernels depend most on the CPU: a second re-run (another process) agrees too
        verify(built["home"], url, run, "--steps", "3")


def test_a_window_extend_and_results_add_full_in_other_processes(built):
    """fp32, evaluations and kept checkpoints every 2 steps: a full verify, the window 2:4 from the
    kept checkpoint, `runs extend` to 6 steps, the full 6 re-run; then the run exported, signed and
    added to a results repository with --verify full, which labels it "fully re-run"."""
    home, url = built["home"], _copy_store(built, "window")
    run = as_json(bench(home, "run", "--algo", "grpo", "--dtype", "fp32", "--max-steps", "4", "--eval-every", "2",
                        "--checkpoint-every", "2", "--keep-checkpoints", "2", "--no-futility", *SMALL, "--db", url,
                        "--json"))["id"]
    verify(home, url, run, "--steps", "4")
    got = verify(home, url, run, "--window", "2:4")
    assert (got["window_start"], got["steps"]) == (2, 4)
    bench(home, "runs", "extend", run, "--max-steps", "6", "--db", url)
    assert [d[0] for d in digests(url, run)] == [0, 2, 4, 6]
    verify(home, url, run, "--steps", "6")
    verify(home, url, run, "--window", "4:6")

    tmp = built["tmp"] / "repo-flow"
    keys, repo, bundle = tmp / "keys", tmp / "results", tmp / "mine.tar.gz"
    bench(home, "results", "keygen", "me", "--out", keys)
    bench(home, "runs", "export", run, "--out", bundle, "--sign", keys / "me.key", "--db", url)
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    bench(home, "results", "init", repo)
    shutil.copy(keys / "me.pub", repo / "keys" / "me.pub")
    entry = as_json(bench(home, "results", "add", bundle, "--repo", repo, "--verify", "full", "--json"))
    (v,) = entry["verifications"]
    assert (v["window_start"], v["steps"], v["verdict"], v["digests"]) == (0, 6, "bit-identical", None)
    report = as_json(bench(home, "report", "--runs", "--json", "--db", f"sqlite:///{repo / '.store.db'}"))
    (row,) = report["runs"]
    assert row["verification"] == "fully re-run (6 steps)" and row["verified"] is True


def _wait_for_step(url: str, run_hint: str | None, at_least: int, proc: subprocess.Popen, limit: float = 300) -> str:
    """The id of the one run in `url` once its stored step is ≥ `at_least` (polling the store)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        assert proc.poll() is None, "the run ended before it could be killed"
        try:
            with _db(url) as c:
                row = c.execute("SELECT id, step FROM runs").fetchone()
        except sqlite3.OperationalError:      # the schema is still being written
            row = None
        if row and row[1] >= at_least:
            return row[0]
        time.sleep(0.02)
    raise AssertionError(f"the run did not reach step {at_least} in {limit} s")


def test_a_run_killed_with_sigkill_resumes_to_the_run_verify_re_runs(built):
    """Killed after its checkpoint at step 2 (SIGKILL: no handler runs), resumed by `bench run
    --resume` in a new process, the run's steps and digests are those `verify` re-computes from
    step 0 in one go."""
    home, url = built["home"], _copy_store(built, "kill")
    args = ["run", "--algo", "grpo", "--dtype", "fp16", "--max-steps", "40", "--eval-every", "2",
            "--checkpoint-every", "2", "--no-futility", *SMALL, "--db", url, "--json"]
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", *args], env=_env(home), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        run = _wait_for_step(url, None, 3, proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with _db(url) as c:
        killed_at = c.execute("SELECT step FROM runs WHERE id = ?", (run,)).fetchone()[0]
    assert 3 <= killed_at < 40
    got = as_json(bench(home, "run", "--resume", run, "--db", url, "--json"))
    assert got["status"] != "running" and got["steps"] >= killed_at      # ended by its budget or a rule
    verify(home, url, run, "--steps", got["steps"])


def test_the_same_run_in_another_process_home_and_directory_stores_the_same_numbers(built, tmp_path):
    """Two processes (other PYTHONHASHSEED, BENCH_HOME and working directory) run the same
    settings and seed on copies of one build: the same fingerprint, steps, evaluations and state
    digests; each exported alone, the run members are the same bytes once the run id is the
    same (ids are fresh per run)."""
    out = []
    for name in ("a", "b"):
        url = _copy_store(built, f"same-{name}")
        home, cwd = tmp_path / f"home-{name}", tmp_path / f"cwd-{name}"
        cwd.mkdir()
        run = as_json(bench(home, "run", "--algo", "grpo", "--dtype", "bf16", "--max-steps", "2", "--eval-every", "1",
                            *SMALL, "--db", url, "--json", cwd=cwd))["id"]
        bench(home, "runs", "export", run, "--out", tmp_path / f"{name}.tar.gz", "--db", url, cwd=cwd)
        with tarfile.open(tmp_path / f"{name}.tar.gz") as t:
            member = json.load(io.BytesIO(t.extractfile(f"runs/{run}.json").read()))
        info = as_json(bench(home, "runs", "show", run, "--json", "--db", url))
        out.append((run, url, member, info))
    (ra, ua, ma, ia), (rb, ub, mb, ib) = out
    assert [d[1:] for d in digests(ua, ra)] == [d[1:] for d in digests(ub, rb)]
    assert steps(ua, ra) == steps(ub, rb)
    assert ia["config_fp"] == ib["config_fp"] and ia["config"] == ib["config"]

    def canon(m: dict, run: str) -> dict:
        """The member without what names this copy: its id (and the chain it seeds), times,
        paths and the provenance of the machine and process."""
        drop = {"id", "created_at", "updated_at", "checkpoint_dir", "provenance", "wall_s", "wall_to_target"}
        m = {k: v for k, v in m.items() if k not in drop}
        m["steps"] = [{k: v for k, v in s.items() if k != "created_at"} | {"metrics": _untimed(s["metrics"])}
                      for s in m["steps"]]
        m["digests"] = [{k: v for k, v in d.items() if k != "chain"} for d in m["digests"]]
        return m

    assert canon(ma, ra) == canon(mb, rb)


def _untimed(metrics: dict) -> dict:
    from bench.machine_metrics import is_machine_metric

    return {k: v for k, v in metrics.items() if not is_machine_metric(k)}
