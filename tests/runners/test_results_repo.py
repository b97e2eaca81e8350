"""A public leaderboard end to end (runners/results_repo.py, bench/signing.py, leaderboard/site.py),
on a local git repository: a contributor trains with kept checkpoints, exports and signs; the
results repository's maintainer adds the bundle from a pull request's files with its deciding
window re-run bit for bit, commits, and publishes a static site whose numbers are `bench report
--json`'s (read back in Chromium). Forged submissions are refused and leave the repository as
it was: edited after signing, signed by a key the keyring does not hold or under another's name,
unsigned, submitted twice, changing a run's identity, and — re-signed by a trusted key — edited
inside the deciding window, which the re-run catches naming the step and the metric."""

import json
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from bench.cli import app

pytestmark = pytest.mark.integration

RUN = ["run", "--algo", "grpo", "--dtype", "fp32", "--max-steps", "8", "--eval-every", "2", "--checkpoint-every", "4",
       "--keep-checkpoints", "2", "--prompts-per-step", "2", "--samples-per-prompt", "2", "--threads", "1", "--json"]


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@example.org", *args], cwd=cwd,
                   check=True, capture_output=True)


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """A contributor's store with one run (8 steps, evaluations every 2, checkpoints kept), its key,
    a signed bundle carrying the deciding window's checkpoint; a results repository (git) whose
    keyring holds the contributor's public key."""
    tmp = tmp_path_factory.mktemp("results")
    url = f"sqlite:///{tmp / 'contributor.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCH_HOME", str(tmp / "home"))
        assert _cli("build", "--limit", "12", "--k", "2", "--engine", "torch", "--dtype", "fp32", "--band", "0", "1",
                    "--db", url, "--json").exit_code == 0
        r = _cli(*RUN, "--db", url)
        assert r.exit_code == 0, r.output
        run_id = json.loads(r.stdout)["id"]
    keys = tmp / "keys"
    assert _cli("results", "keygen", "alice", "--out", keys).exit_code == 0
    assert _cli("results", "keygen", "mallory", "--out", keys).exit_code == 0
    bundle = tmp / "alice.tar.gz"
    r = _cli("runs", "export", run_id, "--out", bundle, "--window-checkpoints", "--sign", keys / "alice.key",
             "--db", url)
    assert r.exit_code == 0 and "signed by alice" in r.stdout, r.output
    repo = tmp / "results"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    assert _cli("results", "init", repo).exit_code == 0
    shutil.copy(keys / "alice.pub", repo / "keys" / "alice.pub")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "an empty results repository, alice's key")
    return {"tmp": tmp, "url": url, "run": run_id, "keys": keys, "bundle": bundle, "repo": repo}


def _state(repo):
    return (repo / "index.json").read_text(), sorted(p.name for p in (repo / "bundles").iterdir())


def test_the_submission_flow_end_to_end(flow, tmp_path):
    repo, run = flow["repo"], flow["run"]
    # the pull request: the bundle lands in a clone's incoming/ on a branch, as a contributor would push it
    pr = tmp_path / "pr"
    _git(tmp_path, "clone", "-q", str(repo), str(pr))
    (pr / "incoming").mkdir()
    shutil.copy(flow["bundle"], pr / "incoming" / "alice.tar.gz")
    _git(pr, "checkout", "-q", "-b", "submit")
    _git(pr, "add", "-A")
    _git(pr, "commit", "-q", "-m", "alice: one grpo fp32 run")
    # the results repository's check (its CI): add every incoming bundle with its deciding window re-run
    _git(repo, "fetch", "-q", str(pr), "submit:submit")
    _git(repo, "checkout", "-q", "submit")
    r = _cli("results", "add", repo / "incoming" / "alice.tar.gz", "--repo", repo, "--verify", "window", "--json")
    assert r.exit_code == 0, r.output
    entry = json.loads(r.stdout)
    assert entry["signer"] == "alice" and entry["runs"] == [run]
    (v,) = entry["verifications"]
    assert (v["window_start"], v["steps"], v["verdict"]) == (2, 8, "bit-identical")   # budget window: evals 4, 6, 8
    (repo / "incoming" / "alice.tar.gz").unlink()
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "add alice's bundle, deciding window re-run")
    # what the repository now says, and publishes
    store = repo / ".store.db"
    report = json.loads(_cli("report", "--runs", "--json", "--db", f"sqlite:///{store}").stdout)
    (row,) = report["runs"]
    assert row["verification"] == "deciding window re-run (steps 3–8 of 8)" and row["verified"] is True
    site = tmp_path / "site"
    r = _cli("publish", "--results", repo, "--out", site)
    assert r.exit_code == 0, r.output
    data = json.loads((site / "data.json").read_text())
    assert data["signers"] == {run: "alice"} and data["runs"][0]["verification"] == row["verification"]
    assert (site / "runs" / f"{run}.html").is_file() and (site / "runs" / f"{run}.png").stat().st_size > 10_000
    git_status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert ".store.db" not in git_status                       # the store is rebuilt, not committed


