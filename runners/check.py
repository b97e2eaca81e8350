"""`bench check`: the training–inference consistency of each precision pair at step 0, measured
cheaply enough for every CI run, and judged by a tolerance contract (bench/contract.py).

Per pair, with identical weights in both engines (an fp32 master, each engine's copy in its
format), the rollout engine samples `prompts × n` responses at T = 1, top-p = 1; the training
engine scores the same tokens. With d_t = log π_t − log μ_t on the sampled tokens:

    kl_k1_token             mean_t (log μ_t − log π_t)                         (verl's rollout_corr/kl)
    kl_k3                   mean_t (e^{d_t} − 1 − d_t)                         KL[μ‖π], low variance
    chi2_token              mean_t e^{2 d_t} − 1 (d clamped to ±20)            the IS weight's variance
(k1, k3 and chi2 are bench/mismatch.py's, as training logs them)
    abs_logp_diff_mean/max  mean_t / max_t |d_t|
    token_mult_prob_error   mean_t exp|d_t|                                    NeMo-RL's name
Where the rollout engine gives the distribution it drew each token from (the built-in engine:
`record_distributions`; vLLM: its top-k log-probs, the whole vocabulary up to FULL_VOCAB_UP_TO
tokens, else the top DEFAULT_TOP_K or `--vllm-logprobs`, which make these lower bounds, flagged):
    kl_full                 mean over sampled positions of Σ_v μ_v (log μ_v − log π_v)
    tok_kl_max_mean / _max  D_KL^{tok,max} of Trust Region Masking (arXiv 2512.23075): each
                            sequence's largest kl_full term, averaged / maximised over sequences
The noise floor, each side computed twice on the same input:
    noise_rollout           max |Δ log μ| between two generations with the same seeds (inf when
                            a sampled token differs): a rollout engine that does not repeat itself
    noise_train             max |Δ log π| between two scoring forwards of the same batch
    buffers                 floating-point buffers (RoPE's inv_freq, …) of either engine's model
                            that differ from the fp32 master's (bench/calibration.py)
Where the mismatch enters (built-in engine and native trainer): the output of every layer —
embedding, each attention and MLP block, the final norm, the head — on the sampled sequences
(one prefill of each engine's model, the fp32 master's the reference), as relative errors
    e_side(L) = ‖h_side(L) − h_fp32(L)‖ / ‖h_fp32(L)‖,   divergence(L) = ‖h_rollout(L) − h_train(L)‖ / ‖h_fp32(L)‖
over every prompt and response position; the contract bounds each layer's divergence
(`layer:<name>`), and a broken line names the first layer past its bound, or the buffer, or the
sampling after the head when every layer agrees (a temperature or top-p on one side).

Every metric is also reported by bucket: of response length (LENGTH_BUCKETS tokens) and of the
fp32 reference's entropy at the token (ENTROPY_BUCKETS nats): a small final gap can come from
policy saturation (miles #2722).
"""

from __future__ import annotations

import math
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from bench.calibration import buffer_mismatches
from bench.contract import LAYER
from bench.engines import Sampling
from bench.knobs import check as check_knobs
from bench.mismatch import chi2_token, kl_k1_token, kl_k3
from bench.models import fill_measure_defaults, load_model, load_tokenizer, render_prompt, resolve_model
from bench.precision import Precision
from bench.problems import SourceSpec, load_problems

from .check_config import CheckConfig
from .pair_scoring import compute_copy, rollout_passes
from .rollouts import sampled_logprobs
from .logprobs import pack, response_log_softmax

LENGTH_BUCKETS = ((1, 16), (17, 32), (33, None))            # response tokens, inclusive
ENTROPY_BUCKETS = ((0.0, 0.1), (0.1, 1.0), (1.0, None))     # nats, [lo, hi)
OTHERWISE_TOKENS = 1024      # a model with no length of its own (a directory, a hub id) is checked at this many
FULL_VOCAB_UP_TO = 4096       # vLLM: ask for every token's log-prob up to this vocabulary size (tiny-math: 85)
DEFAULT_TOP_K = 20            # else its top-k: kl_full becomes a lower bound (position_kl)
ONE_SIDED_HEAD = ("one-sided fp32 head: only one engine computes lm_head and the logits in fp32 (NeMo-RL #3936 "
                  "found a one-sided fp32 head worse than none); give both sides bf16+head32 or neither")


