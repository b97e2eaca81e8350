"""Portable results: runs exported as one self-contained .tar.gz and imported into any store.

A bundle holds `bundle.json` (format, schema version, the runs and builds it carries and the
sha256 of every other member), one `builds/<id>.json` per build (its row, model, manifest,
split hash and kept problems with their golds, base accuracy and n) and one `runs/<id>.json`
per run (its row with config, calibration, provenance and seed, every step and evaluation, and
its state digests with their chain, bench/statedigest.py; a bundle from before them has none).

Import validates everything before it writes: a member missing, extra or altered (its sha256),
JSON that does not parse or does not have the expected fields, another schema version, a path
that would land outside the extraction folder, a link, a run whose build is not in the bundle,
a kept split whose recomputed hash differs from the one recorded, state digests whose chain does
not link. Then one transaction: a build
already in the store with the same id and another split hash refuses the whole bundle; so does
a run already in the store whose identity the bundle would change (algorithm, rollout and train
format, trainer, engine, seed, staleness, config, model, build, created_at), whatever its step,
and a further-along copy that is not a continuation of the stored run: every stored step, bit
for bit (the metrics that time the machine aside, bench/machine_metrics.py: a resume re-runs the
steps after its checkpoint), every evaluation, the calibration and the provenance (a resume may
append to its `resumes`) must be in it unchanged. Runs already present and no further along are
left alone, so importing twice changes nothing. Every refusal is one BundleError and leaves the
store unchanged. Only the store is used (no stage): `bench runs export` / `bench runs import`
call this.

The sha256 sums sit in the same unsigned bundle.json as the members they cover: they detect a
corrupted bundle, not an edited one (whoever edits a member can recompute its sum). A run's
status, peak accuracy and steps to target are not taken as they are: the run's own stop rules
are replayed over its evaluations (bench/verdicts.py), and a status they do not support is
refused, naming the rule and the readings. The numbers themselves are what the bundle says;
`bench runs verify` re-runs steps from the build, config and seed and compares every stored
number, which is the answer to tampering with them.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
import tempfile
from datetime import datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from bench.errors import BenchError
from bench.machine_metrics import deterministic
from bench.model_sources import file_sha256
from bench.problem_ids import split_hash
from bench import verdicts
from bench.statuses import CONVERGED, FAILED, MISCALIBRATED, RUNNING
from bench.signing import SIGNATURE
from bench.statedigest import SCHEMES, check_chain, kept_checkpoint
from bench.store import Build, BuildProblem, Eval, Model, Run, RunDigest, RunStep, get_or_create_model, session

FORMAT = "bench-run-bundle"
SCHEMA_VERSION = 1
MANIFEST = "bundle.json"
_MEMBER = re.compile(r"(builds|runs)/([A-Za-z0-9][A-Za-z0-9._-]{0,39})\.json")
_CHECKPOINT = re.compile(r"checkpoints/([A-Za-z0-9][A-Za-z0-9._-]{0,39})/step-(\d{6})\.pt")
_ENDED_ORDER = {RUNNING: 0, FAILED: 1}       # a finished status is further along than these


class BundleError(BenchError, ValueError):
    """A bundle that cannot be written or must not be imported; the message says why."""


# ------------------------------------------------------------------ export

def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


# the columns a bundle carries as they are (the id, model, times and problems are written apart)
BUILD_COLUMNS = ("source", "engine", "dtype", "k", "lo", "hi", "seed", "shard", "settings_hash", "status", "out_dir",
                 "n_problems", "n_kept", "manifest")
RUN_COLUMNS = ("algo", "rollout_dtype", "train_dtype", "trainer", "engine", "seed", "config", "status", "stop_reason",
               "step", "peak_accuracy", "final_accuracy", "steps_to_target", "wall_to_target", "kl_warning_step",
               "wall_s", "checkpoint_dir", "calibration", "provenance")


def _build_record(s, b: Build) -> dict:
    m = s.get(Model, b.model_id)
    kept = s.scalars(select(BuildProblem).where(BuildProblem.build_id == b.id, BuildProblem.kept.is_(True))
                     .order_by(BuildProblem.position)).all()
    shash = b.split_hash or split_hash((p.problem_id, p.answer) for p in kept)
    return {"id": b.id, "model": {"name": m.name, "path": m.path, "weights_hash": m.weights_hash},
            **{c: getattr(b, c) for c in BUILD_COLUMNS}, "split_hash": shash, "created_at": _iso(b.created_at),
            "finished_at": _iso(b.finished_at),
            "kept": [{"id": p.problem_id, "position": p.position, "problem": p.problem, "answer": p.answer,
                      "n": p.n_samples, "correct": p.n_correct, "accuracy": p.accuracy} for p in kept]}


def _run_record(s, r: Run, shash: str) -> dict:
    m = s.get(Model, r.model_id)
    steps = s.scalars(select(RunStep).where(RunStep.run_id == r.id).order_by(RunStep.step)).all()
    evals = s.scalars(select(Eval).where(Eval.run_id == r.id).order_by(Eval.step, Eval.benchmark)).all()
    digests = s.scalars(select(RunDigest).where(RunDigest.run_id == r.id).order_by(RunDigest.step)).all()
    return {"id": r.id, "model": {"name": m.name, "path": m.path, "weights_hash": m.weights_hash},
            "build": r.build_id, "split_hash": shash, **{c: getattr(r, c) for c in RUN_COLUMNS},
            "created_at": _iso(r.created_at),
            "updated_at": _iso(r.updated_at),
            "steps": [{"step": x.step, "metrics": x.metrics, "created_at": _iso(x.created_at),
                       **{c: getattr(x, c) for c in RunStep.COLUMNS}} for x in steps],
            "evals": [{"step": e.step, "benchmark": e.benchmark, "n": e.n, "score": e.score} for e in evals],
            "digests": [{"step": d.step, "digest": d.digest, "chain": d.chain, "scheme": d.scheme} for d in digests]}


def _dumps(obj) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True, default=str).encode("utf-8")


def export_runs(engine, run_ids: list[str], out: Path, window_checkpoints: bool = False) -> dict:
    """Write the runs (and their builds) to the bundle `out`; returns its bundle.json.
    `window_checkpoints`: also carry, for each run, the checkpoint it kept at the start A of its
    verdict's deciding window (bench/verdicts.py), so a receiver can re-run that window
    (`bench runs verify --window A:B`); bundle.json's `window_checkpoints` says per run the step
    carried, or null where the window starts at step 0 or no checkpoint was kept there."""
    if not run_ids:
        raise BundleError("name at least one run to export")
    members: dict[str, bytes] = {}
    files: dict[str, Path] = {}                 # members written from the disk (checkpoints)
    carried: dict[str, int | None] = {}
    with session(engine) as s:
        runs = []
        for rid in dict.fromkeys(run_ids):
            r = s.get(Run, rid)
            if r is None:
                raise BundleError(f"no run {rid!r}; `bench runs` lists them")
            runs.append(r)
        hashes = {}
        for bid in dict.fromkeys(r.build_id for r in runs):
            rec = _build_record(s, s.get(Build, bid))
            hashes[bid] = rec["split_hash"]
            members[f"builds/{bid}.json"] = _dumps(rec)
        for r in runs:
            members[f"runs/{r.id}.json"] = _dumps(_run_record(s, r, hashes[r.build_id]))
        if window_checkpoints:
            evidence = verdicts.from_store(s, [r.id for r in runs])
            for r in runs:
                window = verdicts.deciding_window(evidence[r.id])
                path = kept_checkpoint(r.checkpoint_dir, window[0]) if window and window[0] and r.checkpoint_dir \
                    else None
                carried[r.id] = window[0] if path is not None and path.is_file() else None
                if carried[r.id] is not None:
                    files[f"checkpoints/{r.id}/step-{window[0]:06d}.pt"] = path
    manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "created_at": datetime.now().isoformat(),
                "runs": [r.id for r in runs], "builds": list(hashes), "split_hashes": hashes,
                **({"window_checkpoints": carried} if window_checkpoints else {}),
                "members": {**{name: hashlib.sha256(data).hexdigest() for name, data in members.items()},
                            **{name: file_sha256(path) for name, path in files.items()}}}
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            for name, data in [(MANIFEST, _dumps(manifest)), *members.items()]:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
            for name, path in files.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = path.stat().st_size, 0o644, 0
                with open(path, "rb") as f:
                    tar.addfile(info, f)
        tmp.replace(out)
    except OSError as e:
        raise BundleError(f"cannot write {out}: {e.strerror or e}") from None
    return manifest


# ------------------------------------------------------------------ validation

def _need(cond: bool, what: str) -> None:
    if not cond:
        raise BundleError(what)


_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_STR = (str, type(None))
_OPT_INT = (int, type(None))
_OPT_DICT = (dict, type(None))

BUILD_FIELDS = {"id": str, "model": dict, "source": str, "engine": str, "dtype": str, "k": int, "lo": _NUM,
                "hi": _NUM, "seed": int, "shard": _OPT_STR, "settings_hash": str, "status": str,
                "out_dir": _OPT_STR, "n_problems": _OPT_INT, "n_kept": _OPT_INT, "manifest": _OPT_DICT,
                "split_hash": str, "created_at": _OPT_STR, "finished_at": _OPT_STR, "kept": list}
PROBLEM_FIELDS = {"id": str, "position": int, "problem": str, "answer": str, "n": int, "correct": int,
                  "accuracy": _OPT_NUM}
RUN_FIELDS = {"id": str, "model": dict, "build": str, "split_hash": str, "algo": str, "rollout_dtype": str,
              "train_dtype": str, "trainer": str, "engine": str, "seed": _OPT_INT, "config": dict, "status": str,
              "stop_reason": _OPT_STR, "step": int, "peak_accuracy": _OPT_NUM, "final_accuracy": _OPT_NUM,
              "steps_to_target": _OPT_INT, "wall_to_target": _OPT_NUM, "kl_warning_step": _OPT_INT,
              "wall_s": _NUM, "checkpoint_dir": _OPT_STR, "calibration": _OPT_DICT, "provenance": _OPT_DICT,
              "created_at": _OPT_STR, "updated_at": _OPT_STR, "steps": list, "evals": list}
STEP_FIELDS = {"step": int, "metrics": dict, "created_at": _OPT_STR, **{c: _OPT_NUM for c in RunStep.COLUMNS}}
EVAL_FIELDS = {"step": int, "benchmark": str, "n": int, "score": _NUM}
DIGEST_FIELDS = {"step": int, "digest": str, "chain": str}
MODEL_FIELDS = {"name": str, "path": str, "weights_hash": _OPT_STR}


def _check_fields(obj, fields: dict, where: str) -> None:
    _need(isinstance(obj, dict), f"{where} is not a JSON object")
    missing = [k for k in fields if k not in obj]
    _need(not missing, f"{where} lacks {', '.join(missing)}")
    for k, t in fields.items():
        v = obj[k]
        ok = isinstance(v, t) and not (isinstance(v, bool) and t in (int, _NUM, _OPT_NUM, _OPT_INT))
        _need(ok, f"{where}: field {k!r} has the wrong type ({type(v).__name__})")


def _time(v: str | None, where: str) -> datetime | None:
    if v is None:
        return None
    try:
        return datetime.fromisoformat(v)
    except ValueError:
        raise BundleError(f"{where}: {v!r} is not an ISO time") from None


def _load_json(data: bytes, name: str):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleError(f"{name} is not valid JSON ({getattr(e, 'msg', e)})") from None


def _extract(path: Path) -> tuple[dict[str, bytes], dict[str, str]]:
    """The bundle's members: ({name: bytes} of its documents, {name: sha256} of its checkpoints,
    hashed from the disk: a checkpoint may be many GB); BundleError for an unreadable archive or
    a member that is no regular file, lies outside the folder, repeats or is unexpected."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-bundle-"))
    try:
        try:
            with tarfile.open(path, "r:gz") as tar:
                names = []
                for m in tar.getmembers():
                    name = m.name
                    _need(not (name.startswith("/") or name.startswith("\\") or ".." in Path(name).parts
                               or re.match(r"^[A-Za-z]:", name)),
                          f"member {name!r} would land outside the extraction folder")
                    _need(m.isfile(), f"member {name!r} is not a regular file (links and devices are refused)")
                    _need(name in (MANIFEST, SIGNATURE) or _MEMBER.fullmatch(name) is not None
                          or _CHECKPOINT.fullmatch(name) is not None, f"unexpected member {name!r}")
                    _need(name not in names, f"member {name!r} appears twice")
                    names.append(name)
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError) as e:
            raise BundleError(f"not a readable .tar.gz bundle ({e})") from None
        files, sums = {}, {}
        for name in names:
            f = (tmp / name).resolve()
            _need(f.is_relative_to(tmp.resolve()) and f.is_file(), f"member {name!r} escapes the extraction folder")
            if _CHECKPOINT.fullmatch(name):
                sums[name] = file_sha256(f)
            else:
                files[name] = f.read_bytes()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return files, sums


