"""Join the shards of one build (`bench build --shard i/n`, any machines, one store) into one
split. Every shard must be complete and built with identical settings; samples are seeded per
(problem, sample), so the merged split equals the unsharded build's."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import insert, literal, select

from bench.statuses import BUILD_COMPLETE
from bench.store import Build, BuildProblem, BuildRollout, bench_home, session
from bench.store.schema import utcnow

from .builder import SPLIT_HASH_OF, BuildError, kept_split_hash, parse_shard
from .split import KEPT, ProblemResult, bucket_counts, write_split


def _pick_shards(s, ids: list[str]) -> list[Build]:
    if ids:
        shards = [s.get(Build, i) for i in ids]
        missing = [i for i, b in zip(ids, shards) if b is None]
        if missing:
            raise BuildError(f"no build {', '.join(missing)}; `bench builds` lists them")
        return shards
    latest = s.scalars(select(Build).where(Build.shard.is_not(None)).order_by(Build.created_at.desc())).first()
    if latest is None:
        raise BuildError("no sharded builds to merge; make them with `bench build --shard i/n`")
    group = s.scalars(select(Build).where(Build.settings_hash == latest.settings_hash, Build.shard.is_not(None))
                      .order_by(Build.created_at.desc())).all()
    newest: dict[str, Build] = {}
    for b in group:                                   # the newest build of each shard index
        newest.setdefault(b.shard, b)
    return list(newest.values())


def merge_shards(engine_db, ids: list[str] | None = None, out: Path | None = None) -> dict:
    """Check the shards, then write the merged split and record it as one build."""
    with session(engine_db) as s:
        shards = _pick_shards(s, ids or [])
        if len({b.settings_hash for b in shards}) != 1:
            raise BuildError("these shards were built with different settings: "
                             + ", ".join(f"{b.id} ({b.shard})" for b in shards))
        parsed = [parse_shard(b.shard) for b in shards if b.shard]
        if len(parsed) != len(shards):
            raise BuildError("only shard builds (made with --shard i/n) can be merged")
        n = parsed[0][1]
        if any(p[1] != n for p in parsed):
            raise BuildError("shards disagree on the number of shards n")
        have = sorted(p[0] for p in parsed)
        if have != list(range(n)):
            missing = sorted(set(range(n)) - set(have))
            raise BuildError(f"missing shard(s) {', '.join(f'{i}/{n}' for i in missing)}" if missing
                             else "a shard index appears twice; name the shard builds explicitly")
        unfinished = [f"{b.id} ({b.shard}: {b.status})" for b in shards if b.status != BUILD_COMPLETE]
        if unfinished:
            raise BuildError(f"unfinished shard(s): {', '.join(unfinished)}; resume them with --resume")
        first = shards[0]
        rows = s.scalars(select(BuildProblem).where(BuildProblem.build_id.in_([b.id for b in shards]))
                         .order_by(BuildProblem.position)).all()
        results = [ProblemResult(r.problem_id, r.problem, r.answer, r.position, r.n_samples, r.n_correct, r.accuracy,
                                 r.bucket) for r in rows]
        build_id = uuid.uuid4().hex[:12]
        out_dir = Path(out) if out else bench_home() / "builds" / build_id
        manifests = [b.manifest or {} for b in shards]
        base = dict(manifests[0])
        counts = bucket_counts(results)
        shash = kept_split_hash(results)
        manifest = {**base, "build_id": build_id, "shard": None, "shards": [b.id for b in shards],
                    "split_hash": shash, "split_hash_of": SPLIT_HASH_OF,
                    "problems": len(results), "counts": counts,
                    "kept_fraction": counts[KEPT] / max(1, len(results) - counts["bad_gold"]),
                    "bad_golds": sorted({g for m in manifests for g in m.get("bad_golds", [])}),
                    "rollouts": sum(m.get("rollouts", 0) for m in manifests),
                    "rollouts_per_s": sum(m.get("rollouts_per_s") or 0 for m in manifests) or None,
                    "wall_s": max(m.get("wall_s", 0) for m in manifests), "out_dir": str(out_dir)}
        write_split(out_dir, results, first.k, manifest)
        s.add(Build(id=build_id, model_id=first.model_id, source=first.source, engine=first.engine, dtype=first.dtype,
                    k=first.k, lo=first.lo, hi=first.hi, seed=first.seed, shard=None,
                    settings_hash=first.settings_hash, status=BUILD_COMPLETE, out_dir=str(out_dir),
                    n_problems=len(results), n_kept=counts[KEPT], manifest=manifest, finished_at=utcnow(),
                    split_hash=shash))
        s.flush()
        s.add_all(BuildProblem(build_id=build_id, problem_id=r.id, position=r.position, problem=r.problem,
                               answer=r.answer, n_samples=r.n_samples, n_correct=r.n_correct, accuracy=r.accuracy,
                               bucket=r.bucket, kept=r.bucket == KEPT) for r in results)
        table = BuildRollout.__table__
        cols = [c.name for c in table.columns if c.name != "build_id"]
        for b in shards:
            s.execute(insert(table).from_select(
                ["build_id", *cols],
                select(literal(build_id), *[table.c[c] for c in cols]).where(table.c.build_id == b.id)))
    return manifest
