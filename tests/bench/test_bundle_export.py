"""What `bench runs export` writes (bench/bundle.py): the checkpoint a run's deciding window starts
from, carried bit for bit under its sum and written back out (none where the window starts at 0,
none was kept or nothing was decided); members as canonical JSON in plain files without a time;
a build's split hash where the store has none; a write that fails says why. And a converged run
read back from such a bundle: its steps to target must be its last step."""

import hashlib
import json
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import select

from bench.store import Build, Run, open_store, session
from conftest import small_grpo_run
from test_bundle import _cli, _edit_json, _members, _reseal, _write, make_source

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_source(tmp_path_factory.mktemp("bundle"))


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """A run whose verdict's deciding window starts after step 0, its checkpoints kept: 8 steps,
    an evaluation every 2; its budget reads the last three (steps 4, 6, 8), so the window is 2:8."""
    return small_grpo_run(tmp_path_factory.mktemp("windowed"), "--max-steps", "8", "--eval-every", "2",
                          "--checkpoint-every", "4", "--keep-checkpoints", "2")


def test_a_bundle_carries_the_checkpoint_its_deciding_window_starts_from(windowed, tmp_path):
    """`--window-checkpoints`: the checkpoint kept at A travels bit for bit under its sum, and
    bundle_checkpoints writes it back out as (A, file)."""
    from bench import verdicts
    from bench.bundle import bundle_checkpoints, export_runs, read_bundle
    from bench.statedigest import kept_checkpoint

    url, rid = windowed
    with session(open_store(url)) as s:
        ckpt_dir = s.get(Run, rid).checkpoint_dir
        assert verdicts.deciding_window(verdicts.from_store(s, [rid])[rid]) == (2, 8)
    kept = kept_checkpoint(ckpt_dir, 2).read_bytes()
    bundle = tmp_path / "b.tar.gz"
    manifest = export_runs(open_store(url), [rid], bundle, window_checkpoints=True)
    name = f"checkpoints/{rid}/step-000002.pt"
    assert manifest["window_checkpoints"] == {rid: 2}
    assert manifest["members"][name] == hashlib.sha256(kept).hexdigest() and _members(bundle)[name] == kept
    with tarfile.open(bundle) as tar:
        info = tar.getmember(name)
    assert (info.mode, info.mtime, info.size) == (0o644, 0, len(kept))
    assert read_bundle(bundle)[0]["window_checkpoints"] == {rid: 2}
    (tmp_path / "out").mkdir()
    assert bundle_checkpoints(bundle, tmp_path / "out") == {rid: (2, tmp_path / "out" / f"{rid}-step-000002.pt")}
    assert (tmp_path / "out" / f"{rid}-step-000002.pt").read_bytes() == kept


def _copy(url: str, path) -> str:
    """A consistent copy of a SQLite store (its WAL included), as the results repository makes one."""
    from runners.results_repo import _copy_store

    _copy_store(Path(url[len("sqlite:///"):]), path)
    return f"sqlite:///{path}"


def test_no_checkpoint_where_the_window_starts_at_0_none_was_kept_or_nothing_decided(source, windowed, tmp_path):
    """A window from step 0 re-runs from the start (a checkpoint kept at step 0 stays home); a
    run whose kept checkpoints are gone, or that is still running (no verdict, no window),
    carries none."""
    from bench.bundle import export_runs

    def carried(url, rid, edit):
        with session(open_store(url)) as s:
            edit(s.get(Run, rid))
        manifest = export_runs(open_store(url), [rid], tmp_path / "b.tar.gz", window_checkpoints=True)
        assert not [n for n in _members(tmp_path / "b.tar.gz") if n.startswith("checkpoints/")]
        return manifest["window_checkpoints"]

    kept0 = tmp_path / "ckpt" / "kept" / "step-000000.pt"
    kept0.parent.mkdir(parents=True)
    kept0.write_bytes(b"step 0")
    first = source["runs"][0]                 # 2 steps, evaluations at 0 and 2: its window is 0:2
    url = _copy(source["url"], tmp_path / "a.db")
    assert carried(url, first, lambda r: setattr(r, "checkpoint_dir", str(tmp_path / "ckpt"))) == {first: None}
    url, rid = _copy(windowed[0], tmp_path / "b.db"), windowed[1]
    assert carried(url, rid, lambda r: setattr(r, "checkpoint_dir", str(tmp_path / "moved"))) == {rid: None}
    url = _copy(windowed[0], tmp_path / "c.db")
    assert carried(url, rid, lambda r: setattr(r, "status", "running")) == {rid: None}


