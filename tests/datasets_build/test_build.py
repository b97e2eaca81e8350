"""`bench build` end to end on the embedded model: outputs, store rows, bad input, and a
build killed with SIGKILL midway that resumes to exactly the uninterrupted result."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from bench.cli import app
from bench.store import Build, BuildProblem, BuildRollout, open_store, session

pytestmark = pytest.mark.integration

SMALL = ["--limit", "24", "--k", "8", "--engine", "torch", "--dtype", "fp32", "--chunk", "8", "--threads", "1"]


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_build_writes_split_manifest_and_store_rows(db_url, tmp_path):
    import datasets
    import pandas as pd

    r = invoke("build", "--model", "tiny-math", *SMALL, "--db", db_url, "--json", "--out", str(tmp_path / "b"))
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)
    assert m["problems"] == 24 and sum(m["counts"].values()) == 24 and m["rollouts"] == 24 * 8
    assert m["band"] == [0.2, 0.8] and m["engine"] == "torch" and m["dtype"] == "fp32"
    assert m["template"] == "Q: {problem}\nA: " and m["weights_hash"] and m["rollouts_per_s"] > 0
    ds = datasets.load_from_disk(str(tmp_path / "b" / "split"))
    split = pd.read_parquet(tmp_path / "b" / "split.parquet")
    assert len(ds) == len(split) == m["counts"]["kept"]
    assert list(split.columns) == ["id", "problem", "answer", "accuracy", "k"]
    assert ((split.accuracy >= 0.2) & (split.accuracy <= 0.8)).all()
    engine = open_store(db_url)
    with session(engine) as s:
        b = s.get(Build, m["build_id"])
        assert b.status == "complete" and b.n_kept == m["counts"]["kept"]
        assert s.scalar(select(func.count()).select_from(BuildRollout)) == 24 * 8
        probs = s.scalars(select(BuildProblem)).all()
        assert len(probs) == 24
        for p in probs:
            assert p.accuracy == p.n_correct / 8 and p.kept == (0.2 <= p.accuracy <= 0.8)
    r = invoke("builds", "--json", "--db", db_url)
    assert json.loads(r.stdout)[0]["id"] == m["build_id"]
    r = invoke("builds", "show", m["build_id"], "--json", "--db", db_url)
    assert json.loads(r.stdout)["counts"] == m["counts"]


def test_bad_golds_are_listed_and_excluded(tmp_path):
    src = tmp_path / "p.jsonl"
    rows = [{"id": "ok", "problem": "Compute 2+3.", "answer": "5"},
            {"id": "bad", "problem": "Compute 1+1.", "answer": "\\frac{"}]
    src.write_text("\n".join(json.dumps(r) for r in rows))
    r = invoke("build", "--source", str(src), "--k", "4", "--engine", "torch", "--json")
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)
    assert m["bad_golds"] == ["\\frac{"] and m["counts"]["bad_gold"] == 1 and m["rollouts"] == 4


@pytest.mark.parametrize("args,needle", [
    (["--k", "0"], "k must be >= 1"),
    (["--band", "0.8", "0.2"], "above the upper bound"),
    (["--band", "0.2", "1.5"], "band must lie in [0, 1]"),
    (["--model", "no-such-model"], "unknown model"),
    (["--source", "missing.jsonl"], "unknown source"),
    (["--dtype", "fp6"], "unknown dtype"),
    (["--engine", "tpu"], "'tpu' is not one of"),
    (["--shard", "3/2"], "bad shard"),
    (["--out", "/proc/bench-out"], "not writable"),
    (["--db", "postgresql+psycopg://x@127.0.0.1:1/none?connect_timeout=2"], "cannot open store"),
    (["--resume"], "no unfinished build"),
])
def test_bad_input_exits_nonzero_and_writes_nothing(bench_home, args, needle):
    r = invoke("build", "--limit", "4", "--k", "2", *args)
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.output.split())
    builds_dir = bench_home / "builds"
    assert not builds_dir.exists() or not any(builds_dir.iterdir())
    if (bench_home / "bench.db").exists():
        with session(open_store()) as s:
            assert s.scalar(select(func.count()).select_from(Build)) == 0


def _counts(url):
    with session(open_store(url)) as s:
        rows = s.execute(select(BuildRollout.problem_id, BuildRollout.sample, BuildRollout.verdict,
                                BuildRollout.extracted)).all()
    return rows


def test_sigkill_midway_then_resume_equals_uninterrupted(db_url, tmp_path):
    args = ["--model", "tiny-math", "--limit", "48", "--k", "8", "--engine", "torch", "--dtype", "fp32",
            "--chunk", "4", "--threads", "1", "--db", db_url]
    env = {**os.environ, "BENCH_HOME": str(tmp_path / "killed")}
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", "build", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    engine = open_store(db_url)
    deadline = time.time() + 180
    n = 0
    while time.time() < deadline and proc.poll() is None:
        with session(engine) as s:
            n = s.scalar(select(func.count()).select_from(BuildRollout))
        if n >= 8 * 8:              # at least two chunks in, far from the 48 * 8 total
            break
        time.sleep(0.05)
    assert proc.poll() is None, "build finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with session(engine) as s:
        killed_at = s.scalar(select(func.count()).select_from(BuildRollout))
        assert 0 < killed_at < 48 * 8
        assert s.scalars(select(Build.status)).all() == ["running"]
    r = subprocess.run([sys.executable, "-m", "bench.cli", "build", *args, "--resume", "--json"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["rollouts"] == 48 * 8 and m["rollouts_this_session"] == 48 * 8 - killed_at
    resumed = _counts(db_url)
    assert len(resumed) == len({(p, j) for p, j, _, _ in resumed}) == 48 * 8

    # the uninterrupted build with the same seed: the same rollouts, verdict for verdict
    fresh_url = f"sqlite:///{tmp_path / 'fresh.db'}"
    r = subprocess.run([sys.executable, "-m", "bench.cli", "build", *args[:-2], "--db", fresh_url, "--json"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"] == m["counts"]
    assert sorted(_counts(fresh_url)) == sorted(resumed)


def test_three_shards_merge_to_the_unsharded_split(tmp_path):
    import pandas as pd

    url = f"sqlite:///{tmp_path / 's.db'}"
    common = ["--model", "tiny-math", "--limit", "30", "--k", "6", "--engine", "torch", "--dtype", "fp32", "--db", url,
              "--json"]
    whole = json.loads(invoke("build", *common, "--out", str(tmp_path / "whole")).stdout)
    r = invoke("build", "merge", "--db", url)
    assert r.exit_code == 2 and "no sharded builds" in r.output
    for i in range(3):
        if i == 1:                      # a missing shard is named
            r = invoke("build", "merge", "--db", url)
            assert r.exit_code == 2 and "missing shard(s) 1/3, 2/3" in " ".join(r.output.split())
        r = invoke("build", *common, "--shard", f"{i}/3")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["problems"] == 10
    r = invoke("build", "merge", "--db", url, "--json", "--out", str(tmp_path / "merged"))
    assert r.exit_code == 0, r.output
    merged = json.loads(r.stdout)
    assert merged["counts"] == whole["counts"] and merged["rollouts"] == 30 * 6
    a = pd.read_parquet(tmp_path / "whole" / "split.parquet")
    b = pd.read_parquet(tmp_path / "merged" / "split.parquet")
    pd.testing.assert_frame_equal(a, b)
    with session(open_store(url)) as s:
        assert s.scalar(select(func.count()).select_from(BuildRollout)
                        .where(BuildRollout.build_id == merged["build_id"])) == 180


def test_identical_settings_reuse_the_complete_build(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    args = ["build", "--limit", "8", "--k", "2", "--engine", "torch", "--db", url, "--json"]
    first = json.loads(invoke(*args).stdout)
    again = json.loads(invoke(*args).stdout)
    assert again["build_id"] == first["build_id"] and again["reused"]
    forced = json.loads(invoke(*args, "--force").stdout)
    assert forced["build_id"] != first["build_id"] and forced["counts"] == first["counts"]


def test_the_cascade_attention_is_a_build_setting_of_its_own(tmp_path):
    """A build decoded with the shared-prefix attention is another build (its rollouts' μ and
    tokens may move), recorded in its settings; without it the settings keep their old keys."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    args = ["build", "--limit", "8", "--k", "4", "--engine", "torch", "--dtype", "fp32", "--db", url, "--json"]
    plain = json.loads(invoke(*args).stdout)
    cascade = json.loads(invoke(*args, "--cascade-attention").stdout)
    assert "cascade_attention" not in plain["settings"] and cascade["settings"]["cascade_attention"] is True
    assert cascade["build_id"] != plain["build_id"] and not cascade.get("reused")
    assert cascade["rollouts"] == plain["rollouts"] == 32


