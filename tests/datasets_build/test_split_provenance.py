"""Provenance of a split: the duplicate check on a source with repeated rows, the split hash
(recorded, printed, recomputable), migration 0004's backfill, and the config diff against the
preset."""

import json
from dataclasses import asdict

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bench.cli import app
from bench.problem_ids import split_hash
from bench.problems import Problem, SourceSpec, drop_repeats, load_source
from bench.synthetic import synthetic_examples
from bench.store import Build, BuildProblem, open_store, session


def test_split_hash_is_canonical():
    a = split_hash([("p2", "3"), ("p1", "1/2")])
    assert a == split_hash([("p1", "1/2"), ("p2", "3")])                      # order does not matter
    import hashlib

    assert a == hashlib.sha256('[["p1","1/2"],["p2","3"]]'.encode()).hexdigest()
    assert a != split_hash([("p1", "1/2"), ("p2", "4")])                      # a gold does


def test_drop_repeats_counts_each_normalised_text_once():
    ps = [Problem("a", "What is 2+2?", "4"), Problem("b", "what  is 2+2?\n", "4"), Problem("c", "Other", "1"),
          Problem("d", "WHAT IS 2+2?", "5"), Problem("e", "other", "1")]
    unique, groups = drop_repeats(ps)
    assert [p.id for p in unique] == ["a", "c"]
    assert groups == [{"id": "a", "rows": 3, "ids": ["a", "b", "d"], "conflicting_answers": ["4", "5"]},
                      {"id": "c", "rows": 2, "ids": ["c", "e"]}]


def _repeated_source(tmp_path, n=10, copies=3):
    """n distinct synthetic problems, each written `copies` times (the paper's 11,680-row parquet
    repeats each of its 1,460 questions 8 times): the same id, or none, and case/space variants."""
    rows = synthetic_examples("test", n, seed=3)
    out = []
    for c in range(copies):
        for i, r in enumerate(rows):
            text = (r["problem"] if c == 0
                    else (r["problem"].upper() if c == 1 else "  " + r["problem"].replace(" ", "\t")))
            out.append({"id": r["id"] if c != 2 else None, "problem": text, "answer": r["answer"]})
    path = tmp_path / "repeated.jsonl"
    path.write_text("\n".join(json.dumps({k: v for k, v in x.items() if v is not None}) for x in out))
    return path, rows


def test_a_source_with_repeated_rows(tmp_path):
    path, rows = _repeated_source(tmp_path)
    problems, dup = load_source(SourceSpec(str(path)))
    assert [p.id for p in problems] == [r["id"] for r in rows]
    assert (dup["rows"], dup["problems"], dup["repeated"], dup["extra_rows"]) == (30, 10, 10, 20)
    assert all(g["rows"] == 3 and g["ids"][0] == g["id"] for g in dup["groups"])
    assert load_source(SourceSpec("math500"))[1]["repeated"] == 0


@pytest.mark.integration
def test_build_says_so_and_records_the_hash(tmp_path):
    path, rows = _repeated_source(tmp_path)
    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(app, ["build", "--source", str(path), "--k", "4", "--engine", "torch", "--dtype", "fp32",
                                 "--band", "0", "1", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "warning:" in err and "10 problem(s) appear more than once (20 extra rows of 30)" in err
    m = json.loads(r.stdout)
    assert m["problems"] == 10 and m["duplicates"]["repeated"] == 10
    with session(open_store(url)) as s:
        b = s.get(Build, m["build_id"])
        kept = s.execute(select(BuildProblem.problem_id, BuildProblem.answer, BuildProblem.accuracy,
                                BuildProblem.n_samples).where(BuildProblem.build_id == b.id,
                                                              BuildProblem.kept.is_(True))).all()
    assert len(kept) == 10 and all(n == 4 and acc is not None for _, _, acc, n in kept)
    assert b.split_hash == m["split_hash"] == split_hash((i, a) for i, a, _, _ in kept)
    r = CliRunner().invoke(app, ["builds", "show", m["build_id"], "--db", url])
    shown = " ".join(r.stdout.split())
    assert f"split_hash: {m['split_hash']}" in shown and "10 problem(s) appear more than once" in shown
    r = CliRunner().invoke(app, ["builds", "show", m["build_id"], "--db", url, "--json"])
    assert json.loads(r.stdout)["split_hash"] == m["split_hash"]


def test_migration_0004_backfills_seed_and_split_hash(tmp_path):
    from sqlalchemy import text

    from conftest import store_at_revision

    url = f"sqlite:///{tmp_path / 's.db'}"
    engine = store_at_revision(url, "0003")
    with engine.begin() as c:
        for pid, ans, kept in (("p1", "1", 1), ("p2", "2", 0), ("p3", "3", 1)):
            c.execute(text("INSERT INTO build_problems VALUES ('b1', :p, 0, 'x', :a, 4, 2, 0.5, 'kept', :k)"),
                      {"p": pid, "a": ans, "k": kept})
        c.execute(text("INSERT INTO runs (id, model_id, build_id, algo, rollout_dtype, train_dtype, trainer, engine, "
                       "config, status, step, wall_s, created_at, updated_at) VALUES ('r1', 1, 'b1', 'grpo', 'fp32', "
                       "'fp32', 'native', 'torch', :cfg, 'converged', 5, 1.0, '2026-01-01', '2026-01-01')"),
                  {"cfg": json.dumps({"seed": 7})})
    engine = open_store(url)                  # upgrades to head
    with engine.connect() as c:
        assert c.execute(text("SELECT seed FROM runs")).scalar() == 7
        assert c.execute(text("SELECT split_hash FROM builds")).scalar() == split_hash([("p1", "1"), ("p3", "3")])


def test_config_diff_against_the_preset():
    from runners.presets import config_diff, get_preset

    cfg = json.loads(json.dumps({"preset": "tiny", **asdict(get_preset("tiny", max_steps=5, seed=2)),
                                 "verl": {"argv": ["x"]}}))
    assert config_diff(cfg) == ("tiny", [("max_steps", 150, 5), ("seed", 0, 2)])
    cfg["algo"]["C"] = 5.0
    cfg["benchmarks"][0]["n"] = 8
    assert ("algo.C", 3.0, 5.0) in config_diff(cfg)[1] and ("benchmarks[0].n", 4, 8) in config_diff(cfg)[1]
    assert config_diff({"preset": "paper", **json.loads(json.dumps(asdict(get_preset("paper"))))}) == ("paper", [])
    assert config_diff({}) == (None, None)


def test_the_apps_diff_from_stored_defaults_equals_the_clis():
    """The Run page diffs against the preset defaults the run stored (it imports no runners)."""
    from bench import configdiff
    from runners.presets import config_diff, get_preset, preset_defaults

    cfg = {"preset": "tiny", **json.loads(json.dumps(asdict(get_preset("tiny", max_steps=5, lr=2e-3))))}
    assert configdiff.diff(preset_defaults("tiny"), cfg) == config_diff(cfg)[1] == [("lr", 1e-3, 2e-3),
                                                                                   ("max_steps", 150, 5)]