def test_members_are_canonical_json_in_plain_files_without_a_time(source, tmp_path):
    """Every member's JSON has its keys sorted (the same run gives the same bytes from SQLite and
    from PostgreSQL, whose JSON columns come back in their own key order) and is written as a
    plain file, rw-r--r--, dated 0: two exports of the same runs differ only in bundle.json's
    created_at."""
    from bench.bundle import export_runs

    def keys_in_order(pairs):
        assert [k for k, _ in pairs] == sorted(k for k, _ in pairs)
        return dict(pairs)

    infos = []
    for name in ("a", "new/folder/b"):                     # a folder that does not exist yet is made
        manifest = export_runs(open_store(source["url"]), source["runs"], tmp_path / f"{name}.tar.gz")
        assert (manifest["format"], manifest["schema_version"]) == ("bench-run-bundle", 1)
        assert "window_checkpoints" not in manifest                 # carried only when asked
        with tarfile.open(tmp_path / f"{name}.tar.gz") as tar:
            infos.append([(m.name, m.mode, m.mtime, m.uid, m.gid, m.type) for m in tar.getmembers()])
    assert infos[0] == infos[1] and all(mode == 0o644 and mtime == 0 for _, mode, mtime, *_ in infos[0])
    a, b = _members(tmp_path / "a.tar.gz"), _members(tmp_path / "new" / "folder" / "b.tar.gz")
    for name, data in a.items():
        json.loads(data, object_pairs_hook=keys_in_order)
        assert name == "bundle.json" or data == b[name]


def test_a_build_stored_without_its_split_hash_exports_the_hash_of_its_kept_problems(source, tmp_path):
    """Builds from before the split-hash column: export computes it from the kept problems."""
    from bench.bundle import export_runs

    url = _copy(source["url"], tmp_path / "copy.db")
    with session(open_store(url)) as s:
        build = s.scalars(select(Build)).one()
        recorded, build.split_hash = build.split_hash, None
    manifest = export_runs(open_store(url), source["runs"], tmp_path / "b.tar.gz")
    assert recorded and manifest["split_hashes"] == {build.id: recorded}


def test_export_says_why_it_cannot_write(source, tmp_path):
    from bench.bundle import BundleError, export_runs

    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "b.tar.gz"
    with pytest.raises(BundleError) as e:
        export_runs(open_store(source["url"]), source["runs"], out)
    assert str(e.value) == f"cannot write {out}: File exists" or str(e.value) == f"cannot write {out}: Not a directory"


@pytest.mark.parametrize("steps_to_target, needle", [(8, None), (6, "converged at step 8 but steps_to_target says 6")])
def test_a_converged_run_reached_its_target_at_its_last_step(windowed, tmp_path, steps_to_target, needle):
    """A run whose last three evaluations (steps 4, 6, 8) pass the bar converged at step 8: its
    steps to target must say 8."""
    from bench.bundle import export_runs

    url, rid = windowed
    export_runs(open_store(url), [rid], tmp_path / "b.tar.gz")

    def converged(o):
        for e in o["evals"]:
            if e["benchmark"] == "split" and e["step"] >= 4:
                e["score"] = 1.0
        o.update(status="converged", steps_to_target=steps_to_target, peak_accuracy=1.0, final_accuracy=1.0)

    members = _members(tmp_path / "b.tar.gz")
    _write(tmp_path / "c.tar.gz", _reseal(_edit_json(members, f"runs/{rid}.json", converged)))
    r = _cli("runs", "import", str(tmp_path / "c.tar.gz"), "--db", f"sqlite:///{tmp_path / 't.db'}")
    if needle is None:
        assert r.exit_code == 0, r.output
    else:
        assert r.exit_code == 2 and needle in " ".join(r.stderr.split()), r.output


def test_a_bundle_of_two_builds_adds_the_new_one_after_a_present_one(source, windowed, tmp_path):
    """Two stores' runs in one bundle (two builds): where the first build is already in the store,
    the second is still added, with its run."""
    from bench.bundle import export_runs

    url, rid = windowed
    export_runs(open_store(url), [rid], tmp_path / "w.tar.gz")
    ours, theirs = _members(source["bundle"]), _members(tmp_path / "w.tar.gz")
    manifest, extra = json.loads(ours["bundle.json"]), json.loads(theirs["bundle.json"])
    for key in ("runs", "builds"):
        manifest[key] += extra[key]
    manifest["split_hashes"].update(extra["split_hashes"])
    both = {**ours, **{n: d for n, d in theirs.items() if n != "bundle.json"},
            "bundle.json": json.dumps(manifest).encode()}
    _write(tmp_path / "both.tar.gz", _reseal(both))
    target = f"sqlite:///{tmp_path / 't.db'}"
    assert _cli("runs", "import", str(source["bundle"]), "--db", target).exit_code == 0
    r = _cli("runs", "import", str(tmp_path / "both.tar.gz"), "--db", target, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert (summary["builds_present"], summary["builds_added"], summary["runs_added"]) == (
        manifest["builds"][:1], extra["builds"], [rid])
