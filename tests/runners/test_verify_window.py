"""`bench runs verify RUN --window A:B` (runners/verify.py): a run keeps its checkpoints at its
evaluations (`--keep-checkpoints`) and chains a digest of its state at each (bench/statedigest.py);
a window re-run from a kept checkpoint is bit-identical on an untouched run — also after the run
travelled as a bundle into a fresh store — and an edited evaluation inside the window fails it,
naming the step and the metric; a checkpoint that is not the run's state, a missing one, a window
that does not start at an evaluation and an edited digest are refused (exit 2, nothing stored)."""

import json
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from typer.testing import CliRunner

from bench.cli import app
from bench.statedigest import SCHEME, check_chain, checkpoint_digest, genesis, kept_checkpoint, link
from bench.store import Eval, Run, RunDigest, RunVerification, open_store, session
from conftest import small_grpo_run

pytestmark = pytest.mark.integration


def _cli(*args):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """A 12-problem build and a 6-step grpo fp32 run evaluated every 2 steps, its checkpoints kept
    at every evaluation, exported."""
    tmp = tmp_path_factory.mktemp("window")
    url, run_id = small_grpo_run(tmp, "--max-steps", "6", "--eval-every", "2", "--checkpoint-every", "4",
                                 "--keep-checkpoints", "2")
    bundle = tmp / "bundle.tar.gz"
    assert _cli("runs", "export", run_id, "--out", str(bundle), "--db", url).exit_code == 0
    with session(open_store(url)) as s:
        ckpt_dir = s.get(Run, run_id).checkpoint_dir
    return {"url": url, "run": run_id, "bundle": bundle, "ckpt_dir": ckpt_dir, "tmp": tmp}


def _digests(url, run_id):
    with session(open_store(url)) as s:
        return [(d.step, d.digest, d.chain, d.scheme) for d in s.scalars(select(RunDigest)
                                                                         .where(RunDigest.run_id == run_id)
                                                                         .order_by(RunDigest.step))]


def test_digests_chain_and_kept_checkpoints_are_the_states_they_name(kept):
    rows = _digests(kept["url"], kept["run"])
    assert [r[0] for r in rows] == [0, 2, 4, 6] and check_chain(kept["run"], rows) is None
    assert {r[3] for r in rows} == {SCHEME}
    assert rows[0][2] == link(genesis(kept["run"]), 0, rows[0][1], SCHEME)
    assert rows[0][2] != link(genesis(kept["run"]), 0, rows[0][1], 1)   # the scheme is chained: no relabelling
    for step, digest, *_ in rows[1:]:
        state = torch.load(kept_checkpoint(kept["ckpt_dir"], step), weights_only=False)
        assert state["step"] == step
        assert checkpoint_digest(state) == digest
    assert check_chain(kept["run"], [rows[0], (2, "0" * 64, *rows[1][2:]), *rows[2:]]) == \
        "the chain does not link at step 2"
    assert check_chain("another-run", rows) == "the chain does not link at step 0"