def _forged(flow, tmp_path, edit=None, key="alice", name=None):
    """The contributor's bundle with `edit` applied to its run document, resealed, then signed with
    `key` under `name` (None: left as resealed, its old signature now over other bytes)."""
    from test_verify import _members, _write_resealed

    tmp_path.mkdir(parents=True, exist_ok=True)
    members = _members(flow["bundle"])
    doc = f"runs/{flow['run']}.json"
    obj = json.loads(members[doc])
    if edit:
        edit(obj)
    members[doc] = json.dumps(obj).encode()
    sig = members.pop("signature.json")
    path = _write_resealed(tmp_path / "forged.tar.gz", members)
    if name is None:
        import tarfile
        import io

        with tarfile.open(path) as tar:
            kept = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        kept["signature.json"] = sig
        with tarfile.open(path, "w:gz") as tar:
            for n, data in kept.items():
                info = tarfile.TarInfo(n)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    else:
        from bench.signing import sign

        sign(path, flow["keys"] / f"{key}.key", name)
    return path


def _bump_eval(step):
    def edit(o):
        (e,) = [e for e in o["evals"] if e["step"] == step and e["benchmark"] == "split"]
        e["score"] = round(e["score"] + (0.05 if e["score"] < 0.9 else -0.05), 6)
        o["peak_accuracy"] = max(x["score"] for x in o["evals"] if x["benchmark"] == "split")
        o["final_accuracy"] = [x["score"] for x in o["evals"] if x["benchmark"] == "split"][-1]
    return edit


def test_forged_submissions_are_refused_and_change_nothing(flow, tmp_path):
    repo = tmp_path / "repo"
    assert _cli("results", "init", repo).exit_code == 0
    shutil.copy(flow["keys"] / "alice.pub", repo / "keys" / "alice.pub")
    before = _state(repo)
    unsigned = tmp_path / "unsigned.tar.gz"
    assert _cli("runs", "export", flow["run"], "--out", unsigned, "--db", flow["url"]).exit_code == 0
    cases = [
        (_forged(flow, tmp_path / "a", _bump_eval(6)), "does not hold over its bundle.json (edited after signing)"),
        (_forged(flow, tmp_path / "b", key="mallory", name="mallory"), "signed by 'mallory', whom the keyring"),
        (_forged(flow, tmp_path / "c", key="mallory", name="alice"), "with another key than the keyring's alice.pub"),
        (unsigned, "is unsigned and this repository's keyring holds keys"),
    ]
    for path, needle in cases:
        r = _cli("results", "add", path, "--repo", repo)
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), (path, r.output)
        assert _state(repo) == before
    # re-signed by a trusted key after editing the step-6 evaluation: the signature holds, the re-run does not
    edited = _forged(flow, tmp_path / "d", _bump_eval(6), key="alice", name="alice")
    r = _cli("results", "add", edited, "--repo", repo, "--verify", "window")
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "differs at step 6 (eval split" in text and "not added" in text, r.output
    assert _state(repo) == before
    # the untouched bundle goes in once; a second time, or a copy changing the run's seed, does not
    assert _cli("results", "add", flow["bundle"], "--repo", repo).exit_code == 0
    after = _state(repo)
    r = _cli("results", "add", flow["bundle"], "--repo", repo)
    assert r.exit_code == 2 and "in the repository already" in r.output
    reseeded = _forged(flow, tmp_path / "e", lambda o: o.update(seed=o["seed"] + 1), key="alice", name="alice")
    r = _cli("results", "add", reseeded, "--repo", repo)
    assert r.exit_code == 2 and "changes its identity" in " ".join(r.output.split()), r.output
    # the same run re-signed: by alice it adds nothing; by another trusted signer it would take her credit
    shutil.copy(flow["keys"] / "mallory.pub", repo / "keys" / "mallory.pub")
    for key, needle in (("alice", "adds nothing"), ("mallory", "came from alice")):
        again = _forged(flow, tmp_path / f"f-{key}", key=key, name=key)
        r = _cli("results", "add", again, "--repo", repo)
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), (key, r.output)
    (repo / "keys" / "mallory.pub").unlink()
    assert _state(repo) == after
    # an index edited by hand to name another signer: the store is not rebuilt on its word
    index = json.loads((repo / "index.json").read_text())
    index["bundles"][0]["signer"] = "mallory"
    (repo / "index.json").write_text(json.dumps(index))
    r = _cli("publish", "--results", repo, "--out", tmp_path / "site")
    assert r.exit_code == 2 and "the keyring does not confirm it" in " ".join(r.output.split()), r.output