# ------------------------------------------------------------------ metrics (pure)

def token_metrics(mu: torch.Tensor, pi: torch.Tensor, mask: torch.Tensor,
                  dist_mu: torch.Tensor | None = None, dist_pi: torch.Tensor | None = None,
                  kl: torch.Tensor | None = None) -> dict:
    """The sampled-token metrics of the module doc over mask [N, T] (log μ, log π [N, T]); with
    the whole distributions (log-probs [N, T, V]), or their `position_kl` [N, T] already taken,
    the full-vocabulary ones too, else None."""
    m = mask.bool()
    d = (pi.double() - mu.double())[m]
    if not d.numel():
        raise ValueError("bench check needs at least one response token")
    out = {"tokens": int(d.numel()), "kl_k1_token": kl_k1_token(mu, pi, mask), "kl_k3": kl_k3(mu, pi, mask),
           "chi2_token": chi2_token(mu, pi, mask),
           "abs_logp_diff_mean": d.abs().mean().item(), "abs_logp_diff_max": d.abs().max().item(),
           "token_mult_prob_error": d.abs().exp().mean().item()}
    kl = position_kl(dist_mu, dist_pi) if kl is None else kl
    if kl is None:
        return {**out, "kl_full": None, "tok_kl_max_mean": None, "tok_kl_max": None}
    worst = kl.masked_fill(~m, -math.inf).amax(-1)[m.any(-1)]                 # per sequence with tokens
    return {**out, "kl_full": kl[m].mean().item(), "tok_kl_max_mean": worst.mean().item(),
            "tok_kl_max": worst.max().item()}


def position_kl(dist_mu: torch.Tensor | None, dist_pi: torch.Tensor | None) -> torch.Tensor | None:
    """KL(μ_t ‖ π_t) = Σ_v μ_v (log μ_v − log π_v) at every position [N, T] (float64), from
    log-prob rows [N, T, V]; None without both. A token μ gives probability 0 adds nothing.
    Where μ's rows hold only its top-k tokens (vLLM's log-probs, −inf off them) the rest of the
    vocabulary is one bucket, and by the log-sum inequality
        KL ≥ Σ_{v∈K} μ_v (log μ_v − log π_v) + r_μ log(r_μ / r_π),   r = 1 − Σ_{v∈K} p_v,
    a lower bound, exact when K is the whole vocabulary (r_μ = 0). One sequence at a time: its
    float64 temporaries are ~10 of a row's [T, V] rather than of the whole chunk's."""
    if dist_mu is None or dist_pi is None:
        return None
    if len(dist_mu) == 0:
        return _position_kl(dist_mu, dist_pi)
    return torch.cat([_position_kl(m, p) for m, p in zip(dist_mu.split(1), dist_pi.split(1))])


def _position_kl(dist_mu: torch.Tensor, dist_pi: torch.Tensor) -> torch.Tensor:
    lm, lp = dist_mu.double(), dist_pi.double()
    known = lm > -math.inf
    head = torch.where(known, lm.exp() * (lm - lp), 0.0).sum(-1)
    r_mu = (1.0 - torch.where(known, lm.exp(), 0.0).sum(-1)).clamp(min=0.0)
    r_pi = (1.0 - torch.where(known, lp.exp(), 0.0).sum(-1)).clamp(min=1e-300)
    partial = (~known).any(-1) & (r_mu > 0)          # a row with every token known has no tail (rounding aside)
    tail = torch.where(partial, r_mu * (r_mu.clamp(min=1e-300).log() - r_pi.log()), 0.0)
    return head + tail


def bucket_rows(mu, pi, mask, lengths_of: torch.Tensor, entropy: torch.Tensor, kl: torch.Tensor | None) -> dict:
    """Per bucket of response length and of the reference's entropy at the token: tokens, kl_k3,
    abs_logp_diff_mean, kl_full (None without distributions); empty buckets are left out."""
    m = mask.bool()
    d = (pi.double() - mu.double())
    length = lengths_of.unsqueeze(-1).expand_as(d)

    def row(name, sel):
        sel = sel & m
        if not sel.any():
            return None
        return {"bucket": name, "tokens": int(sel.sum()), "kl_k3": kl_k3(mu, pi, sel),
                "abs_logp_diff_mean": d[sel].abs().mean().item(),
                "kl_full": None if kl is None else kl[sel].mean().item()}

    def label(lo, hi, unit):
        return f"≥ {lo:g} {unit}" if hi is None else f"{lo:g}–{hi:g} {unit}"

    by_len = [row(label(lo, hi, "tokens"), (length >= lo) & (length <= (hi or 1 << 30))) for lo, hi in LENGTH_BUCKETS]
    by_ent = [row(label(lo, hi, "nats"), (entropy >= lo) & (entropy < (hi or math.inf))) for lo, hi in ENTROPY_BUCKETS]
    return {"length": [r for r in by_len if r], "entropy": [r for r in by_ent if r]}