def test_the_cascade_attention_is_refused_with_vllm(bench_home, monkeypatch):
    import bench.engines

    monkeypatch.setattr(bench.engines, "vllm_available", lambda: True)
    r = invoke("build", "--limit", "4", "--k", "2", "--engine", "vllm", "--cascade-attention")
    assert r.exit_code == 2 and "--cascade-attention is the built-in engine's" in " ".join(r.output.split())
    assert not (bench_home / "builds").exists() or not any((bench_home / "builds").iterdir())


@pytest.mark.integration
@pytest.mark.ray
def test_ray_shards_merge_to_the_unsharded_split(tmp_path):
    """`bench build --ray`: three shards as tasks of a local Ray instance (one CPU worker each),
    merged into exactly the split of the unsharded build with the same seed."""
    import pandas as pd

    url = f"sqlite:///{tmp_path / 's.db'}"
    common = ["--model", "tiny-math", "--limit", "24", "--k", "4", "--engine", "torch", "--dtype", "fp32",
              "--threads", "1", "--db", url, "--json"]
    whole = json.loads(invoke("build", *common, "--out", str(tmp_path / "whole")).stdout)
    r = invoke("build", *common, "--ray", "--shards", "3", "--out", str(tmp_path / "ray"))
    assert r.exit_code == 0, r.output
    merged = json.loads(r.stdout)
    assert len(merged["shards"]) == 3 and merged["counts"] == whole["counts"] and merged["rollouts"] == 24 * 4
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "whole" / "split.parquet"),
                                  pd.read_parquet(tmp_path / "ray" / "split.parquet"))
    with session(open_store(url)) as s:
        shards = s.scalars(select(Build).where(Build.shard.is_not(None))).all()
        assert sorted(b.shard for b in shards) == ["0/3", "1/3", "2/3"] and {b.status for b in shards} == {"complete"}
    r = invoke("build", *common, "--ray", "--shard", "0/3")
    assert r.exit_code == 2 and "drop --shard" in r.output
