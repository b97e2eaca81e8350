"""The builder: k rollouts per problem, graded with math-verify, kept when the problem's
accuracy lies in [lo, hi] — the paper's perfectible split.

BuildPlan → sample → grade → persist (one transaction per chunk of problems, so a killed build
loses at most the chunk in flight and `--resume` neither loses nor duplicates a rollout) →
aggregate → filter → save. `--shard i/n` builds the problems at positions ≡ i (mod n);
`merge_shards` joins complete shards into one split.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from sqlalchemy import delete, func, select

from bench.statuses import BUILD_COMPLETE, BUILD_FAILED, BUILD_RUNNING
from bench.engines import Sampling, make_engine, resolve_engine
from bench.grading import CORRECT, Grader
from bench.model_sources import gguf_provenance
from bench.models import (build_defaults, load_tokenizer, prompt_settings, render_prompt, resolve_model,
                          template_description, weights_hash, with_prompt)
from bench.problem_ids import split_hash
from bench.problems import Problem, SourceSpec, load_source
from bench.store import Build, BuildProblem, BuildRollout, bench_home, get_or_create_model, session

from .adaptive import decided
from .config import BuildConfig, BuildError, parse_shard  # noqa: F401  (re-exported: the old home)
from .split import BAD_GOLD, KEPT, ProblemResult, bucket, bucket_counts, write_split


def shard_positions(n_problems: int, shard: tuple[int, int] | None) -> list[int]:
    """Positions a shard builds: every n-th problem starting at i (all when unsharded)."""
    if shard is None:
        return list(range(n_problems))
    i, n = shard
    return list(range(i, n_problems, n))


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _check_writable(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / f".bench-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise BuildError(f"output directory {path} is not writable: {e.strerror or e}") from None


@dataclass
class BuildPlan:
    cfg: BuildConfig
    model_ref: object
    tokenizer: object
    problems: list[Problem]
    prompts: list[str]
    sampling: Sampling
    engine: str
    settings: dict
    template: str
    duplicates: dict            # the source's repeated texts, each counted once (bench.problems.load_source)


def plan(cfg: BuildConfig) -> BuildPlan:
    """Resolve model, source, prompts and settings; raises BuildError before anything is written."""
    cfg.validate()
    ref = with_prompt(resolve_model(cfg.model), cfg.template, cfg.instruction)
    defaults = build_defaults(ref)
    source = cfg.source or defaults["source"]
    cfg.source = source
    problems, duplicates = load_source(SourceSpec(source, cfg.columns, cfg.limit, cfg.seed))
    tok = load_tokenizer(ref)
    prompts = [render_prompt(ref, tok, p.problem) for p in problems]
    max_tokens = cfg.max_tokens or defaults["max_tokens"]
    sampling = Sampling(cfg.temperature, cfg.top_p, max_tokens, cfg.seed)
    engine = resolve_engine(cfg.engine)
    if cfg.cascade_attention:
        from bench.engines.cascade import request_refusal

        why = request_refusal(ref.path, engine)
        if why:
            raise BuildError(why)
    template = template_description(ref, tok)
    settings = {"model": ref.name, "weights": weights_hash(ref), "source": source, "limit": cfg.limit,
                "columns": asdict(cfg.columns), "engine": engine, "dtype": cfg.dtype, "k": cfg.k,
                "lo": cfg.lo, "hi": cfg.hi, "sampling": sampling.to_dict(), "template": template,
                "adaptive": [cfg.round_size, cfg.confidence, cfg.min_samples] if cfg.adaptive else None,
                "problems": hashlib.sha256("\0".join(p.id for p in problems).encode()).hexdigest()[:16]}
    if cfg.cascade_attention:                  # only when set: the builds made before it keep their hash
        settings["cascade_attention"] = True
    return BuildPlan(cfg, ref, tok, problems, prompts, sampling, engine, settings, template, duplicates)


SPLIT_HASH_OF = "sha256 of the compact JSON [[id, gold answer], ...] of the kept problems, sorted by id"


def kept_split_hash(results: list[ProblemResult]) -> str:
    """The content hash of the kept split (bench.problem_ids.split_hash)."""
    return split_hash((r.id, r.answer) for r in results if r.bucket == KEPT)


def _find_resumable(s, shash: str, shard: str | None) -> Build | None:
    q = select(Build).where(Build.settings_hash == shash, Build.status != BUILD_COMPLETE)
    q = q.where(Build.shard.is_(None) if shard is None else Build.shard == shard)
    return s.scalars(q.order_by(Build.created_at.desc())).first()


def _done_problems(s, build_id: str, k: int, adaptive: bool) -> set[str]:
    """Problems whose rollouts are stored (all k; adaptive: any, as a chunk commits its problems
    whole); partial ones (none in practice) are deleted."""
    counts = dict(s.execute(select(BuildRollout.problem_id, func.count()).where(BuildRollout.build_id == build_id)
                            .group_by(BuildRollout.problem_id)).all())
    if adaptive:
        return set(counts)
    partial = [p for p, c in counts.items() if c != k]
    if partial:
        s.execute(delete(BuildRollout).where(BuildRollout.build_id == build_id, BuildRollout.problem_id.in_(partial)))
    return {p for p, c in counts.items() if c == k}


def _open_build(engine_db, p: BuildPlan) -> dict | tuple[str, Path]:
    """The build's row, running: a finished build of the same settings (reused: its manifest,
    unless --resume or --force), the unfinished one --resume continues, or a new one; returns
    the reused manifest or (build id, output folder)."""
    cfg = p.cfg
    shash = settings_hash(p.settings)
    with session(engine_db) as s:
        model = get_or_create_model(s, p.model_ref.name, p.model_ref.path, p.settings["weights"])
        if not (cfg.resume or cfg.force):
            q = select(Build).where(Build.settings_hash == shash, Build.status == BUILD_COMPLETE)
            done = s.scalars(q.where(Build.shard.is_(None) if cfg.shard is None else Build.shard == cfg.shard)
                             .order_by(Build.finished_at.desc())).first()
            if done is not None:          # same model, data, sampling and seed: the same split
                return {**done.manifest, "reused": True}
        build = _find_resumable(s, shash, cfg.shard) if cfg.resume else None
        if cfg.resume and build is None:
            raise BuildError("--resume: no unfinished build with these settings; run without --resume to start one")
        if build is None:
            build_id = uuid.uuid4().hex[:12]
            out = Path(cfg.out) if cfg.out else bench_home() / "builds" / build_id
            _check_writable(out)
            build = Build(id=build_id, model_id=model.id, source=cfg.source, engine=p.engine, dtype=cfg.dtype,
                          k=cfg.k, lo=cfg.lo, hi=cfg.hi, seed=cfg.seed, shard=cfg.shard, settings_hash=shash,
                          status=BUILD_RUNNING, out_dir=str(out), n_problems=len(p.problems),
                          manifest={"settings": p.settings})
            s.add(build)
        else:
            if cfg.out:
                build.out_dir = str(cfg.out)
            _check_writable(Path(build.out_dir))
            build.status = BUILD_RUNNING
        return build.id, Path(build.out_dir)


def run_build(engine_db, cfg: BuildConfig, progress: Callable[[int, int, int], None] | None = None,
              rollout_engine=None) -> dict:
    """Run (or resume) a build; returns its manifest. `progress(done, total, new)` is called
    after each chunk with rollouts done so far, in total, and sampled in this process.
    `rollout_engine` reuses a running engine of the configured kind and dtype (left open)."""
    p = plan(cfg)
    shard = parse_shard(cfg.shard)
    opened = _open_build(engine_db, p)
    if isinstance(opened, dict):
        return opened
    build_id, out_dir = opened

    t0 = time.time()
    positions = shard_positions(len(p.problems), shard)
    with Grader(timeout=cfg.grade_timeout) as grader:
        bad_golds = set(grader.unparseable_golds([p.problems[i].answer for i in positions]))
        graded = [i for i in positions if p.problems[i].answer.strip() not in bad_golds]
        with session(engine_db) as s:
            done = _done_problems(s, build_id, cfg.k, cfg.adaptive)
        todo = [i for i in graded if p.problems[i].id not in done]
        total = len(graded) * cfg.k
        done_rollouts = total - len(todo) * cfg.k
        new = 0
        t_gen = 0.0
        own_engine = rollout_engine is None and bool(todo)
        if own_engine:
            rollout_engine = make_engine(p.engine, p.model_ref.path, cfg.dtype,
                                         **({"threads": cfg.threads, "device": cfg.device,
                                             "cascade_attention": cfg.cascade_attention} if p.engine == "torch"
                                            else {}))
        try:
            if progress:
                progress(done_rollouts, total, 0)
            for c in range(0, len(todo), cfg.chunk):
                idx = todo[c:c + cfg.chunk]
                tg = time.time()
                flat, verdicts = _sample_and_grade(p, rollout_engine, grader, idx)
                t_gen += time.time() - tg
                with session(engine_db) as s:
                    s.add_all(BuildRollout(build_id=build_id, problem_id=p.problems[i].id, sample=j,
                                           extracted=v.extracted, verdict=v.status, reason=v.reason[:500],
                                           length=len(smp.token_ids), finish_reason=smp.finish_reason,
                                           text=smp.text if cfg.keep_text else None)
                              for (i, j, smp), v in zip(flat, verdicts))
                new += len(flat)
                done_rollouts += len(flat)
                if progress:
                    progress(done_rollouts, total, new)
        except BaseException:
            with session(engine_db) as s:
                b = s.get(Build, build_id)
                b.status = BUILD_FAILED
            raise
        finally:
            if own_engine:
                rollout_engine.close()
        cache_hits = grader.hits

    return _finish(engine_db, p, build_id, out_dir, positions, bad_golds, new, t_gen, time.time() - t0, cache_hits)


def _sample_and_grade(p: BuildPlan, engine, grader: Grader, idx: list[int]):
    """All rollouts of the problems `idx` with their verdicts: k each, or (adaptive) rounds of
    `round_size` until the Wilson interval decides the problem or k is reached."""
    cfg = p.cfg
    flat, verdicts = [], []
    active, start = list(idx), 0
    correct = dict.fromkeys(idx, 0)
    while active and start < cfg.k:
        n = cfg.k - start if not cfg.adaptive else min(cfg.round_size, cfg.k - start)
        samples = engine.generate([p.prompts[i] for i in active], n, p.sampling, start=start)
        new = [(i, start + j, smp) for i, row in zip(active, samples) for j, smp in enumerate(row)]
        vs = grader.grade([smp.text for _, _, smp in new], [p.problems[i].answer for i, _, _ in new])
        flat += new
        verdicts += vs
        for (i, _, _), v in zip(new, vs):
            correct[i] += v.correct
        start += n
        active = [i for i in active
                  if not decided(correct[i], start, cfg.lo, cfg.hi, cfg.confidence, cfg.min_samples)]
    return flat, verdicts


def _finish(engine_db, p: BuildPlan, build_id: str, out_dir: Path, positions: list[int], bad_golds: set[str],
            new_rollouts: int, t_gen: float, wall: float, cache_hits: int) -> dict:
    cfg = p.cfg
    with session(engine_db) as s:
        rows = s.execute(select(BuildRollout.problem_id, BuildRollout.verdict, BuildRollout.length)
                         .where(BuildRollout.build_id == build_id)).all()
    n_correct: dict[str, int] = {}
    n_samples: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    lengths = []
    for pid, verdict, length in rows:
        n_samples[pid] = n_samples.get(pid, 0) + 1
        n_correct[pid] = n_correct.get(pid, 0) + (verdict == CORRECT)
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
        lengths.append(length)
    results = []
    for pos in positions:
        prob = p.problems[pos]
        if prob.answer.strip() in bad_golds:
            acc = None
        else:
            acc = n_correct.get(prob.id, 0) / max(1, n_samples.get(prob.id, cfg.k))
        results.append(ProblemResult(prob.id, prob.problem, prob.answer, pos, n_samples.get(prob.id, 0),
                                     n_correct.get(prob.id, 0), acc, bucket(acc, cfg.lo, cfg.hi)))
    counts = bucket_counts(results)
    shash = kept_split_hash(results)
    manifest = {
        "build_id": build_id, "model": p.model_ref.name, "model_path": p.model_ref.path,
        "weights_hash": p.settings["weights"], "engine": p.engine, "dtype": cfg.dtype,
        "device": cfg.device if p.engine == "torch" else None,
        "source": cfg.source, "sampling": p.sampling.to_dict(), "k": cfg.k, "band": [cfg.lo, cfg.hi],
        "band_inclusive": True, "shard": cfg.shard, "template": p.template, "prompt": prompt_settings(p.model_ref),
        "model_source": gguf_provenance(p.model_ref.path),
        "adaptive": {"round_size": cfg.round_size, "confidence": cfg.confidence, "min_samples": cfg.min_samples,
                     "interval": "Wilson"}
        if cfg.adaptive else None,
        "problems": len(results), "counts": counts,
        "kept_fraction": counts[KEPT] / max(1, len(results) - counts[BAD_GOLD]),
        "bad_golds": sorted(bad_golds), "verdicts": verdicts, "rollouts": len(rows),
        "rollouts_this_session": new_rollouts,
        "rollouts_per_s": new_rollouts / t_gen if t_gen > 0 else None,
        "mean_response_tokens": sum(lengths) / len(lengths) if lengths else None,
        "grader_cache_hits": cache_hits, "wall_s": wall, "settings": p.settings, "out_dir": str(out_dir),
        "split_hash": shash, "split_hash_of": SPLIT_HASH_OF, "duplicates": p.duplicates,
    }
    write_split(out_dir, results, cfg.k, manifest)
    with session(engine_db) as s:
        s.execute(delete(BuildProblem).where(BuildProblem.build_id == build_id))
        s.add_all(BuildProblem(build_id=build_id, problem_id=r.id, position=r.position, problem=r.problem,
                               answer=r.answer, n_samples=r.n_samples, n_correct=r.n_correct,
                               accuracy=r.accuracy, bucket=r.bucket, kept=r.bucket == KEPT) for r in results)
        b = s.get(Build, build_id)
        b.status, b.n_problems, b.n_kept, b.manifest = BUILD_COMPLETE, len(results), counts[KEPT], manifest
        b.split_hash = shash
        from bench.store.schema import utcnow

        b.finished_at = utcnow()
    return manifest
