"""`bench model train` and `bench db upgrade`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from bench.cli import DB_OPT, _progress, _store, db_app, fail, model_app, out


# ------------------------------------------------------------------ model / db

@model_app.command("train")
def model_train(name: str = typer.Argument("tiny-math", help="'tiny-math' (Llama) or 'tiny-math-moe' (Mixtral)."),
                steps: Optional[int] = typer.Option(None, help="Training steps (the band knob; default 2500 for "
                                                    "tiny-math, MOE_STEPS of bench/tinymath.py for tiny-math-moe)."),
                batch_size: int = typer.Option(64), lr: float = typer.Option(3e-3),
                seed: int = typer.Option(0), threads: int = typer.Option(1),
                hidden: int = typer.Option(128), layers: int = typer.Option(3),
                experts: int = typer.Option(8, help="tiny-math-moe: experts per layer (each 1.5 × hidden wide)."),
                top_k: int = typer.Option(2, help="tiny-math-moe: experts per token."),
                out_dir: Optional[Path] = typer.Option(None, "--out", help="Default: the package's embedded weights.")):
    """Train an embedded model from scratch on synthetic worked solutions."""
    from bench.models import TINY_MATH_MOE_DIR
    from bench.tinymath import MOE_STEPS, TinyConfig, TinyMoeConfig, TrainConfig, train

    if name not in ("tiny-math", "tiny-math-moe"):
        fail(f"unknown trainable model {name!r}; only 'tiny-math' or 'tiny-math-moe'")
    steps = steps if steps is not None else (2500 if name == "tiny-math" else MOE_STEPS)
    if steps < 1 or batch_size < 1:
        fail("steps and batch size must be >= 1")
    if name == "tiny-math-moe" and not 1 <= top_k <= experts:
        fail(f"--top-k must lie in [1, --experts]; got top-k {top_k} of {experts} experts")
    arch = (TinyConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=3 * hidden)
            if name == "tiny-math" else
            TinyMoeConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=3 * hidden // 2,
                          num_experts=experts, top_k=top_k))
    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed, threads=threads, arch=arch)
    if out_dir:
        cfg.out = out_dir
    elif name == "tiny-math-moe":
        cfg.out = TINY_MATH_MOE_DIR
    with _progress("training") as prog:
        task = prog.add_task("training", total=steps, rate="")
        summary = train(cfg, progress=lambda s, n, loss: prog.update(task, completed=s, rate=f"loss {loss:.3f}"))
    out.print_json(json.dumps(summary))


@model_app.command("warmup")
def model_warmup(name: str = typer.Argument(..., help="A real model: smollm2-135m, gemma3-270m, a .gguf file or a "
                                            "model directory."),
                 out_dir: Optional[Path] = typer.Option(None, "--out", help="Default: $BENCH_HOME/models/<name>-warm-"
                                                        "<steps>-<lr>-<seed>."),
                 steps: int = typer.Option(30, help="Optimizer steps."), lr: float = typer.Option(2e-5),
                 batch_size: int = typer.Option(16), levels: str = typer.Option("2-5", help="Arithmetic levels "
                                                                                 "trained on."),
                 seed: int = typer.Option(0), threads: int = typer.Option(2),
                 max_tokens: int = typer.Option(128, help="Default response length of builds of the warmed model.")):
    """Teach a small real model the boxed-answer format before the sanity test: a short, reproducible
    supervised warm-up on arithmetic problems no default build draws (bench/warmup.py). Writes a model
    directory to build and train on (`bench build --model DIR`)."""
    from bench.model_sources import models_home
    from bench.models import resolve_model, warm_model
    from bench.warmup import WarmupConfig, warmed_name

    cfg = WarmupConfig(steps=steps, lr=lr, batch_size=batch_size, levels=levels, seed=seed, threads=threads,
                       max_tokens=max_tokens)
    if resolve_model(name).embedded:
        fail(f"{name!r} is an embedded model: `bench model train` makes it; the warm-up is for real models")
    target = out_dir or models_home() / warmed_name(name, cfg)
    if (target / "config.json").exists():
        fail(f"{target} already holds a model: give another --out")
    with _progress("warming up") as prog:
        task = prog.add_task("steps", total=steps, rate="")
        summary = warm_model(name, cfg, target, progress=lambda s, n, loss: prog.update(task, completed=s,
                                                                                    rate=f"loss {loss:.3f}"))
    out.print_json(json.dumps(summary))


@db_app.command("upgrade")
def db_upgrade(db: Optional[str] = DB_OPT):
    """Apply pending migrations to the store."""
    from bench.store import default_url

    _store(db)
    out.print(f"store at {db or default_url()} is up to date")
