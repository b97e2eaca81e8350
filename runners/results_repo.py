"""A results repository: a folder — a git repository, or a dataset repository on a hub — of run
bundles with an index, that anyone can submit to and anyone can check (docs/results-repository.md).

    DIR/index.json           {"format": "bench-results", "version": 1, "bundles": [entry, …]}
    DIR/bundles/SHA12.tar.gz the bundles as submitted (bench runs export [--sign KEY])
    DIR/keys/NAME.pub        the keyring: whose signatures count (bench/signing.py)
    DIR/.store.db            a store built from the bundles, rebuilt whenever index.json changes
                             (.gitignore'd: the bundles and the index are the record)

entry: {"file", "sha256", "runs", "signer" (null: unsigned), "added_at", "verify" (the level
asked), "verifications": [the stored columns of each re-run: run, window_start, steps, verdict,
compared, differences, first_difference, device, device_name, cpu_16bit, tolerance, bench_commit,
created_at]}.

`add` validates a bundle as import does (identity changes refused against the runs already in the
repository), checks its signature against the keyring (once the keyring holds a key, an unsigned
or unknown signer's bundle is refused), re-runs what `verify` asks — `claimed` nothing, `first`
each run's first steps, `window` each run's deciding window (from the checkpoint the bundle
carries, `bench runs export --window-checkpoints`, where it starts after step 0), `full` every
step — and refuses the bundle when a re-run differs. All of it happens on a scratch copy of the
repository's store: a refused bundle leaves the repository as it was.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import select

from bench import signing, verdicts
from bench.bundle import BundleError, bundle_checkpoints, import_bundle, read_bundle
from bench.errors import BenchError
from bench.model_sources import file_sha256
from bench.store import Run, RunVerification, open_store, session

FORMAT, VERSION = "bench-results", 1
INDEX, STORE, MARK = "index.json", ".store.db", ".store.index-sha256"
LEVELS = ("claimed", "first", "window", "full")


class RepoError(BenchError, ValueError):
    """A results repository or a submission that cannot be used; the message says why."""


def init(root: Path) -> Path:
    """An empty results repository at `root` (index, bundles/, keys/, .gitignore)."""
    root = Path(root)
    if (root / INDEX).exists():
        raise RepoError(f"{root} is a results repository already")
    (root / "bundles").mkdir(parents=True, exist_ok=True)
    (root / "keys").mkdir(exist_ok=True)
    (root / ".gitignore").write_text(f"{STORE}\n{STORE}-*\n{MARK}\n*.tmp\n")
    _write_index(root, {"format": FORMAT, "version": VERSION, "bundles": []})
    return root


_ENTRY_FILE = re.compile(r"bundles/[0-9a-f]{12}\.tar\.gz")


def read_index(root: Path) -> dict:
    """The repository's index, every entry's fields checked (a bundle's file is one of bundles/)."""
    p = Path(root) / INDEX
    if not p.is_file():
        raise RepoError(f"{root} is not a results repository (no {INDEX}): `bench results init {root}` makes one")
    try:
        index = json.loads(p.read_text())
    except ValueError as e:
        raise RepoError(f"{p}: not JSON ({e})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") != VERSION \
            or not isinstance(index.get("bundles"), list):
        raise RepoError(f"{p}: not a {FORMAT} index of version {VERSION}")
    for i, e in enumerate(index["bundles"]):
        ok = (isinstance(e, dict) and isinstance(e.get("file"), str) and _ENTRY_FILE.fullmatch(e["file"])
              and isinstance(e.get("sha256"), str) and e["file"][8:20] == e["sha256"][:12]
              and isinstance(e.get("runs"), list) and all(isinstance(r, str) for r in e["runs"])
              and (e.get("signer") is None or isinstance(e.get("signer"), str))
              and isinstance(e.get("verifications", []), list))
        if not ok:
            raise RepoError(f"{p}: bundle entry {i} is malformed (file bundles/SHA12.tar.gz, its sha256, runs, signer)")
    return index


def _write_index(root: Path, index: dict) -> None:
    tmp = Path(root) / f".{INDEX}.tmp"
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(Path(root) / INDEX)


def store_url(root: Path) -> str:
    """The repository's store, rebuilt from its bundles when index.json changed since it was built."""
    root = Path(root)
    index = read_index(root)
    mark = file_sha256(root / INDEX)
    db, marker = root / STORE, root / MARK
    if not (db.is_file() and marker.is_file() and marker.read_text().strip() == mark):
        tmp = root / f"{STORE}-building"
        tmp.unlink(missing_ok=True)
        _build(root, index, f"sqlite:///{tmp}")
        tmp.replace(db)
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        marker.write_text(mark + "\n")
    return f"sqlite:///{db}"


def _build(root: Path, index: dict, url: str) -> None:
    """A store holding every bundle of the index and the verifications recorded with them; each
    bundle's file and signature are checked again (an index is only a claim: a signer it names
    must still hold under the keyring)."""
    ring = signing.keyring(root / "keys")
    store = open_store(url)
    for entry in index["bundles"]:
        path = root / entry["file"]
        if not path.is_file() or file_sha256(path) != entry["sha256"]:
            raise RepoError(f"{entry['file']} is missing or is not the bundle the index recorded (sha256)")
        if signing.check(path, ring) != entry.get("signer"):
            raise RepoError(f"{entry['file']}: the index says it is signed by {entry.get('signer')!r}, the keyring "
                            "does not confirm it")
        import_bundle(store, path)
        _record_verifications(store, entry.get("verifications") or [])
    store.dispose()


def _record_verifications(store, rows: list[dict]) -> None:
    with session(store) as s:
        for v in rows:
            s.add(RunVerification(run_id=v["run"], **{k: v[k] for k in VERIFICATION_FIELDS if k in v},
                                  created_at=datetime.fromisoformat(v["created_at"])))


VERIFICATION_FIELDS = ("window_start", "steps", "verdict", "compared", "differences", "first_difference", "device",
                       "device_name", "cpu_16bit", "tolerance", "bench_commit", "digests")


def _copy_store(src: Path, dst: Path) -> None:
    """A consistent copy of a SQLite store (its WAL included: SQLite's online backup)."""
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    a.close()
    b.close()


def signers(index: dict) -> dict[str, str | None]:
    """Each run's signer: the one of the first bundle that carried it (a later copy that
    continues the run must come from the same signer: `add`)."""
    out: dict[str, str | None] = {}
    for e in index["bundles"]:
        for r in e["runs"]:
            out.setdefault(r, e.get("signer"))
    return out


def add(root: Path, bundle: Path, verify: str = "claimed", device: str | None = None, progress=None) -> dict:
    """Validate, check and (per `verify`) re-run the bundle, then add it to the repository;
    returns its index entry. RepoError / BundleError / SigningError / VerifyError: nothing changed.
    The bundle is copied first and only the copy is read; the new store is the scratch store the
    checks ran on, swapped in before the index (the commit point) is written."""
    root = Path(root)
    if verify not in LEVELS:
        raise RepoError(f"--verify {verify!r}: choose one of {', '.join(LEVELS)}")
    index = read_index(root)
    url = store_url(root)
    with tempfile.TemporaryDirectory(prefix="bench-results-") as tmp:
        copy = Path(tmp) / "bundle.tar.gz"
        try:
            shutil.copyfile(bundle, copy)
        except OSError as e:
            raise RepoError(f"cannot read {bundle}: {e.strerror or e}") from None
        manifest, _, _ = read_bundle(copy)
        sha = file_sha256(copy)
        if any(e["sha256"] == sha for e in index["bundles"]):
            raise RepoError(f"{bundle} is in the repository already")
        ring = signing.keyring(root / "keys")
        signer = signing.check(copy, ring)
        if signer is None and ring:
            raise RepoError(f"{bundle} is unsigned and this repository's keyring holds keys ({', '.join(ring)}): "
                            "sign it (`bench runs export … --sign KEY`)")
        first = signers(index)
        for rid in manifest["runs"]:
            if rid in first and first[rid] != signer:
                raise RepoError(f"run {rid} came from {first[rid] or 'an unsigned bundle'}; a bundle signed by "
                                f"{signer or 'nobody'} cannot continue or re-submit it")
        scratch = Path(tmp) / "store.db"
        _copy_store(Path(url[len("sqlite:///"):]), scratch)
        store = open_store(f"sqlite:///{scratch}")
        try:
            summary = import_bundle(store, copy)
        except BundleError as e:
            raise RepoError(f"{bundle} cannot join this repository: {e}") from None
        if not (summary["runs_added"] or summary["runs_updated"]):
            raise RepoError(f"{bundle} adds nothing: its runs are in the repository already, no further along")
        rows = _verify(store, list(manifest["runs"]), verify, copy, Path(tmp), device, progress)
        store.dispose()
        entry = {"file": f"bundles/{sha[:12]}.tar.gz", "sha256": sha, "runs": list(manifest["runs"]),
                 "signer": signer, "added_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "verify": verify, "verifications": rows}
        staged = root / f"{entry['file']}.tmp"
        shutil.copyfile(copy, staged)
        if file_sha256(staged) != sha:
            staged.unlink()
            raise RepoError(f"{staged}: the copy into the repository does not match (sha256); nothing added")
        staged.replace(root / entry["file"])
        index["bundles"].append(entry)
        (root / MARK).unlink(missing_ok=True)           # the store is rebuilt if what follows is cut short
        new_store = root / f"{STORE}-new"
        new_store.unlink(missing_ok=True)
        _copy_store(scratch, new_store)                 # the scratch may be on another file system
        new_store.replace(root / STORE)
        for suffix in ("-wal", "-shm"):
            Path(f"{root / STORE}{suffix}").unlink(missing_ok=True)
        _write_index(root, index)
    (root / MARK).write_text(file_sha256(root / INDEX) + "\n")
    return entry


def _verify(store, run_ids: list[str], level: str, bundle: Path, tmp: Path, device, progress) -> list[dict]:
    """Re-run what `level` asks of each run (module doc); the verifications' rows. A re-run that
    differs refuses the bundle."""
    from .verify import VerifyError, plan_verification, run_verification

    if level == "claimed":
        return []
    carried = bundle_checkpoints(bundle, tmp) if level == "window" else {}
    with session(store) as s:
        evidence = verdicts.from_store(s, run_ids)
        steps = {r.id: r.step for r in s.scalars(select(Run).where(Run.id.in_(run_ids)))}
    out = []
    for rid in run_ids:
        window = verdicts.deciding_window(evidence[rid]) or (0, steps[rid])
        if level == "first":
            start, end = 0, max(1, min(3, steps[rid]))
        elif level == "full":
            start, end = 0, steps[rid]
        else:
            start, end = window
            end = max(end, 1)
        checkpoint = None
        if start:
            if rid not in carried or carried[rid][0] != start:
                raise RepoError(f"run {rid}: --verify window re-runs steps {start + 1}–{end} from its checkpoint at "
                                f"step {start}, which the bundle does not carry: export it with --window-checkpoints "
                                "from a run that kept it (--keep-checkpoints), or ask for --verify full")
            checkpoint = carried[rid][1]
        try:
            plan = plan_verification(store, rid, end, device, start, checkpoint)
        except VerifyError as e:
            raise RepoError(f"run {rid} cannot be re-run here: {e}") from None
        result = run_verification(store, plan, progress)
        if result["verdict"] == "differs":
            d = result["first_difference"]
            raise RepoError(f"run {rid}: the re-run of steps {start + 1}–{end} differs at step {d['step']} "
                            f"({d['metric']}: stored {d['stored']!r}, re-run {d['replayed']!r}): not added")
        with session(store) as s:
            v = s.get(RunVerification, result["verification"])
            out.append({"run": rid, **{k: getattr(v, k) for k in VERIFICATION_FIELDS},
                        "created_at": v.created_at.isoformat()})
    return out
