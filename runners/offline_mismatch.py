"""`bench mismatch`: the paper's offline analysis (its Figure 2). Sample n responses per
problem with the rollout engine at T=1, top-p=1 (μ is then the raw softmax), score the same
tokens with the training engine (π, one full-sequence forward), and report every mismatch
metric plus two plots: the token scatter μ vs π and the sequence log-ratio against length.
Each report is stored with its conditions (`conditions`): reports compare only with reports of
the same conditions (leaderboard/summary.py pairs bf16 with fp16 on them)."""

from __future__ import annotations

from contextlib import closing
from dataclasses import replace
from pathlib import Path

import torch

from bench.engines import Sampling
from bench.errors import ConfigError
from bench.knobs import check
from bench.mismatch import length_buckets, mismatch_metrics
from bench.moe import is_moe
from bench.models import fill_measure_defaults, load_model, load_tokenizer, render_prompt, resolve_model, weights_hash
from bench.kernels import cpu_kernel_path
from bench.precision import Precision
from bench.problems import SourceSpec, load_problems
from bench.router_metrics import at_positions, router_metrics
from bench.routes import TrainRoutes, pad_routes, routed
from bench.store import MismatchReport, bench_home, get_or_create_model, session

from .logprobs import pack, response_logprobs
from .pair_scoring import compute_copy, rollout_passes
from .rollouts import sampled_logprobs
from .plan import check_cascade, check_router_replay
from .mismatch_config import MismatchConfig  # noqa: F401  (re-exported: the old home)


def conditions(cfg: MismatchConfig, max_tokens: int) -> dict:
    """What a report's numbers depend on besides the model, the pair and the source: the rollout
    engine, the problems (limit), responses per problem (n), the response budget, the device, on
    a CPU its 16-bit kernel path (`cpu_kernel_path()`: which instructions bench's kernels take,
    so an fp16 or bf16 pair is computed differently on another kind of CPU; None on a GPU), and
    the decode attention where it is not the plain one ("cascade")."""
    on_cpu = str(cfg.device).startswith("cpu")
    return {"engine": cfg.engine, "limit": cfg.limit, "n": cfg.n, "max_tokens": max_tokens, "device": cfg.device,
            "cpu_16bit": cpu_kernel_path() if on_cpu else None,
            "attention": "cascade" if cfg.cascade_attention else None}


def _score(model, tok, prompts: list[str], samples, batch: int, device="cpu", replay: bool = False):
    """π log-probs of the sampled tokens [N, T] (padded), μ [N, T], the mask, and for an MoE
    model whose samples carry routes the router metrics (bench/router_metrics.py; `replay`:
    the scoring forward uses the rollout's routes, bench/routes.py), else {}; the model runs on
    `device`, the results come back to the CPU."""
    pids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    flat = [(pids[i], s) for i, row in enumerate(samples) for s in row]
    t_max = max(1, max(len(s.token_ids) for _, s in flat))
    mu = sampled_logprobs([s for _, s in flat], t_max)
    pi = torch.zeros(len(flat), t_max)
    mask = torch.zeros(len(flat), t_max)
    moe = is_moe(model) and all(s.routes is not None for _, s in flat)
    if replay and not moe:
        raise ConfigError("--router-replay needs a mixture-of-experts model and --engine torch (which records "
                          "the experts it chose)")
    got: list[tuple[torch.Tensor, torch.Tensor]] = []          # (rollout, trainer) routes at the scored positions
    for start in range(0, len(flat), batch):
        part = flat[start:start + batch]
        ids, attn, tk, pos, m = pack([p for p, _ in part], [s.token_ids for _, s in part], tok.pad_token_id)
        session = None
        if moe:
            session = TrainRoutes(model, *ids.shape)
            rollout = pad_routes([s.routes for _, s in part], ids.shape[1], len(session.gates), session.k)
            session.replay = rollout if replay else None
        with torch.no_grad(), routed(session):
            lp = (response_logprobs(model, *(t.to(device) for t in (ids, attn, tk, pos))) * m.to(device)).cpu()
        w = m.shape[1]
        pi[start:start + len(part), :w] = lp
        mask[start:start + len(part), :w] = m
        if session is not None:
            pad = torch.zeros(len(part), t_max - w, dtype=torch.long)
            full = torch.cat([pos, pad], dim=1)
            got.append((at_positions(rollout, full), at_positions(session.chosen, full)))
    router = {}
    if got:
        router = router_metrics(torch.cat([a for a, _ in got]), torch.cat([b for _, b in got]), mu, pi, mask)
        router = {k: (None if v != v else v) for k, v in router.items()}           # an empty group: null
    return mu, pi, mask, router


