"""A run's policy on problems it never trained on: `bench runs heldback RUN`.

The sanity test trains on its split and judges the run there, so a PASS says the algorithm can
perfect what it was shown. Whether the run learned the task or the split's 118 answers is another
question, asked here on **held-back problems**: a draw of a source (by default the build's own at
another seed, `draw_seed`) with every problem the build screened left out (its split and the ones
it dropped as too easy or too hard: the build's `build_problems` rows), so neither the build nor
the run ever saw them.

Two policies answer the same problems with the same sampling seeds, through the run's own rollout
engine and format at the run's temperature, top-p and length: the **base** (the build's model, the
run's step 0) and the **trained** policy (the run's last checkpoint, the fp32 master loaded as a
resume loads it, then synced to the rollout engine). Per problem i with n responses each:

    a_i = (1/n) Σ_j correct_ij                     (avg@n of one problem)
    accuracy = (1/N) Σ_i a_i,   pass@n = (1/N) Σ_i [max_j correct_ij]
    d_i = a_i(trained) − a_i(base),   mean d ± t(0.975, N − 1) · s_d / √N

The pairing (one problem, one seed per response for both policies) removes the problems' spread
from the difference's interval. Nothing is written to the store."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.errors import BenchError
from bench.knobs import knob


class HeldBackError(BenchError, ValueError):
    """A held-back evaluation that cannot run as asked (one line, exit 2)."""


@dataclass
class HeldBackConfig:
    """One held-back evaluation of a run, each setting a knob (bench/knobs.py)."""

    source: str | None = knob(None, help="Problems (any `bench build --source`); default: the build's own source.",
                              cli=False)
    draw_seed: int = knob(1, help="Seed of the source's draw (a generated source such as arithmetic draws "
                          "other problems at another seed; the build drew at its own).", ge=0)
    limit: int = knob(200, help="Held-back problems to answer, after the build's screened ones are left out.",
                      unit="problems", ge=1)
    n: int = knob(4, help="Responses per problem and policy.", unit="responses", ge=1)
    seed: int = knob(0, help="Sampling seed: both policies draw response j of a problem with the same seed.", ge=0)
    threads: int | None = knob(None, help="Torch threads (default: the run's).", unit="threads", ge=1)


def held_back(problems: list, screened: set[str], limit: int) -> tuple[list, int]:
    """(the first `limit` of `problems` whose text is not in `screened`, how many were left out
    before the limit was reached)."""
    kept, dropped = [], 0
    for p in problems:
        if len(kept) == limit:
            break
        if p.problem in screened:
            dropped += 1
        else:
            kept.append(p)
    return kept, dropped


def paired_summary(base: list[list[bool]], trained: list[list[bool]]) -> dict:
    """Accuracy (mean avg@n), pass@n and the paired difference with its 95% t-interval over problems
    (the module's equations); `base[i][j]`: response j to problem i is correct."""
    from bench.stats import t_interval

    def side(rows):
        per = [sum(r) / len(r) for r in rows]
        return {"accuracy": sum(per) / len(per), "pass_at_n": sum(any(r) for r in rows) / len(rows)}, per

    b, b_per = side(base)
    t, t_per = side(trained)
    mean, lo, hi = t_interval([y - x for x, y in zip(b_per, t_per)])
    return {"base": b, "trained": t, "difference": {"mean": mean, "lo": lo, "hi": hi}}


def _problems(store, build, cfg: HeldBackConfig) -> tuple[list, int]:
    from sqlalchemy import select

    from bench.errors import SourceError
    from bench.problems import SourceSpec, load_problems
    from bench.store import BuildProblem, session

    with session(store) as s:
        screened = set(s.scalars(select(BuildProblem.problem).where(BuildProblem.build_id == build.id)))
    source = cfg.source or build.source
    try:
        drawn = load_problems(SourceSpec(source, limit=cfg.limit + len(screened), seed=cfg.draw_seed))
    except SourceError as e:
        raise HeldBackError(f"source {source!r}: {e}") from None
    problems, dropped = held_back(drawn, screened, cfg.limit)
    if not problems:
        raise HeldBackError(f"source {source!r} at draw seed {cfg.draw_seed} holds no problem that build {build.id} "
                            "did not screen: give another --source or --draw-seed")
    return problems, dropped


def evaluate_held_back(store, run_id: str, cfg: HeldBackConfig, progress=None) -> dict:
    """Base and trained policy of run `run_id` on held-back problems (the module's doc): the paired
    summary, what was drawn and left out, the checkpoint's step and the wall time.
    `progress(done, total)` after each policy."""
    import torch

    from bench.grading import Grader
    from bench.models import load_model, load_tokenizer, render_prompt
    from bench.engines import Sampling
    from bench.store import Build, Run, session

    from .plan import RunError, plan_of_run
    from .rollouts import start_engine

    t0 = time.perf_counter()
    with session(store) as s:
        run = s.get(Run, run_id)
        if run is None:
            raise HeldBackError(f"no run {run_id!r}; `bench runs` lists them")
        try:
            plan = plan_of_run(s, run)
        except RunError as e:
            raise HeldBackError(str(e)) from None
        build = s.get(Build, plan.build_id)
        ckpt = Path(run.checkpoint_dir or "") / "checkpoint.pt"
    if run.trainer != "native" or not ckpt.is_file():
        raise HeldBackError(f"run {run_id} has no checkpoint at {ckpt}: the trained policy is read from a native "
                            "run's last checkpoint, kept in its directory on the machine that ran it")
    problems, dropped = _problems(store, build, cfg)
    torch.set_num_threads(cfg.threads or plan.cfg.threads or torch.get_num_threads())
    tok = load_tokenizer(plan.model)
    master = load_model(plan.model, torch.float32)
    prompts = [render_prompt(plan.model, tok, p.problem) for p in problems]
    sp = Sampling(plan.cfg.temperature, plan.cfg.top_p, plan.cfg.max_tokens, seed=cfg.seed)
    engine, grader = start_engine(plan, master, tok), Grader()
    try:
        def answers() -> list[list[bool]]:
            samples = engine.generate(prompts, cfg.n, sp)
            verdicts = grader.grade([x.text for row in samples for x in row],
                                    [p.answer for p in problems for _ in range(cfg.n)])
            return [[v.correct for v in verdicts[i * cfg.n:(i + 1) * cfg.n]] for i in range(len(problems))]

        base = answers()
        if progress:
            progress(1, 2)
        state = torch.load(ckpt, weights_only=True, map_location="cpu")
        master.load_state_dict(state["model"])
        engine.update_weights(master.named_parameters())
        trained = answers()
        if progress:
            progress(2, 2)
    finally:
        engine.close()
        grader.close()
    return {"run": run_id, "step": state["step"], "algo": run.algo, "precision": plan.precision.name,
            "source": cfg.source or build.source, "left_out": dropped, "problems": len(problems),
            "settings": asdict(cfg), **paired_summary(base, trained), "wall_s": time.perf_counter() - t0}