@pytest.mark.browser
def test_the_static_site_shows_the_reports_numbers_in_chromium(flow, tmp_path):
    """Every number of the ranking, as Chromium reads the page, is `bench report --json`'s."""
    from screenshot import chromium

    repo = tmp_path / "repo"
    assert _cli("results", "init", repo).exit_code == 0
    shutil.copy(flow["keys"] / "alice.pub", repo / "keys" / "alice.pub")
    assert _cli("results", "add", flow["bundle"], "--repo", repo).exit_code == 0
    site = tmp_path / "site"
    assert _cli("publish", "--results", repo, "--out", site).exit_code == 0
    cells = json.loads(_cli("report", "--json", "--db", f"sqlite:///{repo / '.store.db'}").stdout)["cells"]
    driver = chromium(1400, 900)
    try:
        driver.get((site / "index.html").as_uri())
        rows = driver.find_elements("css selector", "#ranking tr[data-cell]")
        assert len(rows) == len(cells) == 1
        for row, cell in zip(rows, cells):
            got = {td.get_attribute("data-field"): (td.get_attribute("data-value"), td.text)
                   for td in row.find_elements("css selector", "td[data-field]")}
            assert got["sanity"][0] == cell["sanity"] and got["passes"][1] == cell["passes"]
            assert float(got["pass_lower"][0]) == cell["pass_lower"]
            assert got["pass_lower"][1] == f"≥ {cell['pass_lower']:.2f}"
            assert float(got["peak_mean"][0]) == cell["peak_mean"]
            assert got["peak_mean"][1].startswith(f"{cell['peak_mean']:.3f}")
            assert got["verification"][1] == cell["verification"] and got["signers"][1] == "alice"
            assert got["model"] == (cell["model"], cell["model"])                 # the model of every row
        assert "Reference — the paper's published results (never ranked)" in driver.find_element("tag name",
                                                                                              "body").text
    finally:
        driver.quit()


class _Evil:
    """A pickle that runs a command when loaded: what a checkpoint from a stranger could hold."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_would_run_code_is_refused_unrun(flow, tmp_path):
    """A bundle whose carried checkpoint is a pickle that runs a command, re-signed by a trusted key:
    --verify window loads it weights-only, refuses it (exit 2) and the command never runs."""
    import io
    import tarfile

    import torch

    from bench.signing import sign
    from test_verify import _members, _write_resealed

    marker = tmp_path / "pwned"
    members = _members(flow["bundle"])
    (name,) = [n for n in members if n.startswith("checkpoints/")]
    buf = io.BytesIO()
    torch.save({"step": 2, "model": _Evil(marker)}, buf)
    members[name] = buf.getvalue()
    members.pop("signature.json")
    path = _write_resealed(tmp_path / "evil.tar.gz", members)
    sign(path, flow["keys"] / "alice.key", "alice")
    repo = tmp_path / "repo"
    assert _cli("results", "init", repo).exit_code == 0
    shutil.copy(flow["keys"] / "alice.pub", repo / "keys" / "alice.pub")
    r = _cli("results", "add", path, "--repo", repo, "--verify", "window")
    assert r.exit_code == 2 and "is not a checkpoint bench loads" in " ".join(r.output.split()), r.output
    assert not marker.exists()
    with tarfile.open(path) as tar:
        assert name in tar.getnames()


def test_a_keyring_in_uppercase_hex_and_a_malformed_signature(flow, tmp_path):
    import io
    import tarfile

    from bench.signing import SigningError, check, keyring

    ring = tmp_path / "keys"
    ring.mkdir()
    (ring / "alice.pub").write_text((flow["keys"] / "alice.pub").read_text().upper())
    assert check(flow["bundle"], keyring(ring)) == "alice"
    with tarfile.open(flow["bundle"]) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    doc = json.loads(members["signature.json"])
    doc["signer"] = ["alice"]
    members["signature.json"] = json.dumps(doc).encode()
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        for n, data in members.items():
            info = tarfile.TarInfo(n)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(SigningError, match="cannot be read"):
        check(bad, keyring(ring))