def _plots(mu, pi, mask, out: Path, title: str) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    sel = mask.bool()
    p_mu, p_pi = mu[sel].exp().numpy(), pi[sel].exp().numpy()
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(p_mu, p_pi, s=2, alpha=0.3)
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8)
    ax.set(xlabel="μ (rollout engine)", ylabel="π (training engine)", title=f"token probabilities — {title}")
    scatter = out / "token_scatter.png"
    fig.savefig(scatter, dpi=110, bbox_inches="tight")
    plt.close(fig)
    lengths = mask.sum(-1).numpy()
    lr = ((pi - mu) * mask).sum(-1).numpy()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(lengths, lr, s=4, alpha=0.4)
    if np.ptp(lengths) > 0:
        k, b = np.polyfit(lengths, lr, 1)
        xs = np.linspace(lengths.min(), lengths.max(), 50)
        ax.plot(xs, k * xs + b, color="red", label=f"slope {k * 1000:.3g} per 1k tokens")
        ax.legend()
    ax.set(xlabel="response length (tokens)", ylabel="log π(y)/μ(y)", title=f"sequence log-ratio — {title}")
    line = out / "log_ratio_vs_length.png"
    fig.savefig(line, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return {"token_scatter": str(scatter), "log_ratio_vs_length": str(line)}


def _scored_pairs(ref, tok, prompts, base, pairs, engine: str, n: int, sampling: Sampling, batch: int,
                  device: str = "cpu", threads: int | None = None, replay: bool = False, cascade: bool = False):
    """(pair, μ, π, mask, router metrics) for every pair: one rollout pass per rollout format
    (from a copy of the fp32 `base`, decoding with the cascade attention when `cascade`), shared
    by its training formats, each scored by a fresh compute copy (with the rollout's routes when
    `replay`)."""
    torch_kw = {"tokenizer": tok, "threads": threads, "device": device, "record_routes": True,
                **({"cascade_attention": True} if cascade else {})}
    with closing(rollout_passes(engine, ref.path, base, pairs, torch_kw=torch_kw)) as passes:
        for eng, mine in passes:
            samples = eng.generate(prompts, n, sampling)
            eng.close()                            # its memory back before the scoring copies (closing twice is fine)
            for pair in mine:
                yield (pair, *_score(compute_copy(base, pair, device), tok, prompts, samples, batch, device, replay))


def nonfinite_counts(mu: torch.Tensor, pi: torch.Tensor, mask: torch.Tensor) -> dict:
    """{"nonfinite_mu", "nonfinite_pi"}: response tokens whose log-probability is not finite on
    each side (a format whose activations overflow, e.g. fp16 on Gemma 3: every metric over them
    is NaN, and the report says why)."""
    on = mask.bool()
    return {"nonfinite_mu": int((~torch.isfinite(mu) & on).sum()),
            "nonfinite_pi": int((~torch.isfinite(pi) & on).sum())}


def analyse(store, cfg: MismatchConfig, pairs: list[Precision], progress=None) -> list[dict]:
    """Run the analysis for every pair; one rollout pass per rollout dtype, shared by the
    training dtypes. Each report is stored (mismatch_reports) and returned."""
    check(cfg)                          # every knob within its bounds: one ConfigError naming it
    ref = resolve_model(cfg.model)
    if cfg.router_replay:               # refused before the model is loaded
        check_router_replay(ref, cfg.engine)
    if cfg.cascade_attention:
        check_cascade(ref, cfg.engine)
    tok = load_tokenizer(ref)
    cfg = fill_measure_defaults(replace(cfg), ref)
    problems = load_problems(SourceSpec(cfg.source, limit=cfg.limit, seed=cfg.seed))
    prompts = [render_prompt(ref, tok, p.problem) for p in problems]
    sampling = Sampling(1.0, 1.0, cfg.max_tokens, cfg.seed)
    cond = conditions(cfg, sampling.max_tokens)
    base = load_model(ref, torch.float32).to(cfg.device)
    out_root = Path(cfg.out or bench_home() / "mismatch" / ref.name.replace("/", "_"))
    reports = []
    for pair, mu, pi, mask, router in _scored_pairs(ref, tok, prompts, base, pairs, cfg.engine, cfg.n, sampling,
                                                    cfg.batch, cfg.device, cfg.threads, cfg.router_replay,
                                                    cfg.cascade_attention):
        metrics = {**mismatch_metrics(mu, pi, mask), "tokens": int(mask.sum().item()), **nonfinite_counts(mu, pi, mask),
                   "length_buckets": length_buckets(mu, pi, mask)}
        if router:
            metrics.update(router, router_replay=float(cfg.router_replay))
        plots = _plots(mu, pi, mask, out_root / f"{pair.rollout}-{pair.train}", pair.name)
        with session(store) as s:
            m = get_or_create_model(s, ref.name, ref.path, weights_hash(ref))
            s.add(MismatchReport(model_id=m.id, rollout_dtype=pair.rollout, train_dtype=pair.train,
                                 source=cfg.source, metrics=metrics, plots=plots, **cond))
        reports.append({"rollout": pair.rollout, "train": pair.train, **metrics, "plots": plots,
                        "conditions": cond})
        if progress:
            progress(pair, metrics)
    return reports


def step0_pairs(pairs: list[Precision], prompts_n: int = 16, n: int = 4, seed: int = 0,
                max_tokens: int = 64, model: str = "tiny-math", engine: str = "torch") -> list[dict]:
    """The step-0 mismatch of each pair on `prompts_n` synthetic-hard problems × `n` samples
    (T = 1), nothing stored: {pair, tokens, k3, abs_dlogp, differ}, where `differ` is the share
    of sampled tokens whose log-probability differs between the engines at all (0: the pair
    computes bit for bit alike, its mismatch is absent rather than measured)."""
    ref = resolve_model(model)
    tok = load_tokenizer(ref)
    problems = load_problems(SourceSpec("synthetic-hard", limit=prompts_n, seed=seed))
    prompts = [render_prompt(ref, tok, p.problem) for p in problems]
    rows = []
    for pair, mu, pi, mask, _ in _scored_pairs(ref, tok, prompts, load_model(ref, torch.float32), pairs, engine, n,
                                               Sampling(1.0, 1.0, max_tokens, seed), 256):
        sel = mask.bool()
        rows.append({"pair": pair.name, "tokens": int(sel.sum()), "k3": mismatch_metrics(mu, pi, mask)["kl_k3"],
                     "abs_dlogp": float((pi - mu)[sel].abs().mean()), "differ": float((pi != mu)[sel].float().mean())})
    return rows