def test_an_untouched_window_re_runs_bit_identical(kept):
    r = _cli("runs", "verify", kept["run"], "--window", "2:6", "--json", "--db", kept["url"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert (got["verdict"], got["window_start"], got["steps"], got["differences"]) == ("bit-identical", 2, 6, 0)
    with session(open_store(kept["url"])) as s:
        v = s.scalars(select(RunVerification).order_by(RunVerification.id.desc())).first()
        assert (v.window_start, v.steps, v.verdict) == (2, 6, "bit-identical")
    text = " ".join(_cli("runs", "verify", kept["run"], "--window", "4:6", "--db", kept["url"]).stdout.split())
    assert "re-ran steps 5–6 from its checkpoint at step 4" in text and "bit-identical" in text


def test_a_bundle_edited_inside_the_window_fails_it_naming_step_and_metric(kept, tmp_path):
    """The run travels as a bundle to a fresh store, with its kept checkpoint given by path; an
    untouched copy verifies its window bit for bit, one whose step-4 split evaluation was edited
    (and resealed) fails at step 4, eval split."""
    from test_verify import _members, _write_resealed

    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert _cli("runs", "import", str(kept["bundle"]), "--db", url).exit_code == 0
    ckpt = kept_checkpoint(kept["ckpt_dir"], 2)
    r = _cli("runs", "verify", kept["run"], "--window", "2:6", "--checkpoint", str(ckpt), "--json", "--db", url)
    assert r.exit_code == 0 and json.loads(r.stdout)["verdict"] == "bit-identical", r.output

    members = _members(kept["bundle"])
    name = f"runs/{kept['run']}.json"
    obj = json.loads(members[name])
    (e,) = [e for e in obj["evals"] if e["step"] == 4 and e["benchmark"] == "split"]
    e["score"] = round(e["score"] + (0.05 if e["score"] < 0.9 else -0.05), 6)
    obj["peak_accuracy"] = max(x["score"] for x in obj["evals"] if x["benchmark"] == "split")
    members[name] = json.dumps(obj).encode()
    edited = _write_resealed(tmp_path / "edited.tar.gz", members)
    url2 = f"sqlite:///{tmp_path / 'fresh2.db'}"
    r = _cli("runs", "import", str(edited), "--db", url2)
    assert r.exit_code == 0, r.output                  # the checksums cannot tell
    r = _cli("runs", "verify", kept["run"], "--window", "2:6", "--checkpoint", str(ckpt), "--json", "--db", url2)
    assert r.exit_code == 1, r.output
    d = json.loads(r.stdout)["first_difference"]
    assert (d["step"], d["metric"]) == (4, "eval split")


def test_what_cannot_be_a_window_is_refused(kept, tmp_path):
    url, run = kept["url"], kept["run"]
    with session(open_store(url)) as s:
        before = s.query(RunVerification).count()
    bad = tmp_path / "bad.pt"
    state = torch.load(kept_checkpoint(kept["ckpt_dir"], 2), weights_only=False)
    next(iter(state["model"].values())).add_(1e-3)
    torch.save(state, bad)
    for args, needle in ((["--window", "3:6"], "recorded no state digest at step 3"),
                         (["--window", "6:4"], "write A:B with 0 <= A < B"),
                         (["--window", "2:6", "--checkpoint", str(bad)], "is not run"),
                         (["--window", "2:6", "--checkpoint", str(tmp_path / "none.pt")], "kept no checkpoint"),
                         (["--window", "6:9"], "none after step 6")):
        r = _cli("runs", "verify", run, *args, "--db", url)
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), (args, r.output)
    with session(open_store(url)) as s:
        assert s.query(RunVerification).count() == before
        row = s.get(RunDigest, (run, 4))
        saved, row.digest = row.digest, "f" * 64                # an edited digest breaks the chain
    r = _cli("runs", "verify", run, "--window", "2:6", "--db", url)
    assert r.exit_code == 2 and "do not chain (the chain does not link at step 4)" in " ".join(r.output.split())
    with session(open_store(url)) as s:
        s.get(RunDigest, (run, 4)).digest = saved
        assert s.scalars(select(Eval).where(Eval.run_id == run)).first() is not None


def _as_scheme_1(url, run, ckpt_dir, tmp_path):
    """The run as a bench before digest scheme 2 stored it: each kept checkpoint also holds the
    process-wide torch and Python RNG states (of some process), each digest hashes them, and the
    chain links without the scheme. In a copy of the store and the checkpoints."""
    import random
    import shutil

    from bench.statedigest import checkpoint_digest

    from runners.results_repo import _copy_store

    db = tmp_path / "old.db"
    _copy_store(Path(url.removeprefix("sqlite:///")), db)          # the WAL too
    kept_dir = tmp_path / "ckpt"
    shutil.copytree(ckpt_dir, kept_dir)
    old_url = f"sqlite:///{db}"
    rng = (torch.get_rng_state(), random.getstate())
    with session(open_store(old_url)) as s:
        rows = s.scalars(select(RunDigest).where(RunDigest.run_id == run).order_by(RunDigest.step)).all()
        prev = genesis(run)
        for d in rows:
            path = kept_checkpoint(kept_dir, d.step)
            if path.exists():
                state = torch.load(path, weights_only=True)
                state["rng_torch"], state["rng_python"] = rng
                torch.save(state, path)
                d.digest = checkpoint_digest(state, 1)
            else:                                       # step 0: no checkpoint; a digest no re-run can repeat
                d.digest = "0" * 64
            d.scheme, d.chain = 1, link(prev, d.step, d.digest, 1)
            prev = d.chain
        s.get(Run, run).checkpoint_dir = str(kept_dir)
    return old_url


def test_a_run_from_before_digest_scheme_2_verifies_with_its_digests_not_comparable(kept, tmp_path):
    """verify from step 0 and a window from an old kept checkpoint (checked against scheme 1's hash,
    RNG states and all) both exit 0: every metric and evaluation bit-identical, the digests "not
    comparable (scheme 1)", said in the text and on the run's verification level."""
    url = _as_scheme_1(kept["url"], kept["run"], kept["ckpt_dir"], tmp_path)
    r = _cli("runs", "verify", kept["run"], "--steps", "6", "--json", "--db", url)
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert (got["verdict"], got["digests"]) == ("bit-identical", "not comparable (scheme 1)")
    r = _cli("runs", "verify", kept["run"], "--window", "2:6", "--db", url)
    text = " ".join(r.stdout.split())
    assert r.exit_code == 0 and "bit-identical (state digests not comparable (scheme 1):" in text, r.output
    with session(open_store(url)) as s:
        assert [v.digests for v in s.scalars(select(RunVerification).order_by(RunVerification.id))][-2:] == [
            "not comparable (scheme 1)"] * 2
    report = json.loads(_cli("report", "--runs", "--json", "--db", url).stdout)
    (row,) = [x for x in report["runs"] if x["run"] == kept["run"]]
    assert row["verification"] == "fully re-run (6 steps, state digests not comparable (scheme 1))"
    # an old checkpoint is still checked against its own scheme: edited, it is refused
    bad = tmp_path / "bad.pt"
    state = torch.load(kept_checkpoint(tmp_path / "ckpt", 2), weights_only=True)
    state["rng_python"] = (3, tuple(range(625)), None)
    torch.save(state, bad)
    r = _cli("runs", "verify", kept["run"], "--window", "2:6", "--checkpoint", str(bad), "--db", url)
    assert r.exit_code == 2 and "is not run" in " ".join(r.output.split()), r.output