def _check_manifest(files: dict[str, bytes], sums: dict[str, str]) -> dict:
    """bundle.json, checked: its format and schema version, every member listed with its sha256
    and no other, every checkpoint one of a run it holds; its member is popped from `files`."""
    files.pop(SIGNATURE, None)             # outside the manifest: bench/signing.py checks it
    _need(MANIFEST in files, f"missing member {MANIFEST}")
    manifest = _load_json(files.pop(MANIFEST), MANIFEST)
    _need(isinstance(manifest, dict) and manifest.get("format") == FORMAT, f"{MANIFEST}: not a {FORMAT}")
    version = manifest.get("schema_version")
    _need(version == SCHEMA_VERSION, f"schema version {version!r}; this bench reads version {SCHEMA_VERSION}")
    _check_fields(manifest, {"runs": list, "builds": list, "members": dict}, MANIFEST)
    listed = manifest["members"]
    have = set(files) | set(sums)
    missing = sorted(set(listed) - have)
    _need(not missing, f"missing member(s) {', '.join(missing)}")
    extra = sorted(have - set(listed))
    _need(not extra, f"member(s) not listed in {MANIFEST}: {', '.join(extra)}")
    for name, digest in listed.items():
        got = sums[name] if name in sums else hashlib.sha256(files[name]).hexdigest()
        _need(got == digest, f"member {name} was altered (its sha256 differs)")
    checkpoints = set(sums)
    for name in checkpoints:                    # checked by their sums above; bundle_checkpoints writes them out
        _need(_CHECKPOINT.fullmatch(name).group(1) in manifest["runs"], f"{name}: a checkpoint of no run in the bundle")
    want = {f"builds/{b}.json" for b in manifest["builds"]} | {f"runs/{r}.json" for r in manifest["runs"]}
    _need(want == set(listed) - checkpoints, f"{MANIFEST}: its runs and builds do not match its members")
    return manifest


