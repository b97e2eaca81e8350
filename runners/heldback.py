"""A run's policy on problems it never trained on: `bench runs heldback RUN`.

The sanity test trains on its split and judges the run there, so a PASS says the algorithm can
perfect what it was shown. Whether the run learned the task or the split's answers is asked here
on **held-back problems**: problems of a source (by default the build's own) that the build never
screened. A source generated from its seed (`arithmetic`, `synthetic`: bench/problems.py
`drawn_by_seed`) is drawn at another seed (`draw_seed`, default the build's seed + 1); any other
source reads its rows in order. Either way every problem the build screened (its split and the
ones it dropped as too easy or too hard: its `build_problems` rows, compared on the normalised
text) is left out, so neither the build nor the run saw them.

Two policies answer the same problems with the same sampling seeds, through the run's own rollout
engine and format at the run's temperature, top-p and length: the **base** (the model the run
trained, confirmed by its weights hash: the run's step 0) and the **trained** policy (the fp32
master of the run's last checkpoint, synced to the rollout engine as the run's own evaluations
see it). Per problem i with n responses each:

    a_i = (1/n) Σ_j correct_ij                     (avg@n of one problem)
    accuracy = (1/N) Σ_i a_i,   pass@n = (1/N) Σ_i [max_j correct_ij]
    d_i = a_i(trained) − a_i(base),   mean d ± t(0.975, N − 1) · s_d / √N

The pairing (one problem, one seed per response for both policies) removes the problems' spread
from the difference's interval. Nothing is written to the store."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.errors import BenchError, SourceError
from bench.knobs import knob


class HeldBackError(BenchError, ValueError):
    """A held-back evaluation that cannot run as asked (one line, exit 2)."""


@dataclass
class HeldBackConfig:
    """One held-back evaluation of a run, each setting a knob (bench/knobs.py)."""

    source: str | None = knob(None, help="Problems (any `bench build --source`); default: the build's own source.",
                              cli=False)
    draw_seed: int | None = knob(None, help="Seed of a generated source's draw (arithmetic, synthetic); default: "
                                 "the build's seed + 1. Files and packaged sets read their rows in order.", ge=0)
    limit: int = knob(200, help="Held-back problems to answer, after the build's screened ones are left out.",
                      unit="problems", ge=2)
    n: int = knob(4, help="Responses per problem and policy.", unit="responses", ge=1)
    seed: int = knob(0, help="Sampling seed: both policies draw response j of a problem with the same seed.", ge=0)
    threads: int | None = knob(None, help="Torch threads (default: the run's).", unit="threads", ge=1)


def held_back(problems: list, screened: set[str], limit: int) -> tuple[list, int]:
    """(the first `limit` of `problems` whose normalised text is not in `screened` (normalised
    texts), how many were left out before the limit was reached)."""
    from bench.problem_ids import normalise_text

    kept, dropped = [], 0
    for p in problems:
        if len(kept) == limit:
            break
        if normalise_text(p.problem) in screened:
            dropped += 1
        else:
            kept.append(p)
    return kept, dropped


def paired_summary(base: list[list[bool]], trained: list[list[bool]]) -> dict:
    """Accuracy (mean avg@n), pass@n and the paired difference with its 95% t-interval over problems
    (the module's equations; None for a bound that is undefined); `base[i][j]`: response j to
    problem i is correct."""
    from bench.stats import t_interval

    def side(rows):
        per = [sum(r) / len(r) for r in rows]
        return {"accuracy": sum(per) / len(per), "pass_at_n": sum(any(r) for r in rows) / len(rows)}, per

    b, b_per = side(base)
    t, t_per = side(trained)
    mean, lo, hi = (None if math.isnan(x) else x for x in t_interval([y - x for x, y in zip(b_per, t_per)]))
    return {"base": b, "trained": t, "difference": {"mean": mean, "lo": lo, "hi": hi}}


def _problems(store, build, cfg: HeldBackConfig) -> tuple[list, dict]:
    """The held-back problems and what was drawn: {source, draw_seed (None where the source is not
    drawn by seed), left_out, screened, screened_all (False where the store holds only the build's
    kept problems: an imported build)}."""
    from sqlalchemy import select

    from bench.problem_ids import normalise_text
    from bench.problems import SourceSpec, drawn_by_seed, load_problems
    from bench.store import BuildProblem, session

    with session(store) as s:
        screened = {normalise_text(t) for t in s.scalars(select(BuildProblem.problem)
                                                         .where(BuildProblem.build_id == build.id))}
    source = cfg.source or build.source
    seeded = drawn_by_seed(source)
    draw_seed = (build.seed + 1 if cfg.draw_seed is None else cfg.draw_seed) if seeded else None
    try:
        drawn = load_problems(SourceSpec(source, limit=cfg.limit + len(screened), seed=draw_seed or 0))
    except SourceError as e:
        raise HeldBackError(f"source {source!r} cannot give {cfg.limit} problems besides the {len(screened)} build "
                            f"{build.id} screened ({e}): ask for fewer (--limit) or give another --source") from None
    problems, dropped = held_back(drawn, screened, cfg.limit)
    if len(problems) < 2:
        raise HeldBackError(f"source {source!r}" + (f" at draw seed {draw_seed}" if seeded else "")
                            + f" holds {len(problems)} problem(s) that build {build.id} did not screen: give another "
                            + ("--source or --draw-seed" if seeded else "--source"))
    return problems, {"source": source, "draw_seed": draw_seed, "left_out": dropped, "screened": len(screened),
                      "screened_all": build.n_problems is None or len(screened) >= build.n_problems}


def _inputs(store, run_id: str):
    """(run, its plan at the confirmed model, build, checkpoint path), or HeldBackError."""
    from bench.store import Model, Run, session

    from .plan import RunError, config_from_dict, plan_of_run, resolve_inputs, trained_model

    with session(store) as s:
        run = s.get(Run, run_id)
        if run is None:
            raise HeldBackError(f"no run {run_id!r}; `bench runs` lists them")
        if run.trainer != "native":
            raise HeldBackError(f"run {run_id} was trained by {run.trainer}, whose checkpoints bench does not read: "
                                "the trained policy is read from a native run's last checkpoint")
        try:
            config_from_dict(run.config)
            build, _, ref = resolve_inputs(s, run.build_id, None)
            ref = trained_model(s, run, build, ref)
            plan = plan_of_run(s, run, model=(s.get(Model, run.model_id), ref))
        except RunError as e:
            raise HeldBackError(str(e)) from None
        except (TypeError, KeyError) as e:
            raise HeldBackError(f"run {run_id}'s config cannot be read by this bench ({e})") from None
    ckpt = Path(run.checkpoint_dir) / "checkpoint.pt" if run.checkpoint_dir else None
    if ckpt is None or not ckpt.is_file():
        raise HeldBackError(f"run {run_id} has no checkpoint at {ckpt or 'no directory'}: the trained policy is read "
                            "from the run's last checkpoint, kept in its directory on the machine that ran it")
    return run, plan, build, ckpt


def _checkpoint(ckpt: Path, master) -> dict:
    """The checkpoint's state, its weights checked against `master`'s names and shapes."""
    import pickle

    import torch

    try:
        state = torch.load(ckpt, weights_only=True, map_location="cpu")
        want = {k: tuple(v.shape) for k, v in master.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in state["model"].items()}
    except (pickle.UnpicklingError, RuntimeError, KeyError, EOFError) as e:
        raise HeldBackError(f"{ckpt} is no checkpoint bench can read ({e})") from None
    if got != want:
        raise HeldBackError(f"{ckpt} holds weights of another model ({len(got)} tensors against the model's "
                            f"{len(want)}, or other shapes)")
    return state


def evaluate_held_back(store, run_id: str, cfg: HeldBackConfig, progress=None) -> dict:
    """Base and trained policy of run `run_id` on held-back problems (the module's doc): the paired
    summary, what was drawn and left out, the checkpoint's step and the wall time.
    `progress(done, total)` after each policy."""
    import torch

    from bench.engines import Sampling
    from bench.grading import Grader
    from bench.models import load_model, load_tokenizer, render_prompt

    from .rollouts import start_engine

    t0 = time.perf_counter()
    run, plan, build, ckpt = _inputs(store, run_id)
    problems, drawn = _problems(store, build, cfg)
    torch.set_num_threads(cfg.threads or plan.cfg.threads or torch.get_num_threads())
    tok = load_tokenizer(plan.model)
    master = load_model(plan.model, torch.float32)
    state = _checkpoint(ckpt, master)
    prompts = [render_prompt(plan.model, tok, p.problem) for p in problems]
    sp = Sampling(plan.cfg.temperature, plan.cfg.top_p, plan.cfg.max_tokens, seed=cfg.seed)
    engine = grader = None
    try:
        engine, grader = start_engine(plan, master, tok), Grader()

        def answers() -> list[list[bool]]:
            samples = engine.generate(prompts, cfg.n, sp)
            verdicts = iter(grader.grade([x.text for row in samples for x in row],
                                         [p.answer for p, row in zip(problems, samples) for _ in row]))
            return [[next(verdicts).correct for _ in row] for row in samples]

        base = answers()
        if progress:
            progress(1, 2)
        master.load_state_dict(state["model"])
        engine.update_weights(master.named_parameters())
        trained = answers()
        if progress:
            progress(2, 2)
    finally:
        if engine is not None:
            engine.close()
        if grader is not None:
            grader.close()
    return {"run": run_id, "step": state["step"], "algo": run.algo, "precision": plan.precision.name, **drawn,
            "problems": len(problems), "settings": asdict(cfg), **paired_summary(base, trained),
            "wall_s": time.perf_counter() - t0}