# ------------------------------------------------------------------ layers

def layer_points(model) -> list[tuple[str, torch.nn.Module]]:
    """The modules whose outputs the layer table reads, in order: embedding, each decoder layer's
    attention and MLP (an MoE block where there is one), the final norm, the head; [] for a
    model bench cannot take apart (then no layer table)."""
    body = getattr(model, "base_model", None)
    layers = getattr(body, "layers", None)
    if body is None or layers is None or not hasattr(model, "lm_head"):
        return []
    points = [("embedding", body.embed_tokens)] if hasattr(body, "embed_tokens") else []
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        mlp = getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
        points += [(f"layers.{i}.attention", attn)] if attn is not None else []
        points += [(f"layers.{i}.mlp", mlp)] if mlp is not None else []
    if hasattr(body, "norm"):
        points.append(("final_norm", body.norm))
    return points + [("head", model.lm_head)]


@torch.no_grad()
def layer_outputs(model, ids: torch.Tensor, attn: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each layer point's output (fp32, CPU) at the non-pad positions of one prefill of
    `model` on ids/attn [N, W]; {} when the model has no layer points."""
    points = layer_points(model)
    if not points:
        return {}
    sel = attn.bool()
    got: dict[str, torch.Tensor] = {}

    def hook(name):
        def save(_mod, _inp, output):
            h = output[0] if isinstance(output, tuple) else output
            h = getattr(h, "logits", h)
            got[name] = h[sel.to(h.device)].float().cpu()
        return save

    handles = [mod.register_forward_hook(hook(name)) for name, mod in points]
    try:
        model(input_ids=ids, attention_mask=attn, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return got


def layer_table(rollout: dict, train: dict, reference: dict) -> list[dict]:
    """Per layer: the rollout side's and the training side's relative error against the fp32
    reference, ‖h_side(L) − h_fp32(L)‖ / ‖h_fp32(L)‖, and the divergence between the two sides,
    ‖h_rollout(L) − h_train(L)‖ / ‖h_fp32(L)‖ (Frobenius, fp64; 0 where the difference and the
    reference are both 0); [] without all three."""
    sums = LayerSums()
    sums.add(rollout, train, reference)
    return sums.table()


# ------------------------------------------------------------------ the measurement

@dataclass
class PairResult:
    pair: Precision
    metrics: dict                                  # name → value (None: not measured); the contract judges them
    buckets: dict = field(default_factory=dict)    # "length" / "entropy": rows of bucket_rows
    layers: list = field(default_factory=list)     # rows of layer_table
    buffers: list = field(default_factory=list)    # "rollout engine: …" / "training engine: …" lines
    flags: list = field(default_factory=list)      # warnings that judge nothing (a one-sided fp32 head)
    plot: str | None = None

    def to_dict(self) -> dict:
        return {"pair": self.pair.name, "rollout": self.pair.rollout, "train": self.pair.train,
                "metrics": self.metrics, "buckets": self.buckets, "layers": self.layers, "buffers": self.buffers,
                "flags": self.flags, "plot": self.plot}


def _noise_rollout(first, again) -> float:
    """max |Δ log μ| between two generations of the same rows (inf when a token differs, NaN when
    a log-prob is NaN: neither is a repeat)."""
    worst = 0.0
    for a, b in zip((s for row in first for s in row), (s for row in again for s in row)):
        if a.token_ids != b.token_ids:
            return math.inf
        for x, y in zip(a.logprobs, b.logprobs):
            d = abs(x - y)
            if d != d:
                return math.nan
            worst = max(worst, d)
    return worst


def _noise(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """max |a − b| over the masked positions' whole rows, where a token both give probability 0
    (−inf on both sides) counts as equal and a NaN anywhere makes the answer NaN."""
    both_zero = (a == -math.inf) & (b == -math.inf)
    d = torch.where(both_zero, 0.0, (a - b).abs())[mask.bool()]
    return d.max().item() if d.numel() else 0.0


def _padded(rows: list[torch.Tensor | None], t_max: int) -> torch.Tensor | None:
    """[N, t_max, V] log-prob rows from per-sample [T_i, V] (−inf beyond a sample's length); None
    when any is missing."""
    if not rows or any(r is None for r in rows):
        return None
    v = rows[0].shape[-1]
    out = torch.full((len(rows), t_max, v), -math.inf)
    for i, r in enumerate(rows):
        out[i, :r.shape[0]] = r
    return out


def measure(cfg: CheckConfig, pairs: list[Precision], out_dir: Path | None = None, progress=None,
            engine_hook=None, engine_for=None) -> list[PairResult]:
    """Every pair's PairResult. One rollout pass (twice: the noise floor) per rollout format,
    shared by its training formats; each training format scores with a fresh compute copy of
    the fp32 master (twice). `engine_hook(engine, rollout)`: called on each rollout engine after
    it is made (the tests inject faults there); `engine_for(rollout)`: an engine already running
    the master's weights in that format, instead of a new one (closed after its pairs)."""
    check_knobs(cfg)
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ref = resolve_model(cfg.model)
    tok = load_tokenizer(ref)
    cfg = fill_measure_defaults(replace(cfg), ref, OTHERWISE_TOKENS)
    problems = load_problems(SourceSpec(cfg.source, limit=cfg.prompts, seed=cfg.seed))
    prompts = [render_prompt(ref, tok, p.problem) for p in problems]
    sampling = Sampling(1.0, 1.0, cfg.max_tokens, cfg.seed)
    base = load_model(ref, torch.float32).to(cfg.device).eval()
    vocab = base.config.get_text_config().vocab_size
    top_k = min(vocab, cfg.vllm_logprobs or (vocab if vocab <= FULL_VOCAB_UP_TO else DEFAULT_TOP_K))
    flags_topk = ([f"kl_full and tok_kl_max are lower bounds: vLLM gave the top {top_k} of {vocab} log-probs a "
                   "position (the rest of the vocabulary as one bucket)"] if cfg.engine != "torch" and top_k < vocab
                  else [])
    pids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    with closing(rollout_passes(cfg.engine, ref.path, base, pairs,
                                torch_kw={"tokenizer": tok, "threads": cfg.threads, "device": cfg.device,
                                          "record_distributions": True}, vllm_kw={"top_logprobs": top_k},
                                engine_for=engine_for, engine_hook=engine_hook)) as passes:
        return [r for eng, mine in passes
                for r in _judge_rollout(base, eng, mine, prompts, pids, tok.pad_token_id, vocab, cfg, sampling,
                                        flags_topk, out_dir, progress)]


def _judge_rollout(base, eng, mine: list[Precision], prompts, pids, pad_id: int, vocab: int, cfg: CheckConfig,
                   sampling, flags_topk: list, out_dir: Path | None, progress) -> list[PairResult]:
    """The PairResults of the pairs `mine` of one rollout engine `eng`."""
    results = []
    samples = eng.generate(prompts, cfg.n, sampling)
    noise_rollout = _noise_rollout(samples, eng.generate(prompts, cfg.n, sampling))
    sides = _measure_rollout(base, eng, mine, [(pids[i], s) for i, row in enumerate(samples) for s in row],
                             pad_id, vocab, cfg.device)
    roll_buffers = buffer_mismatches(base, getattr(eng, "model", None))
    for pair in mine:
        side = sides.pairs[pair]
        lines = [f"rollout engine: {x}" for x in (roll_buffers or [])] + [
            f"training engine: {x}" for x in side.buffers]
        mu, pi, mask = sides.mu, side.pi, sides.mask
        metrics = {**token_metrics(mu, pi, mask, kl=side.kl), "noise_rollout": noise_rollout,
                   "noise_train": side.noise, "buffers": None if roll_buffers is None else float(len(lines))}
        layers = side.layers.table()
        result = PairResult(pair, metrics, bucket_rows(mu, pi, mask, mask.sum(-1), sides.entropy, side.kl),
                            layers, lines, ([ONE_SIDED_HEAD] if (pair.rollout == "bf16+head32") != (
                                pair.train == "bf16+head32") else []) + flags_topk)
        if out_dir is not None and layers:
            result.plot = plot_layers(layers, out_dir / f"{pair.rollout}-{pair.train}" / "layers.png",
                                      pair.name)
        results.append(result)
        if progress:
            progress(result)
    return results


CHUNK_BYTES = 256 << 20      # a chunk of sequences holds at most this much of each [rows, T, V] log-prob tensor


def row_chunks(n: int, t_max: int, vocab: int, budget: int | None = None) -> list[slice]:
    """Consecutive row ranges of n sequences whose [rows, t_max, vocab] fp32 log-probs each fit in
    `budget` bytes (at least one row a chunk): the whole batch at once for tiny-math's 85 tokens,
    ~10 rows a chunk for SmolLM2's 49,152 at 128 tokens, ~2 for Gemma 3's 262,144."""
    rows = max(1, (budget or CHUNK_BYTES) // max(1, t_max * vocab * 4))
    return [slice(i, min(n, i + rows)) for i in range(0, n, rows)]


class LayerSums:
    """The layer table (`layer_table`) accumulated over chunks of sequences: per layer, the sums of
    squares of the reference, of each side's difference from it and of the difference between
    the sides (fp64), so the whole batch's hidden states are never held at once; `table()` the
    square roots' ratios."""

    def __init__(self):
        self.sums: dict[str, list[float]] = {}        # name → [ref, rollout − ref, train − ref, rollout − train]

    def add(self, rollout: dict, train: dict, reference: dict) -> None:
        if not (rollout and train and reference):
            return
        for name, h in reference.items():
            h, r, t = h.double(), rollout[name].double(), train[name].double()
            acc = self.sums.setdefault(name, [0.0] * 4)
            for i, x in enumerate((h, r - h, t - h, r - t)):
                acc[i] += x.square().sum().item()

    def table(self) -> list[dict]:
        def ratio(diff, size):
            return math.sqrt(diff) / math.sqrt(size) if size > 0 else (0.0 if diff == 0 else math.inf)

        return [{"layer": name, "rollout": ratio(r, ref), "train": ratio(t, ref), "divergence": ratio(d, ref)}
                for name, (ref, r, t, d) in self.sums.items()]


@dataclass
class TrainSide:
    """One pair's training-side measurements over the rollout's batch."""

    pi: torch.Tensor                                # [N, T] log π of the sampled tokens
    kl: torch.Tensor | None                         # [N, T] KL(μ_t ‖ π_t) (None without μ's distributions)
    noise: float = 0.0                              # max |Δ log π| of two identical scoring forwards
    layers: LayerSums = field(default_factory=LayerSums)
    buffers: list = field(default_factory=list)


@dataclass
class RolloutSides:
    mu: torch.Tensor                                # [N, T] log μ of the sampled tokens
    mask: torch.Tensor                              # [N, T]
    entropy: torch.Tensor                           # [N, T] the fp32 reference's entropy at each position
    pairs: dict                                     # pair → TrainSide


def _worst(a: float, b: float) -> float:
    """max of two noise readings, NaN when either is."""
    return math.nan if a != a or b != b else max(a, b)


@torch.no_grad()
def _measure_rollout(base, eng, pairs: list[Precision], flat: list, pad_id: int, vocab: int,
                     device: str) -> RolloutSides:
    """μ and the fp32 reference of one rollout's samples `flat` [(prompt ids, sample)], and each
    pair's training side (a compute copy of `base` in its format, scored twice: the noise
    floor), one chunk of sequences at a time (`row_chunks`): per-position tensors are filled in
    by rows, the layer table summed, so memory grows with the batch by [N, T] only; one compute
    copy is held at a time (rounded again from the master for each chunk: the same weights)."""
    ids, attn, tk, pos, mask = pack([p for p, _ in flat], [s.token_ids for _, s in flat], pad_id)
    n, t_max = mask.shape
    mu = sampled_logprobs([s for _, s in flat], t_max)
    with_dist = all(s.distributions is not None for _, s in flat)
    engine_model = getattr(eng, "model", None)
    engine_model = engine_model if isinstance(engine_model, torch.nn.Module) else None
    sides = {pair: TrainSide(torch.zeros(n, t_max), torch.zeros(n, t_max, dtype=torch.float64) if with_dist else None)
             for pair in pairs}
    entropy = torch.zeros(n, t_max)
    for i, rows in enumerate(row_chunks(n, t_max, vocab)):
        dev = [t[rows].to(device) for t in (ids, attn, pos)]
        m_rows, tk_rows = mask[rows], tk[rows]
        dist_mu = _padded([s.distributions for _, s in flat[rows]], t_max)
        dist_ref = response_log_softmax(base, *dev).cpu()
        entropy[rows] = -(dist_ref.exp() * dist_ref).nan_to_num(0.0).sum(-1)
        del dist_ref
        h_ref = layer_outputs(base, *dev[:2])
        h_roll = layer_outputs(engine_model, *dev[:2]) if engine_model is not None else {}
        for pair, side in sides.items():
            model = compute_copy(base, pair, device)      # one copy at a time (made again for each chunk)
            if i == 0:
                side.buffers = buffer_mismatches(base, model)
            dist_pi = response_log_softmax(model, *dev).cpu()
            side.noise = _worst(side.noise, _noise(dist_pi, response_log_softmax(model, *dev).cpu(), m_rows))
            side.pi[rows] = dist_pi.gather(-1, tk_rows.unsqueeze(-1)).squeeze(-1) * m_rows
            if side.kl is not None:
                side.kl[rows] = position_kl(dist_mu, dist_pi)
            side.layers.add(h_roll, layer_outputs(model, *dev[:2]), h_ref)
            del dist_pi, model
    return RolloutSides(mu, mask, entropy, sides)


def plot_layers(rows: list[dict], path: Path, title: str) -> str:
    """Each side's relative error against fp32 and the divergence between them, per layer (log
    scale): where the mismatch enters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows)), 4))
    x = range(len(rows))
    floor = 1e-12                                         # a zero on a log axis
    for key, label in (("rollout", "rollout engine vs fp32"), ("train", "training engine vs fp32"),
                       ("divergence", "rollout vs training")):
        ax.plot(x, [max(r[key], floor) for r in rows], marker="o", label=label)
    ax.set_yscale("log")
    ax.set_xticks(list(x), [r["layer"] for r in rows], rotation=60, ha="right", fontsize=8)
    ax.set(ylabel="relative error ‖Δh‖ / ‖h_fp32‖", title=f"where the mismatch enters — {title}")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return str(path)


def judged_values(result: PairResult) -> dict[str, float | None]:
    """What the contract judges of one pair: its metrics (not the token count) and each layer's
    divergence as `layer:<name>`."""
    return {**{k: v for k, v in result.metrics.items() if k != "tokens"},
            **{f"{LAYER}{r['layer']}": r["divergence"] for r in result.layers}}


def where_it_enters(result: PairResult, broken: list) -> str:
    """Where a pair's broken lines say the mismatch enters: the engine that does not repeat
    itself, a buffer that differs, the first layer (in model order) past its bound, or — every
    layer within the contract while the sampled-token lines broke — the sampling after the head.
    A line whose metric this engine cannot measure is said to be so."""
    if not broken:
        return ""
    if any(v.metric == "(pair)" for v in broken):
        return "not judged: the contract has no lines for this pair"
    names = {v.metric for v in broken if v.value is not None}
    unmeasured = [v.metric for v in broken if v.value is None]
    located = []
    for side in ("rollout", "train"):
        if f"noise_{side}" in names:
            located.append(f"the {'rollout' if side == 'rollout' else 'training'} engine does not repeat itself "
                           f"(max |Δ log p| {result.metrics[f'noise_{side}']:.3g} between two identical passes)")
    if "buffers" in names:
        located.append("a buffer differs from the fp32 master's: " + "; ".join(result.buffers))
    first = next((r for r in result.layers if f"{LAYER}{r['layer']}" in names), None)
    if first is not None:
        located.append(f"the mismatch enters at {first['layer']}: the engines' outputs there differ by "
                       f"{first['divergence']:.3g} of its norm (rollout vs fp32 {first['rollout']:.3g}, training vs "
                       f"fp32 {first['train']:.3g})")
    if not located and names - {"noise_rollout", "noise_train", "buffers"}:
        located.append("after the head: every layer agrees within the contract, the sampled distribution does not "
                       "(a temperature or top-p on one side, or a different sampler)" if result.layers else
                       "not located: this engine's layers are not inspectable (vLLM's model is reached only "
                       "through its worker calls)")
    if unmeasured:
        located.insert(0, f"not measured by this engine: {', '.join(unmeasured)} (a contract line it cannot fill "
                          "fails closed)")
    return "; ".join(located)