def _check_build(obj: dict, name: str) -> None:
    """A build document: its fields, its model's, its kept problems' (unique ids, hashing to
    its split hash) and its times."""
    _check_fields(obj, BUILD_FIELDS, name)
    _check_fields(obj["model"], MODEL_FIELDS, f"{name}: model")
    for i, p in enumerate(obj["kept"]):
        _check_fields(p, PROBLEM_FIELDS, f"{name}: kept[{i}]")
    _need(len({p["id"] for p in obj["kept"]}) == len(obj["kept"]), f"{name}: a kept problem id repeats")
    _need(split_hash((p["id"], p["answer"]) for p in obj["kept"]) == obj["split_hash"],
          f"{name}: the kept problems do not hash to the recorded split hash")
    _time(obj["created_at"], name), _time(obj["finished_at"], name)


def _check_run(obj: dict, ident: str, name: str) -> None:
    """A run document: its fields, its model's, steps and evaluations (none repeated), its state
    digests (scheme 1 where a bundle from before schemes has none; chained) and its times."""
    _check_fields(obj, RUN_FIELDS, name)
    _check_fields(obj["model"], MODEL_FIELDS, f"{name}: model")
    for i, x in enumerate(obj["steps"]):
        _check_fields(x, STEP_FIELDS, f"{name}: steps[{i}]")
        _time(x["created_at"], name)
    for i, e in enumerate(obj["evals"]):
        _check_fields(e, EVAL_FIELDS, f"{name}: evals[{i}]")
    _need(len({x["step"] for x in obj["steps"]}) == len(obj["steps"]), f"{name}: a step repeats")
    _need(len({(e["step"], e["benchmark"]) for e in obj["evals"]}) == len(obj["evals"]),
          f"{name}: an evaluation repeats")
    digests = obj.setdefault("digests", [])        # bundles from before state digests have none
    _need(isinstance(digests, list), f"{name}: digests is not a list")
    for i, d in enumerate(digests):
        _check_fields(d, DIGEST_FIELDS, f"{name}: digests[{i}]")
        d.setdefault("scheme", 1)                  # bundles from before digest schemes: scheme 1
        _need(type(d["scheme"]) is int and d["scheme"] in SCHEMES,
              f"{name}: digests[{i}]: scheme {d['scheme']!r} is not one of {SCHEMES}")
    broken = check_chain(ident, [(d["step"], d["digest"], d["chain"], d["scheme"]) for d in digests])
    _need(broken is None, f"{name}: its state digests do not chain ({broken})")
    _time(obj["created_at"], name), _time(obj["updated_at"], name)


