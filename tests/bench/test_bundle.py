"""Portable results: `bench runs export` → `bench runs import` into a fresh SQLite and a fresh
PostgreSQL store gives identical report rows; importing twice changes nothing; a split-hash
conflict and every malformed or tampered bundle are refused with one message, the store left
unchanged."""

import hashlib
import io
import json
import sqlite3
import tarfile
import tempfile

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from bench.cli import app
from bench.store import Base, Build, BuildProblem, Model, Run, RunDigest, open_store, session

pytestmark = pytest.mark.integration


def make_source(tmp) -> dict:
    """A real store under `tmp`: a small build and one cell run with seeds 0 and 1, exported to a
    bundle."""
    url = f"sqlite:///{tmp / 'src.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCH_HOME", str(tmp / "home"))
        r = CliRunner().invoke(app, ["build", "--limit", "12", "--k", "4", "--engine", "torch", "--dtype", "fp32",
                                     "--band", "0", "1", "--db", url, "--json"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(app, ["run", "--algo", "grpo", "--dtype", "fp32", "--seeds", "2", "--all-seeds",
                                     "--max-steps", "2", "--eval-every", "2", "--prompts-per-step", "2",
                                     "--samples-per-prompt", "2", "--db", url, "--json"])
        assert r.exit_code == 0, r.output
        runs = [x["run"] for x in json.loads(r.stdout)]
        bundle = tmp / "bundle.tar.gz"
        r = CliRunner().invoke(app, ["runs", "export", *runs, "--out", str(bundle), "--db", url])
        assert r.exit_code == 0, r.output
    return {"url": url, "runs": runs, "bundle": bundle}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_source(tmp_path_factory.mktemp("bundle"))


def _cli(*args):
    return CliRunner().invoke(app, list(args))


def _views(url, runs):
    """What a reader sees: the cell report, the per-run report, each run's `runs show --json`."""
    cells = json.loads(_cli("report", "--db", url, "--json").stdout)["cells"]
    per_run = json.loads(_cli("report", "--runs", "--db", url, "--json").stdout)["runs"]
    shows = [json.loads(_cli("runs", "show", r, "--db", url, "--json").stdout) for r in runs]
    return cells, per_run, shows


def _counts(url):
    engine = open_store(url)
    with engine.connect() as c:
        return {t.name: c.execute(select(func.count()).select_from(t)).scalar() for t in Base.metadata.sorted_tables}


def test_export_import_gives_identical_report_rows(source, db_url):
    r = _cli("runs", "import", str(source["bundle"]), "--db", db_url, "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["runs_added"]) == 2
    got, want = _views(db_url, source["runs"]), _views(source["url"], source["runs"])
    assert got == want
    cells = got[0]
    assert len(cells) == 1 and cells[0]["seeds"] == [0, 1] and cells[0]["passes"] == "0/2"
    show = got[2][0]
    assert show["calibration"] and show["provenance"] and show["config"]["seed"] == 0 and show["evals"]
    before = _counts(db_url)
    r = _cli("runs", "import", str(source["bundle"]), "--db", db_url, "--json")     # idempotent
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert sorted(summary["runs_present"]) == sorted(source["runs"]) and not summary["runs_added"]
    assert _counts(db_url) == before
    with session(open_store(db_url)) as s:
        b = s.scalars(select(Build)).one()
        assert b.split_hash == json.loads(
            _cli("builds", "show", b.id, "--db", source["url"], "--json").stdout)["split_hash"]

    def kept(url):
        with session(open_store(url)) as s:
            return s.scalars(select(BuildProblem.problem_id).where(BuildProblem.kept.is_(True))
                             .order_by(BuildProblem.position)).all()

    assert kept(db_url) == kept(source["url"]) and kept(db_url)          # the same split, kept


def test_a_build_with_another_split_hash_refuses_the_bundle(source, tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    with tarfile.open(source["bundle"]) as tar:
        build_id = json.load(tar.extractfile("bundle.json"))["builds"][0]
    with session(open_store(url)) as s:
        m = Model(name="tiny-math", path="/x", weights_hash="other")
        s.add(m)
        s.flush()
        s.add(Build(id=build_id, model_id=m.id, source="elsewhere", engine="torch", dtype="fp32", k=4, lo=0, hi=1,
                    seed=0, settings_hash="h", status="complete", n_problems=1, n_kept=1))
        s.flush()
        s.add(BuildProblem(build_id=build_id, problem_id="q", position=0, problem="1+1", answer="2", n_samples=4,
                           n_correct=2, accuracy=0.5, bucket="kept", kept=True))
    before = _counts(url)
    r = _cli("runs", "import", str(source["bundle"]), "--db", url)
    assert r.exit_code == 2 and "not the same split" in r.stderr, r.output
    with tarfile.open(source["bundle"]) as tar:
        theirs = json.load(tar.extractfile("bundle.json"))["split_hashes"][build_id]
    from bench.problem_ids import split_hash

    ours = split_hash([("q", "2")])
    assert f"with split hash {ours[:12]}…, the bundle's is {theirs[:12]}…: not" in " ".join(r.stderr.split())
    assert _counts(url) == before


def _members(bundle):
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _write(path, members, extra=()):
    """A .tar.gz of `members` (name → bytes) plus raw TarInfo members `extra`."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _reseal(members):
    """Recompute bundle.json's member hashes (a tamperer who knows the format)."""
    manifest = json.loads(members["bundle.json"])
    manifest["members"] = {n: hashlib.sha256(d).hexdigest() for n, d in members.items() if n != "bundle.json"}
    members["bundle.json"] = json.dumps(manifest).encode()
    return members


def _run_member(members):
    return next(n for n in members if n.startswith("runs/"))


def _build_member(members):
    return next(n for n in members if n.startswith("builds/"))


def _edit_json(members, name, fn):
    obj = json.loads(members[name])
    fn(obj)
    members[name] = json.dumps(obj).encode()
    return members


def _link(name, target):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


CASES = {
    "bad JSON": (lambda m: _reseal({**m, _run_member(m): b"{not json"}), (), "is not valid JSON"),
    "missing member": (lambda m: {n: d for n, d in m.items() if n != _run_member(m)}, (), "missing member(s) runs/"),
    "missing bundle.json": (lambda m: {n: d for n, d in m.items() if n != "bundle.json"}, (),
                            "missing member bundle.json"),
    "wrong schema version": (lambda m: _edit_json(m, "bundle.json", lambda o: o.update(schema_version=2)), (),
                             "schema version 2"),
    "not a bench bundle": (lambda m: _edit_json(m, "bundle.json", lambda o: o.update(format="x")), (),
                           "not a bench-run-bundle"),
    "path escaping with ..": (lambda m: m, ((tarfile.TarInfo("../escape.json"), b"{}"),), "outside the extraction"),
    "absolute path": (lambda m: m, lambda tmp: ((tarfile.TarInfo(f"{tmp}/escape.json"), b"{}"),),   # inside tmp_path
                      "outside the extraction"),
    "nested ..": (lambda m: m, ((tarfile.TarInfo("runs/../../escape.json"), b"{}"),), "outside the extraction"),
    "symlink": (lambda m: m, ((_link("runs/link.json", "/etc/passwd"), None),), "not a regular file"),
    "unexpected member": (lambda m: {**m, "notes.txt": b"hi"}, (), "unexpected member 'notes.txt'"),
    "altered member": (lambda m: _edit_json(m, _run_member(m), lambda o: o.update(peak_accuracy=0.99)), (),
                       "was altered"),
    "tampered gold": (lambda m: _reseal(_edit_json(m, _build_member(m),
                                                   lambda o: o["kept"][0].update(answer="12345"))), (),
                      "do not hash to the recorded split hash"),
    "wrong field type": (lambda m: _reseal(_edit_json(m, _run_member(m), lambda o: o["steps"][0].update(step="1"))),
                         (), "has the wrong type"),
    "run without its build": (lambda m: _reseal(_edit_json(m, _run_member(m), lambda o: o.update(build="zzz"))), (),
                              "is not in the bundle"),
    "a checkpoint of no run": (lambda m: _reseal({**m, "checkpoints/zzz/step-000002.pt": b"weights"}), (),
                               "checkpoints/zzz/step-000002.pt: a checkpoint of no run in the bundle"),
    "an evaluation without its score": (lambda m: _reseal(_edit_json(m, _run_member(m),
                                                                     lambda o: o["evals"][0].pop("score"))), (),
                                        "evals[0] lacks score"),
    "a kept problem without its answer": (lambda m: _reseal(_edit_json(m, _build_member(m),
                                                                       lambda o: o["kept"][0].pop("answer"))), (),
                                          "kept[0] lacks answer"),
    "a time that is not ISO": (lambda m: _reseal(_edit_json(m, _run_member(m),
                                                            lambda o: o.update(created_at="yesterday"))), (),
                               "'yesterday' is not an ISO time"),
    "a digest without its chain": (lambda m: _reseal(_edit_json(m, _run_member(m),
                                                                lambda o: o["digests"][-1].pop("chain"))), (),
                                   "digests[1] lacks chain"),
}


@pytest.mark.parametrize("case", list(CASES) + ["not a tar.gz"])
def test_malformed_bundles_are_refused_and_change_nothing(source, tmp_path, case, monkeypatch):
    # extraction happens under $TMPDIR (tempfile.mkdtemp): point it into tmp_path to see what lands there
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    url = f"sqlite:///{tmp_path / 't.db'}"
    with session(open_store(url)) as s:                       # a store with something in it already
        s.add(Model(name="resident", path="/r", weights_hash=None))
    before = _counts(url)
    bad = tmp_path / "bad.tar.gz"
    if case == "not a tar.gz":
        bad.write_bytes(b"\x1f\x8b garbage")
        needle = "not a readable .tar.gz bundle"
    else:
        mutate, extra, needle = CASES[case]
        _write(bad, mutate(_members(source["bundle"])), extra(tmp_path) if callable(extra) else extra)
    r = _cli("runs", "import", str(bad), "--db", url)
    err = " ".join(r.stderr.split())
    assert r.exit_code == 2, r.output
    assert err.count("error:") == 1 and "refused:" in err and needle in err, err
    assert _counts(url) == before
    assert [p for p in tmp_path.rglob("escape.json")] == []              # nothing escaped ...
    assert list(scratch.iterdir()) == []           # ... and the extraction folder is gone with all it held


def test_export_refuses_an_unknown_run(source, tmp_path):
    r = _cli("runs", "export", "nope", "--out", str(tmp_path / "x.tar.gz"), "--db", source["url"])
    assert r.exit_code == 2 and "no run 'nope'" in r.stderr
    assert not (tmp_path / "x.tar.gz").exists()


def test_a_further_along_copy_updates_the_run(source, tmp_path):
    """A run exported while it ran, then again once it ended: the second import updates it."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    members = _members(source["bundle"])
    name = _run_member(members)
    early = _reseal(_edit_json(dict(members), name, lambda o: (o.update(status="running", step=1),
                                                                o["steps"].__delitem__(slice(1, None)))))
    _write(tmp_path / "early.tar.gz", early)
    assert _cli("runs", "import", str(tmp_path / "early.tar.gz"), "--db", url).exit_code == 0
    r = _cli("runs", "import", str(source["bundle"]), "--db", url, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["runs_updated"] == [name[len("runs/"):-len(".json")]]
    with session(open_store(url)) as s:
        assert s.get(Run, name[len("runs/"):-len(".json")]).status == "max_steps"


def _run_fields(url, run_id):
    with session(open_store(url)) as s:
        r = s.get(Run, run_id)
        return {c.name: getattr(r, c.name) for c in Run.__table__.columns}


def _promote(o):
    """The measured exploit: an fp32 max_steps run edited to one more step, converged, rollout
    and train fp16 (then resealed: bundle.json's sums recomputed)."""
    extra = json.loads(json.dumps(o["steps"][-1]))
    extra["step"] = o["step"] + 1
    o["steps"].append(extra)
    o.update(step=o["step"] + 1, status="converged", stop_reason="split accuracy lower bound 0.96 >= 0.95",
             rollout_dtype="fp16", train_dtype="fp16", steps_to_target=o["step"] + 1, peak_accuracy=0.99)


@pytest.mark.parametrize("edit, needle", [
    (_promote, "rollout_dtype: 'fp32' → 'fp16'; train_dtype: 'fp32' → 'fp16'"),
    (lambda o: o.update(train_dtype="bf16"), "train_dtype: 'fp32' → 'bf16'"),             # no further along
    (lambda o: o.update(seed=7), "seed: 0 → 7"),
    (lambda o: o["config"].update(lr=0.5), "config (lr: 0.001 → 0.5)"),
    (lambda o: o.update(created_at="2020-01-01T00:00:00"), "created_at"),
    (lambda o: o["model"].update(weights_hash="0" * 16), "model"),
])
def test_an_import_that_changes_a_stored_runs_identity_is_refused(source, tmp_path, edit, needle):
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert _cli("runs", "import", str(source["bundle"]), "--db", url).exit_code == 0
    members = _members(source["bundle"])
    name = f"runs/{source['runs'][0]}.json"
    _write(tmp_path / "edited.tar.gz", _reseal(_edit_json(members, name, edit)))
    before, fields = _counts(url), _run_fields(url, source["runs"][0])
    r = _cli("runs", "import", str(tmp_path / "edited.tar.gz"), "--db", url)
    err = " ".join(r.stderr.split())
    assert r.exit_code == 2 and err.count("error:") == 1, r.output
    assert "changes its identity" in err and needle in err, err
    assert _counts(url) == before and _run_fields(url, source["runs"][0]) == fields
    assert fields["rollout_dtype"] == "fp32" and fields["status"] == "max_steps"


def _rechain(o, edit):
    """Edit a run's state digests and link their chain again (a tamperer who knows the format)."""
    from bench.statedigest import genesis, link

    edit(o["digests"])
    prev = genesis(o["id"])
    for d in o["digests"]:
        d["chain"] = prev = link(prev, d["step"], d["digest"], d.get("scheme", 1))


@pytest.mark.parametrize("edit, needle", [
    (lambda o: o["steps"][0].update(reward=1.0), "step 1 reward (column)"),
    (lambda o: o["steps"][1]["metrics"].update(kl_k3=0.0), "step 2 kl_k3"),
    (lambda o: o["steps"].__delitem__(0), "it lacks stored step 1"),
    (lambda o: o["evals"][0].update(score=0.999), ", bundle avg@4 0.999"),
    (lambda o: o["evals"].__delitem__(0), "bundle none"),
    (lambda o: o["provenance"].update(cpu_16bit="none" if o["provenance"].get("cpu_16bit") == "all" else "all"),
     "its provenance differs"),
    (lambda o: o["calibration"].update(k3=0.0), "calibration differs"),
    (lambda o: _rechain(o, lambda ds: ds[0].update(digest="0" * 64)), "its state digest at step 0 differs"),
])
def test_a_further_along_copy_must_keep_every_stored_step(source, tmp_path, edit, needle):
    """A copy one step further along that rewrites what the store already holds is refused."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert _cli("runs", "import", str(source["bundle"]), "--db", url).exit_code == 0
    name = f"runs/{source['runs'][0]}.json"

    def further(o):
        edit(o)
        extra = json.loads(json.dumps(o["steps"][-1]))
        extra["step"] = o["step"] + 1
        o["steps"].append(extra)
        o["step"] += 1

    _write(tmp_path / "edited.tar.gz", _reseal(_edit_json(_members(source["bundle"]), name, further)))
    before, fields = _counts(url), _run_fields(url, source["runs"][0])
    r = _cli("runs", "import", str(tmp_path / "edited.tar.gz"), "--db", url)
    err = " ".join(r.stderr.split())
    assert r.exit_code == 2 and "not a continuation" in err and needle in err, err
    assert _counts(url) == before and _run_fields(url, source["runs"][0]) == fields


def test_a_continuation_imports_though_a_resume_retimed_its_steps(source, tmp_path):
    """A run exported while running, resumed past a kill (its last step re-run: new timings,
    the same numbers), exported again: the second bundle updates the run."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    members = _members(source["bundle"])
    name = _run_member(members)
    rid = name[len("runs/"):-len(".json")]

    def early(o):
        o.update(status="running", step=1)
        del o["steps"][1:]
        o["evals"] = [e for e in o["evals"] if e["step"] <= 1]
        o["steps"][0]["metrics"].update(time_rollout=123.0, tokens_per_s=1.0, wall_s=124.0)
        o["steps"][0]["created_at"] = "2020-01-01T00:00:00"

    _write(tmp_path / "early.tar.gz", _reseal(_edit_json(dict(members), name, early)))
    assert _cli("runs", "import", str(tmp_path / "early.tar.gz"), "--db", url).exit_code == 0
    r = _cli("runs", "import", str(source["bundle"]), "--db", url, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["runs_updated"] == [rid]
    assert _views(url, source["runs"]) == _views(source["url"], source["runs"])


def test_a_status_its_evaluations_do_not_support_is_refused(source, tmp_path):
    """The exploit of the verdicts issue: a run at its budget whose `status` alone is rewritten to
    converged, the bundle resealed: refused at import, naming the rule and the readings."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    name = f"runs/{source['runs'][0]}.json"
    _write(tmp_path / "edited.tar.gz", _reseal(_edit_json(_members(source["bundle"]), name,
                                                           lambda o: o.update(status="converged"))))
    r = _cli("runs", "import", str(tmp_path / "edited.tar.gz"), "--db", url)
    err = " ".join(r.stderr.split())
    assert r.exit_code == 2 and err.count("error:") == 1, r.output
    assert "status 'converged' is not supported by its evaluations" in err and "the converged rule" in err
    assert "by the budget rule at step 2" in err and "readings " in err and "nothing imported" in err
    assert _counts(url)["runs"] == 0


def test_a_gated_run_from_before_its_status_imports_as_miscalibrated(source, tmp_path):
    """A bundle from a bench that stored the calibration gate's end as `failed`: it reads as
    `miscalibrated` (FAIL), as the store's migration reads it."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    name = f"runs/{source['runs'][0]}.json"

    def gated(o):
        o.update(status="failed", step=0, steps=[], evals=[], peak_accuracy=None, final_accuracy=None,
                 stop_reason="step-0 calibration failed (band)")
        o["calibration"].update(ok=False, failed=["band"])

    _write(tmp_path / "gated.tar.gz", _reseal(_edit_json(_members(source["bundle"]), name, gated)))
    r = _cli("runs", "import", str(tmp_path / "gated.tar.gz"), "--db", url)
    assert r.exit_code == 0, r.output
    per_run = {x["run"]: x for x in json.loads(_cli("report", "--runs", "--db", url, "--json").stdout)["runs"]}
    gate = per_run[source["runs"][0]]
    assert (gate["status"], gate["sanity"], gate["decided_by"], gate["decided_step"]) == (
        "miscalibrated", "FAIL", "calibration", 0)


def test_the_report_recomputes_a_status_edited_in_the_store(source, tmp_path):
    """A stored run whose status is rewritten in the store itself: the report gives the verdict its
    evaluations support (UNDECIDED at its budget) and says the status is not supported."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert _cli("runs", "import", str(source["bundle"]), "--db", url).exit_code == 0
    with session(open_store(url)) as s:
        s.get(Run, source["runs"][0]).status = "converged"
    runs = {x["run"]: x for x in json.loads(_cli("report", "--runs", "--db", url, "--json").stdout)["runs"]}
    edited, honest = runs[source["runs"][0]], runs[source["runs"][1]]
    assert (honest["sanity"], honest["decided_by"], honest["decided_step"]) == ("UNDECIDED", "budget", 2)
    assert (edited["status"], edited["sanity"], edited["decided_by"]) == ("converged", "UNDECIDED", "budget")
    cells = json.loads(_cli("report", "--db", url, "--json").stdout)["cells"]
    assert [(c["sanity"], c["passes"], c["evidence"]) for c in cells] == [("UNDECIDED", "0/2", "0/2 pass: p ≥ 0.00")]
    text = " ".join(_cli("report", "--db", url).stdout.split())
    assert "NOT SUPPORTED BY ITS EVALUATIONS: status 'converged' is not supported" in text


# ------------------------------------------------------------------ import: what counts as further along

def test_a_run_that_ended_failed_at_the_step_it_was_running_is_further_along(source, tmp_path):
    """Same step, `running` in the store, `failed` (an error, Ctrl-C) in the bundle: the ended
    copy updates the stored one; a copy that reached a verdict or its budget there updates a
    failed one."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    members = _members(source["bundle"])
    name = _run_member(members)
    _write(tmp_path / "running.tar.gz", _reseal(_edit_json(dict(members), name, lambda o: o.update(status="running"))))
    _write(tmp_path / "failed.tar.gz", _reseal(_edit_json(dict(members), name, lambda o: o.update(status="failed"))))
    assert _cli("runs", "import", str(tmp_path / "running.tar.gz"), "--db", url).exit_code == 0
    r = _cli("runs", "import", str(tmp_path / "failed.tar.gz"), "--db", url, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["runs_updated"] == [name[len("runs/"):-len(".json")]]
    r = _cli("runs", "import", str(tmp_path / "running.tar.gz"), "--db", url, "--json")   # and never back
    assert name[len("runs/"):-len(".json")] in json.loads(r.stdout)["runs_present"]
    with session(open_store(url)) as s:              # its calibration passed: failed, not miscalibrated
        assert s.get(Run, name[len("runs/"):-len(".json")]).status == "failed"
    r = _cli("runs", "import", str(source["bundle"]), "--db", url, "--json")      # a run's end beats an error
    assert json.loads(r.stdout)["runs_updated"] == [name[len("runs/"):-len(".json")]]


@pytest.mark.parametrize("config, staleness", [(lambda c: c.update(staleness=2), 2),
                                               (lambda c: c.pop("staleness"), 0)])    # a run from before staleness
def test_a_run_imported_twice_keeps_its_staleness_and_identity(source, tmp_path, config, staleness):
    """A run with staleness K (its config's, copied to the column on insert; 0 where its config
    has none) imports again as the same run."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    members = _members(source["bundle"])
    name = _run_member(members)
    _write(tmp_path / "stale.tar.gz", _reseal(_edit_json(members, name, lambda o: config(o["config"]))))
    assert _cli("runs", "import", str(tmp_path / "stale.tar.gz"), "--db", url).exit_code == 0
    r = _cli("runs", "import", str(tmp_path / "stale.tar.gz"), "--db", url, "--json")
    assert r.exit_code == 0, r.output
    assert name[len("runs/"):-len(".json")] in json.loads(r.stdout)["runs_present"]
    with session(open_store(url)) as s:
        assert s.get(Run, name[len("runs/"):-len(".json")]).staleness == staleness


def test_a_run_without_a_calibration_imports(source, tmp_path):
    """A run that recorded no step-0 calibration (verl's, or from before the gate) imports as it is."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    members = _members(source["bundle"])
    name = _run_member(members)
    _write(tmp_path / "nocal.tar.gz", _reseal(_edit_json(members, name, lambda o: o.update(calibration=None))))
    r = _cli("runs", "import", str(tmp_path / "nocal.tar.gz"), "--db", url)
    assert r.exit_code == 0, r.output
    with session(open_store(url)) as s:
        run = s.get(Run, name[len("runs/"):-len(".json")])
        assert run.calibration is None and run.status == "max_steps"


# ------------------------------------------------------------------ the messages' helpers

def test_values_and_config_changes_are_shown_short():
    from bench.bundle import _config_change, _show

    assert _show("x" * 38) == repr("x" * 38)                               # 40 characters: whole
    assert _show("x" * 39) == repr("x" * 39)[:37] + "..."                  # 41: cut to 37 and "..."
    assert len(_show("x" * 39)) == 40
    three = _config_change({"a": 1, "b": 1, "c": 1}, {"a": 2, "b": 2, "c": 2})
    assert three == "config (a: 1 → 2, b: 1 → 2, c: 1 → 2)"
    assert _config_change({"a": 1, "b": 1, "c": 1, "d": 1}, {}) == "config (a: 1 → None, b: 1 → None, c: 1 → None, …)"
    assert _config_change(None, {"a": 1}) == "config"


def test_a_store_that_refuses_a_write_refuses_the_bundle_whole(source, tmp_path):
    """A store whose own rule stops the write (here a trigger): one message with the store's
    reason, nothing imported."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    open_store(url).dispose()
    with sqlite3.connect(tmp_path / "t.db") as c:
        c.execute("CREATE TRIGGER frozen BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'runs are frozen here'); END")
    before = _counts(url)
    r = _cli("runs", "import", str(source["bundle"]), "--db", url)
    err = " ".join(r.stderr.split())
    assert r.exit_code == 2 and err.count("error:") == 1, r.output
    assert "the store refused the bundle ((sqlite3.IntegrityError) runs are frozen here); nothing imported" in err
    assert _counts(url) == before


def test_a_run_already_present_does_not_stop_the_next_from_importing(source, tmp_path):
    from bench.bundle import export_runs

    url = f"sqlite:///{tmp_path / 't.db'}"
    first, second = source["runs"]
    export_runs(open_store(source["url"]), [first], tmp_path / "first.tar.gz")
    assert _cli("runs", "import", str(tmp_path / "first.tar.gz"), "--db", url).exit_code == 0
    r = _cli("runs", "import", str(source["bundle"]), "--db", url, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert (summary["runs_present"], summary["runs_added"]) == ([first], [second])


def test_a_bundle_of_the_formats_first_version_imports(source, tmp_path):
    """Version 1 is the format's first: a bundle that says so stays readable."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    members = _edit_json(_members(source["bundle"]), "bundle.json", lambda o: o.update(schema_version=1))
    _write(tmp_path / "v1.tar.gz", members)
    assert _cli("runs", "import", str(tmp_path / "v1.tar.gz"), "--db", url).exit_code == 0


def test_a_stored_build_without_its_split_hash_is_compared_by_its_kept_problems(source, tmp_path):
    """A build stored by a bench from before the split-hash column: the store's side of the
    comparison is computed from that build's kept problems, so the same split imports."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert _cli("runs", "import", str(source["bundle"]), "--db", url).exit_code == 0
    with session(open_store(url)) as s:
        s.scalars(select(Build)).one().split_hash = None
        m = s.scalars(select(Model)).first()
        s.add(Build(id="other", model_id=m.id, source="x", engine="torch", dtype="fp32", k=4, lo=0, hi=1, seed=0,
                    settings_hash="h", status="complete", n_problems=1, n_kept=1))
        s.flush()
        s.add(BuildProblem(build_id="other", problem_id="q", position=0, problem="1+1", answer="2", n_samples=4,
                           n_correct=2, accuracy=0.5, bucket="kept", kept=True))
    r = _cli("runs", "import", str(source["bundle"]), "--db", url, "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["builds_present"]) == 1


def test_a_run_whose_seed_is_not_recorded_reads_its_configs(source, tmp_path):
    """A bundle run with no seed of its own (a bench from before the column): its config's seed is
    its identity, as an insert fills the column."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert _cli("runs", "import", str(source["bundle"]), "--db", url).exit_code == 0
    members = _members(source["bundle"])
    edited = _reseal(_edit_json(members, _run_member(members), lambda o: o.update(seed=None)))
    _write(tmp_path / "noseed.tar.gz", edited)
    r = _cli("runs", "import", str(tmp_path / "noseed.tar.gz"), "--db", url, "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["runs_present"]) == 2


def test_every_stored_run_of_a_bundle_is_checked_though_a_new_one_comes_first(source, tmp_path):
    """The bundle's first run is new to the store, its second is stored and the bundle changes its
    identity: refused, the new run not imported either."""
    from bench.bundle import export_runs

    url = f"sqlite:///{tmp_path / 't.db'}"
    first, second = source["runs"]
    export_runs(open_store(source["url"]), [second], tmp_path / "second.tar.gz")
    assert _cli("runs", "import", str(tmp_path / "second.tar.gz"), "--db", url).exit_code == 0
    before = _counts(url)
    edited = _reseal(_edit_json(_members(source["bundle"]), f"runs/{second}.json", lambda o: o.update(seed=7)))
    _write(tmp_path / "edited.tar.gz", edited)
    r = _cli("runs", "import", str(tmp_path / "edited.tar.gz"), "--db", url)
    assert r.exit_code == 2 and f"run {second} exists in this store and the bundle changes its identity" in " ".join(
        r.stderr.split()), r.output
    assert _counts(url) == before


def test_a_bundle_from_before_digest_schemes_imports_its_digests_as_scheme_1(source, tmp_path):
    """Digests without a scheme (bundles written before it was recorded) were scheme 1's: chained
    without it, imported with scheme 1. A scheme this bench does not know is refused; so is a
    scheme-2 digest relabelled as scheme 1 (its chain does not link)."""
    from bench.statedigest import genesis, link

    def old_format(o):
        prev = genesis(o["id"])
        for d in o["digests"]:
            del d["scheme"]
            d["chain"] = prev = link(prev, d["step"], d["digest"], 1)

    members = _members(source["bundle"])
    name = _run_member(members)
    assert {d["scheme"] for d in json.loads(members[name])["digests"]} == {2}
    url = f"sqlite:///{tmp_path / 'old.db'}"
    _write(tmp_path / "old.tar.gz", _reseal(_edit_json(dict(members), name, old_format)))
    r = _cli("runs", "import", str(tmp_path / "old.tar.gz"), "--db", url)
    assert r.exit_code == 0, r.output
    with session(open_store(url)) as s:
        run = name.removeprefix("runs/").removesuffix(".json")
        assert {d.scheme for d in s.scalars(select(RunDigest).where(RunDigest.run_id == run))} == {1}
    for edit, needle in ((lambda o: o["digests"][0].update(scheme=3), "scheme 3 is not one of (1, 2)"),
                         (lambda o: o["digests"][0].update(scheme=1), "do not chain")):
        _write(tmp_path / "bad.tar.gz", _reseal(_edit_json(_members(source["bundle"]), name, edit)))
        r = _cli("runs", "import", str(tmp_path / "bad.tar.gz"), "--db", f"sqlite:///{tmp_path / 'bad.db'}")
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), r.output


def test_migration_0012_marks_the_stored_digests_scheme_1(tmp_path):
    """Digests stored before revision 0012 hashed the process-wide RNG states: they read as scheme 1."""
    import sqlalchemy as sa

    from conftest import store_at_revision

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = store_at_revision(url, "0011")
    with engine.begin() as c:
        c.execute(sa.text("INSERT INTO runs (id, model_id, build_id, algo, rollout_dtype, train_dtype, trainer, "
                          "engine, config, status, step, wall_s, staleness, created_at, updated_at) VALUES ('r1', 1, "
                          "'b1', 'grpo', 'fp32', 'fp32', 'native', 'torch', '{}', 'max_steps', 2, 0, 0, "
                          "'2026-01-01', '2026-01-01')"))
        c.execute(sa.text("INSERT INTO run_digests (run_id, step, digest, chain) VALUES ('r1', 0, 'd', 'c')"))
    engine.dispose()
    with session(open_store(url)) as s:
        assert [(d.step, d.scheme) for d in s.scalars(select(RunDigest))] == [(0, 1)]


def test_an_old_run_continued_by_a_newer_bench_imports_over_its_old_copy(source, tmp_path):
    """An old run (scheme-1 digests), exported while it ran, is in the store; a resume by this
    bench re-recorded its last evaluation's digest under scheme 2 (another value: scheme 1 hashed
    the process's RNG states) and ended it: that copy imports. A scheme-1 digest that changed is
    still refused, and so are a chain whose scheme goes back from 2 to 1 and a scheme written as
    a float."""
    from bench.statedigest import genesis, link

    name = f"runs/{source['runs'][0]}.json"

    def chained(o, schemes, last_digest=None):
        prev = genesis(o["id"])
        for d, scheme in zip(o["digests"], schemes):
            d["scheme"] = scheme
            if last_digest and d is o["digests"][-1]:
                d["digest"] = last_digest
            d["chain"] = prev = link(prev, d["step"], d["digest"], scheme)

    n = len(json.loads(_members(source["bundle"])[name])["digests"])
    assert n >= 2

    def running_old(o):
        o.update(status="running", stop_reason=None)
        chained(o, [1] * n)

    def imported(url, edit):
        _write(tmp_path / "x.tar.gz", _reseal(_edit_json(_members(source["bundle"]), name, edit)))
        return _cli("runs", "import", str(tmp_path / "x.tar.gz"), "--db", url)

    url = f"sqlite:///{tmp_path / 't.db'}"
    assert imported(url, running_old).exit_code == 0
    r = imported(url, lambda o: chained(o, [1] * (n - 1) + [2], last_digest="a" * 64))
    assert r.exit_code == 0, r.output
    with session(open_store(url)) as s:
        run = source["runs"][0]
        assert s.get(Run, run).status == "max_steps"
        assert [d.scheme for d in s.scalars(select(RunDigest).where(RunDigest.run_id == run)
                                            .order_by(RunDigest.step))] == [1] * (n - 1) + [2]

    url2 = f"sqlite:///{tmp_path / 't2.db'}"
    assert imported(url2, running_old).exit_code == 0
    r = imported(url2, lambda o: chained(o, [1] * n, last_digest="b" * 64))
    assert r.exit_code == 2 and "its state digest at step" in " ".join(r.stderr.split()), r.output
    for edit, needle in ((lambda o: chained(o, [2] * (n - 1) + [1]), "older than the scheme 2 before it"),
                         (lambda o: o["digests"][0].update(scheme=2.0), "scheme 2.0 is not one of")):
        r = imported(f"sqlite:///{tmp_path / 'w.db'}", edit)
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), r.output
