"""`bench model warmup`: a short, reproducible supervised warm-up that teaches a small real model the
answer format before the sanity test — the smallest honest change of setup found for SmolLM2-135M
(docs/results.md): at T = 1, top-p 1 it solves 0–2.5% of graded arithmetic (it writes on, or
leaves `\\boxed{}` empty), so no problem lands in the 20–80% band; after 30 steps of this warm-up
(145 s on 2 cores) 69% of the same problems, 13 of 40 inside the band at k = 8.

The data: problems of the `arithmetic` source (levels 2–5 by default), drawn with their own seed
and **excluding every problem of the default build's draw** (`arithmetic`, seed 0, its first
`HELD_OUT` problems, every level), so the split a build keeps was never trained on. Each target is
the one-line worked answer "a op b = c. \\boxed{c}" and the chat template's end-of-turn. Loss on the
response tokens only (mean over them), AdamW, a constant learning rate, the gradient's norm
clipped to 1, fp32, batches drawn by `random.Random(seed)`: the same settings and thread count give
the same weights on the same CPU kind.

The result (bench/models.py `warm_model`) is a model directory (fp32 safetensors, tokenizer) with
`bench-model.json`: what it was warmed from (name, weights hash, its GGUF), every setting, the loss
curve, and the defaults a build of it takes (instruction, template, source, max tokens).
`smollm2-135m-warm` names SmolLM2-135M warmed with the defaults here, made on its first use.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from bench.arithmetic import arithmetic_rows, parse_levels
from bench.knobs import check, knob

HELD_OUT = 500          # the default build's draw (bench/arithmetic.py DEFAULT_LIMIT)


@dataclass
class WarmupConfig:
    """One warm-up; each field a knob (bench/knobs.py)."""

    steps: int = knob(30, help="Optimizer steps.", unit="steps", ge=1)
    lr: float = knob(2e-5, help="AdamW learning rate, constant.", gt=0)
    batch_size: int = knob(16, help="Problems a step.", unit="problems", ge=1)
    levels: str = knob("2-5", help="Arithmetic levels trained on (bench/arithmetic.py).")
    seed: int = knob(0, help="Seed of the draw of training problems and of their order.", ge=0)
    threads: int = knob(2, help="Torch threads (the weights depend on it: GEMM reduction order).", unit="threads",
                        ge=1)
    max_tokens: int = knob(128, help="Default max response length of builds of the warmed model.", unit="tokens",
                           ge=1)


def worked_answer(problem: str, answer: str) -> str:
    """The one-line worked answer of an arithmetic problem: "a op b = c. \\boxed{c}"."""
    m = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", problem)
    if m:
        return f"{m.group(1)} {m.group(2)} {m.group(3)} = {answer}. \\boxed{{{answer}}}"
    a, b = re.findall(r"\d+", problem)
    return f"{a} {'+' if ' more' in problem else '-'} {b} = {answer}. \\boxed{{{answer}}}"


def training_pool(cfg: WarmupConfig) -> list[dict]:
    """Arithmetic problems of `cfg.levels` drawn with seed 1000 + cfg.seed, without any problem of
    the default build's draw (seed 0, the first HELD_OUT)."""
    parse_levels(cfg.levels)
    held = {r["problem"] for r in arithmetic_rows("", HELD_OUT, seed=0)}
    return [r for r in arithmetic_rows(cfg.levels, 4 * HELD_OUT, seed=1000 + cfg.seed) if r["problem"] not in held]


def checked(cfg: WarmupConfig) -> WarmupConfig:
    """`cfg` with every knob in its bounds and its levels readable (BenchError naming the flag)."""
    check(cfg)
    parse_levels(cfg.levels)
    return cfg


def warmed_name(model_name: str, cfg: WarmupConfig) -> str:
    """The directory name of `model_name` warmed with `cfg` under the models cache:
    <stem>-warm-<steps>-<lr>-<seed> (`bench model warmup`'s default --out)."""
    return f"{Path(model_name).stem}-warm-{cfg.steps}-{cfg.lr:g}-{cfg.seed}"


def _batch(tok, render: Callable[[str], str], rows: list[dict]):
    """(input ids, labels, attention mask), right-padded; labels -100 on the prompt and padding."""
    import torch

    end = tok.eos_token_id
    ids, labels = [], []
    for r in rows:
        p = tok.encode(render(r["problem"]), add_special_tokens=False)
        y = tok.encode(worked_answer(r["problem"], r["answer"]), add_special_tokens=False) + [end]
        ids.append(p + y)
        labels.append([-100] * len(p) + y)
    width = max(map(len, ids))
    x = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in ids])
    y = torch.tensor([s + [-100] * (width - len(s)) for s in labels])
    attn = (torch.arange(width)[None, :] < torch.tensor([len(s) for s in ids])[:, None]).long()
    return x, y, attn


def train(model, tok, render: Callable[[str], str], cfg: WarmupConfig, progress=None) -> dict:
    """Warm `model` (fp32, loaded) up in place (module docstring): `render` turns a problem into its
    prompt text. Returns the record's "warmup" part: the settings, the pool's size, the losses."""
    import torch

    pool = training_pool(checked(cfg))
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(f"warmup:{cfg.seed}")
    losses, t0 = [], time.time()
    for step in range(cfg.steps):
        x, y, attn = _batch(tok, render, rng.sample(pool, cfg.batch_size))
        loss = model(input_ids=x, attention_mask=attn, labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if progress:
            progress(step + 1, cfg.steps, losses[-1])
    model.eval()
    torch.set_num_threads(threads)                  # the caller's threads back (a check that warmed a model up)
    return {**asdict(cfg), "pool": len(pool), "held_out": f"arithmetic seed 0, first {HELD_OUT}", "losses": losses,
            "wall_s": time.time() - t0, "torch": torch.__version__}