def read_bundle(path: Path) -> tuple[dict, dict[str, dict], dict[str, dict]]:
    """(bundle.json, builds by id, runs by id) from the bundle at `path`, every check done
    (see the module docstring); BundleError on the first fault."""
    path = Path(path)
    _need(path.is_file(), f"{path}: no such file")
    files, sums = _extract(path)
    manifest = _check_manifest(files, sums)
    builds, runs = {}, {}
    for name, data in files.items():
        obj = _load_json(data, name)
        kind, ident = _MEMBER.fullmatch(name).groups()
        if kind == "builds":
            _check_build(obj, name)
            builds[ident] = obj
        else:
            _check_run(obj, ident, name)
            runs[ident] = obj
        _need(obj["id"] == ident, f"{name} holds id {obj['id']!r}")
    for rid, r in runs.items():
        b = builds.get(r["build"])
        _need(b is not None, f"run {rid}: its build {r['build']} is not in the bundle")
        _need(r["split_hash"] == b["split_hash"], f"run {rid}: its split hash differs from its build's")
    return manifest, builds, runs


def bundle_checkpoints(path: Path, out_dir: Path) -> dict[str, tuple[int, Path]]:
    """The window checkpoints a bundle carries, written to `out_dir`: {run id: (step, file)}.
    Call after `read_bundle`, which checked their sums."""
    out = {}
    with tarfile.open(path, "r:gz") as tar:
        for m in tar.getmembers():
            hit = _CHECKPOINT.fullmatch(m.name)
            if hit and m.isfile():
                rid, step = hit.group(1), int(hit.group(2))
                f = Path(out_dir) / f"{rid}-step-{step:06d}.pt"
                with tar.extractfile(m) as src, open(f, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                out[rid] = (step, f)
    return out


def _check_evidence(rid: str, r: dict, b: dict) -> None:
    """The run's status, peak and steps to target are what its own evaluations say
    (bench/verdicts.py), or BundleError naming the rule and the readings. A run the calibration
    gate stopped, stored `failed` by a bench from before `miscalibrated` existed, reads as
    `miscalibrated` (as the store's migration 0009 reads it)."""
    if r["status"] == FAILED and isinstance(r["calibration"], dict) and r["calibration"].get("ok") is False:
        r["status"] = MISCALIBRATED
    ev = verdicts.from_bundle(r, b)
    problem = verdicts.check(ev)
    _need(problem is None, f"run {rid}: {problem}; nothing imported")
    peak = verdicts.peak(ev)
    _need(r["peak_accuracy"] == peak, f"run {rid}: peak_accuracy {r['peak_accuracy']!r} is not the highest split "
          f"evaluation ({peak!r}); nothing imported")
    if r["status"] == CONVERGED:
        _need(r["steps_to_target"] == r["step"], f"run {rid}: converged at step {r['step']} but steps_to_target "
              f"says {r['steps_to_target']!r}; nothing imported")


# ------------------------------------------------------------------ import

def _further(bundle_run: dict, local: Run) -> bool:
    """Whether the bundle's copy of a run is further along than the store's."""
    return ((bundle_run["step"], _ENDED_ORDER.get(bundle_run["status"], 2))
            > (local.step, _ENDED_ORDER.get(local.status, 2)))


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _identity_changes(s, bundle_run: dict, local: Run) -> list[str]:
    """What the bundle's copy of a stored run changes of the run's identity, as "field: stored →
    bundle" (empty: the same run). The identity is what the run is, not how far it got."""
    r = bundle_run
    model = s.get(Model, local.model_id)
    seed, k = r["config"].get("seed"), r["config"].get("staleness")       # as an insert fills the columns
    theirs = {"algo": r["algo"], "rollout_dtype": r["rollout_dtype"], "train_dtype": r["train_dtype"],
              "trainer": r["trainer"], "engine": r["engine"],
              "seed": r["seed"] if r["seed"] is not None or not isinstance(seed, int) else seed,
              "staleness": k if isinstance(k, int) and not isinstance(k, bool) else 0, "config": r["config"],
              "model": (r["model"]["name"], r["model"]["weights_hash"]), "build": r["build"],
              "created_at": _time(r["created_at"], r["id"])}
    ours = {"algo": local.algo, "rollout_dtype": local.rollout_dtype, "train_dtype": local.train_dtype,
            "trainer": local.trainer, "engine": local.engine, "seed": local.seed, "staleness": local.staleness,
            "config": local.config, "model": (model.name, model.weights_hash), "build": local.build_id,
            "created_at": local.created_at}
    return [f"{f}: {_show(ours[f])} → {_show(theirs[f])}" if f != "config" else _config_change(ours[f], theirs[f])
            for f in ours if ours[f] != theirs[f]]


def _config_change(ours, theirs) -> str:
    """"config (lr: 0.0005 → 0.5, …)": the top-level settings that differ."""
    if not (isinstance(ours, dict) and isinstance(theirs, dict)):
        return "config"
    keys = sorted(k for k in set(ours) | set(theirs) if ours.get(k, "(none)") != theirs.get(k, "(none)"))
    shown = [f"{k}: {_show(ours.get(k))} → {_show(theirs.get(k))}" for k in keys[:3]]
    return "config (" + ", ".join(shown) + (", …" if len(keys) > 3 else "") + ")"


def _step_values(columns: dict, metrics: dict) -> dict:
    """A step's leaderboard columns and metrics, those that time the machine left out."""
    return {**{f"{c} (column)": columns[c] for c in RunStep.COLUMNS}, **deterministic(metrics or {})}


def _not_a_continuation(s, bundle_run: dict, local: Run) -> str | None:
    """Why the bundle's further-along copy does not continue the stored run (None: it does).
    Every stored step, evaluation and state digest must be in it with the same values, bit for
    bit; the calibration and provenance too (a resume may only append to the provenance's
    `resumes`)."""
    r = bundle_run
    theirs = {x["step"]: x for x in r["steps"]}
    for st in s.scalars(select(RunStep).where(RunStep.run_id == local.id).order_by(RunStep.step)):
        x = theirs.get(st.step)
        if x is None:
            return f"it lacks stored step {st.step}"
        a = _step_values({c: getattr(st, c) for c in RunStep.COLUMNS}, st.metrics)
        b = _step_values(x, x["metrics"])
        for name in sorted(set(a) | set(b)):
            if a.get(name, "(none)") != b.get(name, "(none)"):
                return f"step {st.step} {name}: stored {_show(a.get(name))}, bundle {_show(b.get(name))}"
    evals = {(e["step"], e["benchmark"]): e for e in r["evals"]}
    for e in s.scalars(select(Eval).where(Eval.run_id == local.id).order_by(Eval.step, Eval.benchmark)):
        x = evals.get((e.step, e.benchmark))
        if x is None or (x["n"], x["score"]) != (e.n, e.score):
            got = "none" if x is None else f"avg@{x['n']} {x['score']!r}"
            return f"evaluation {e.benchmark} at step {e.step}: stored avg@{e.n} {e.score!r}, bundle {got}"
    digests = {d["step"]: (d["digest"], d["scheme"]) for d in r["digests"]}
    for d in s.scalars(select(RunDigest).where(RunDigest.run_id == local.id).order_by(RunDigest.step)):
        theirs = digests.get(d.step)
        if theirs is not None and theirs[1] > d.scheme:
            continue     # a resume re-recorded the step under a newer scheme (bench/statedigest.py): not comparable
        if theirs != (d.digest, d.scheme):
            return f"its state digest at step {d.step} differs"
    if local.calibration is not None and r["calibration"] != local.calibration:
        return "its step-0 calibration differs"
    ours, theirs_p = dict(local.provenance or {}), dict(r["provenance"] or {})
    res_a, res_b = ours.pop("resumes", []), theirs_p.pop("resumes", [])
    if local.provenance is not None and (ours != theirs_p or res_b[:len(res_a)] != res_a):
        return "its provenance differs"
    return None


def import_bundle(engine, path: Path) -> dict:
    """Load the bundle at `path` into the store in one transaction; returns what was added,
    updated and already present. BundleError (store unchanged) on any fault or conflict."""
    _, builds, runs = read_bundle(path)
    try:
        return _write(engine, builds, runs)
    except SQLAlchemyError as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BundleError(f"the store refused the bundle ({msg}); nothing imported") from None


def _write(engine, builds: dict, runs: dict) -> dict:
    summary = {"builds_added": [], "builds_present": [], "runs_added": [], "runs_updated": [], "runs_present": []}
    with session(engine) as s:
        existing = {}
        for bid, b in builds.items():
            local = s.get(Build, bid)
            if local is not None:
                local_hash = local.split_hash or split_hash(s.execute(
                    select(BuildProblem.problem_id, BuildProblem.answer)
                    .where(BuildProblem.build_id == bid, BuildProblem.kept.is_(True))).all())
                _need(local_hash == b["split_hash"],
                      f"build {bid} exists in this store with split hash {local_hash[:12]}…, the bundle's is "
                      f"{b['split_hash'][:12]}…: not the same split; nothing imported")
            existing[bid] = local
        for rid, r in runs.items():
            local = s.get(Run, rid)
            if local is None:
                continue
            changed = _identity_changes(s, r, local)
            _need(not changed, f"run {rid} exists in this store and the bundle changes its identity "
                  f"({'; '.join(changed)}): refused whatever its step; nothing imported")
            if _further(r, local):
                broken = _not_a_continuation(s, r, local)
                _need(broken is None, f"run {rid}: the bundle's copy is further along but not a continuation of "
                      f"the stored run ({broken}); nothing imported")
        for rid, r in runs.items():          # what will be written claims only what its evaluations say
            local = s.get(Run, rid)
            if local is None or _further(r, local):
                _check_evidence(rid, r, builds[r["build"]])
        for bid, b in builds.items():
            if existing[bid] is not None:
                summary["builds_present"].append(bid)
                continue
            m = get_or_create_model(s, **b["model"])
            s.add(Build(id=bid, model_id=m.id, **{c: b[c] for c in BUILD_COLUMNS}, split_hash=b["split_hash"],
                        created_at=_time(b["created_at"], bid), finished_at=_time(b["finished_at"], bid)))
            s.flush()
            s.add_all(BuildProblem(build_id=bid, problem_id=p["id"], position=p["position"], problem=p["problem"],
                                   answer=p["answer"], n_samples=p["n"], n_correct=p["correct"],
                                   accuracy=p["accuracy"], bucket="kept", kept=True) for p in b["kept"])
            summary["builds_added"].append(bid)
        s.flush()
        for rid, r in runs.items():
            local = s.get(Run, rid)
            if local is not None and not _further(r, local):
                summary["runs_present"].append(rid)
                continue
            m = get_or_create_model(s, **r["model"])
            fields = dict(model_id=m.id, build_id=r["build"], **{c: r[c] for c in RUN_COLUMNS},
                          created_at=_time(r["created_at"], rid), updated_at=_time(r["updated_at"], rid))
            if local is None:
                s.add(Run(id=rid, **fields))
                summary["runs_added"].append(rid)
            else:
                for table in (RunStep, Eval, RunDigest):
                    s.query(table).filter(table.run_id == rid).delete()
                for k, v in fields.items():
                    setattr(local, k, v)
                summary["runs_updated"].append(rid)
            s.flush()
            s.add_all(RunStep(run_id=rid, step=x["step"], metrics=x["metrics"], created_at=_time(x["created_at"], rid),
                              **{c: x[c] for c in RunStep.COLUMNS}) for x in r["steps"])
            s.add_all(Eval(run_id=rid, step=e["step"], benchmark=e["benchmark"], n=e["n"], score=e["score"])
                      for e in r["evals"])
            s.add_all(RunDigest(run_id=rid, step=d["step"], digest=d["digest"], chain=d["chain"], scheme=d["scheme"])
                      for d in r["digests"])
    return summary
