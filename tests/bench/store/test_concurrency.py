"""Concurrent writers on one store (`bench sweep --jobs N`, sharded builds, a team on one
PostgreSQL): real processes open a fresh store at the same moment (both migrate it) and write
steps the way the trainer does; none may fail with "database is locked" or lose a step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import select, text

from bench.store import Model, Run, RunStep, open_store, session

ROOT = Path(__file__).resolve().parents[3]
STEPS = 200

# One writer: opens (and, on a fresh database, migrates) the store once the barrier file
# appears, gets the model both writers share (get_or_create_model: both may make it at once),
# makes its own build and run, then records STEPS steps as runners/trainer.py `_record` does,
# one transaction each that reads the run before it writes it. Every other step's transaction
# also increments a counter on both writers' runs (read-modify-write of rows the other process
# writes too, locked in one order with FOR UPDATE, which PostgreSQL needs and SQLite ignores):
# a lost update shows as a short count.
WRITER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, os.environ["BENCH_ROOT"])
    from sqlalchemy import select
    from bench.store import Build, Run, RunStep, get_or_create_model, open_store, session

    url, tag, other, steps, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    rid, ids = "r-" + tag, sorted(["r-" + tag, "r-" + other])
    open(go + "." + tag, "w").close()                      # ready
    while not os.path.exists(go):
        time.sleep(0.001)
    store = open_store(url)
    with session(store) as s:
        m = get_or_create_model(s, "tiny-math", "/nowhere", "shared-hash")
        s.add(Build(id="b-" + tag, model_id=m.id, source="x", engine="torch", dtype="fp32", k=1, lo=0.2, hi=0.8,
                    seed=0, settings_hash="h-" + tag, status="complete"))
        s.flush()
        s.add(Run(id=rid, model_id=m.id, build_id="b-" + tag, algo="grpo", rollout_dtype="fp32",
                  train_dtype="fp32", trainer="native", engine="torch", config={}, status="running"))
    wall, bumped = 0.0, {}
    for step in range(1, steps + 1):
        wall += 0.01
        with session(store) as s:
            if step % 2 == 0:
                for r in s.scalars(select(Run).where(Run.id.in_(ids)).order_by(Run.id).with_for_update()):
                    r.kl_warning_step = (r.kl_warning_step or 0) + 1
                    bumped[r.id] = bumped.get(r.id, 0) + 1
            metrics = {"reward": step / steps, "kl_k1": 1e-3 * step, "wall_s": wall}
            s.merge(RunStep.from_metrics(rid, step, metrics))
            run = s.get(Run, rid)
            assert run.step == step - 1, (run.step, step)
            run.step, run.wall_s = step, wall
    with session(store) as s:
        s.get(Run, rid).status = "max_steps"
    print(json.dumps({"tag": tag, "steps": steps, "bumped": bumped}))
""")


def _writers(url: str, tmp_path: Path, n: int = STEPS, tags=("a", "b"), timeout: float = 240):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    go = tmp_path / "go"
    env = {**os.environ, "BENCH_ROOT": str(ROOT), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, str(script), url, t, tags[(i + 1) % len(tags)], str(n), str(go)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, t in enumerate(tags)]
    try:
        deadline = time.time() + 120
        while not all(Path(f"{go}.{t}").exists() for t in tags):   # both imported bench and wait
            assert time.time() < deadline, "writers did not start"
            dead = [p for p in procs if p.poll() is not None]
            assert not dead, [p.stderr.read()[-3000:] for p in dead]
            time.sleep(0.01)
        go.touch()                                                 # ... and start together
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


@pytest.mark.slow
@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "migrated"])
def test_two_processes_write_the_same_store(db_url, tmp_path, fresh):
    """`fresh`: both writers find an empty database and migrate it at the same moment;
    `migrated`: the store exists (as when `bench sweep` starts its jobs), only the writes race."""
    if not fresh:
        open_store(db_url).dispose()
    t0 = time.time()
    results = _writers(db_url, tmp_path)
    elapsed = time.time() - t0
    for rc, out, err in results:
        assert "database is locked" not in err, err[-3000:]
        assert rc == 0, err[-3000:]
    outs = [json.loads(out) for _, out, _ in results]
    assert [o["steps"] for o in outs] == [STEPS, STEPS]
    with session(open_store(db_url)) as s:
        for tag in ("a", "b"):
            run = s.get(Run, f"r-{tag}")
            assert (run.status, run.step) == ("max_steps", STEPS)
            steps = s.scalars(select(RunStep.step).where(RunStep.run_id == run.id).order_by(RunStep.step)).all()
            assert steps == list(range(1, STEPS + 1))                              # no step lost
            assert run.kl_warning_step == sum(o["bumped"].get(run.id, 0) for o in outs) >= STEPS // 2  # no update lost
        assert [m.name for m in s.scalars(select(Model))] == ["tiny-math"]                # made once
        assert s.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
    print(f"{db_url.split(':')[0]} {'fresh' if fresh else 'migrated'}: 2 x {STEPS} steps in {elapsed:.1f}s")


def test_sqlite_store_is_wal_with_a_busy_timeout(tmp_path):
    engine = open_store(f"sqlite:///{tmp_path / 's.db'}")
    with engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_read_only_reader_neither_writes_nor_blocks_a_writer(tmp_path):
    """The leaderboard's engine (PRAGMA query_only) reads while a writer holds its transaction,
    and a writer commits while a reader holds its own: WAL, and readers never take the write lock."""
    from sqlalchemy.exc import OperationalError

    from leaderboard.queries import read_only

    url = f"sqlite:///{tmp_path / 's.db'}"
    writer = open_store(url)
    reader = read_only(open_store(url, migrate=False))
    with reader.connect() as r:
        assert r.execute(text("SELECT count(*) FROM runs")).scalar() == 0      # reader's transaction open
        with session(writer) as s:                                             # a writer still commits
            s.execute(text("INSERT INTO models (name, path, created_at) VALUES ('m', '/x', CURRENT_TIMESTAMP)"))
        with writer.connect() as w:                                            # ... and, holding the lock,
            w.execute(text("INSERT INTO models (name, path, created_at) VALUES ('m2', '/x', CURRENT_TIMESTAMP)"))
            with reader.connect() as r2:                                       # doesn't block a new reader
                assert r2.execute(text("SELECT count(*) FROM models")).scalar() == 1
            w.commit()
    with pytest.raises(OperationalError):
        with reader.begin() as c:
            c.execute(text("DELETE FROM models"))
    with reader.connect() as r:
        assert r.execute(text("SELECT count(*) FROM models")).scalar() == 2


@pytest.mark.integration
def test_sweep_with_two_jobs_on_sqlite(tmp_path):
    """`bench sweep --jobs 2` end to end: a tiny build, two cells of 2 steps in two processes
    writing one SQLite store at once; both finish with contiguous steps (~45 s on 2 cores)."""
    from typer.testing import CliRunner

    from bench.cli import app

    url = f"sqlite:///{tmp_path / 'store.db'}"
    r = CliRunner().invoke(app, ["build", "--model", "tiny-math", "--limit", "64", "--k", "8", "--engine", "torch",
                                 "--dtype", "fp32", "--band", "0.1", "0.9", "--json", "--db", url])
    assert r.exit_code == 0, r.output
    build = json.loads(r.stdout)["build_id"]
    p = subprocess.run([sys.executable, "-m", "bench.cli", "sweep", "--algo", "grpo,pg-seq-is", "--dtype", "fp32",
                        "--build", build, "--max-steps", "2", "--eval-every", "2", "--prompts-per-step", "4",
                        "--samples-per-prompt", "4", "--threads", "1", "--jobs", "2", "--db", url],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert "database is locked" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
    with session(open_store(url)) as s:
        runs = s.scalars(select(Run).where(Run.build_id == build)).all()
        assert sorted(r.algo for r in runs) == ["grpo", "pg-seq-is"]
        for run in runs:
            assert (run.status, run.step) == ("max_steps", 2), (run.algo, run.status, run.stop_reason)
            steps = s.scalars(select(RunStep.step).where(RunStep.run_id == run.id).order_by(RunStep.step)).all()
            assert steps == [1, 2], (run.algo, steps)
