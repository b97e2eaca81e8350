"""`bench mismatch`: the offline training–inference mismatch analysis (runners/offline_mismatch.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from bench.cli import DB_OPT, _store, app, console, fail, out
from bench.cli.options import DEVICE_METAVAR, ENGINE_OPT, SOURCE_OPT, Engine, knob_options, parse_device
from runners.mismatch_config import MismatchConfig


@app.command()
@knob_options(MismatchConfig, panel="Analysis settings (MismatchConfig)", before="out_dir")
def mismatch(model: str = typer.Option("tiny-math"), dtype: str = typer.Option("all", help="A pair (fp16, "
             "rollout=fp32,train=bf16), a list of dtypes and pairs separated by ',' or ';', all (35 pairs) or "
             "all16 (the paper's nine) or ladder (every rung of the precision ladder → fp32)."),
             source: Optional[str] = SOURCE_OPT,
             engine: Engine = ENGINE_OPT,
             temperature: float = typer.Option(1.0, help="Must be 1: μ has to be the raw softmax."),
             top_p: float = typer.Option(1.0, help="Must be 1: μ has to be the raw softmax."),
             out_dir: Optional[Path] = typer.Option(None, "--out"),
             device: str = typer.Option("auto", parser=parse_device, metavar=DEVICE_METAVAR,
                                        help="Both engines' device (torch rollout engine and the training "
                                        "engine's scoring): auto (cuda when available), cpu, cuda, cuda:i."),
             as_json: bool = typer.Option(False, "--json"), db: Optional[str] = DB_OPT, knobs: dict = None):
    """Offline training–inference mismatch (the paper's Figure 2): μ from the rollout engine,
    π from the training engine, on the same sampled tokens."""
    from bench.device import resolve_device
    from bench.knobs import check
    from bench.models import fill_measure_defaults, resolve_model
    from bench.precision import Precision, parse_list
    from runners.offline_mismatch import analyse

    if temperature != 1.0 or top_p != 1.0:
        fail("bench mismatch samples at temperature 1 and top-p 1 only: otherwise μ is the log-probability of "
             "a reshaped distribution, not the model's softmax (TRL #6789, #4159)")
    cfg = check(MismatchConfig(model=model, source=source, engine=engine.value, out=out_dir,
                               **{k: v for k, v in knobs.items() if v is not None}))
    pairs = [Precision.parse(dtype)] if "=" in dtype and ";" not in dtype else parse_list(dtype)
    cfg.device = resolve_device(device)
    fill_measure_defaults(cfg, resolve_model(model))
    store = _store(db)
    reports = analyse(store, cfg, pairs, progress=lambda p, m: console.print(_pair_line(p.name, m), highlight=False))
    if as_json:
        out.print_json(json.dumps(reports))
        return
    t = Table("rollout μ", "train π", "KL k1 (nats)", "± se", "KL k1 (bits)", "k3", "mean |π−μ|", "max π−μ",
              "min π−μ", "slope /1k tok", "± se")
    for r in reports:
        t.add_row(r["rollout"], r["train"], f"{r['kl_k1']:.2e}", f"{r['kl_k1_stderr']:.1e}", f"{r['kl_k1_bits']:.2e}",
                  f"{r['kl_k3']:.2e}", f"{r['prob_abs_diff_mean']:.2e}", f"{r['prob_diff_max']:.3g}",
                  f"{r['prob_diff_min']:.3g}", f"{r['log_ratio_slope']:.3g}", f"{r['log_ratio_slope_se']:.1e}")
    out.print(t)
    lt = Table("rollout μ", "train π", "|y|", "sequences", "k3 per token", "mean ℓ", "Var ℓ", "mean |ℓ|",
               title="by response length (ℓ = Σ_t log π_t − log μ_t)")
    for r in reports:
        for b in r.get("length_buckets") or []:
            span = f"{b['min_len']}–{b['max_len'] - 1}" if b["max_len"] else f"≥ {b['min_len']}"
            lt.add_row(r["rollout"], r["train"], span, str(b["sequences"]), f"{b['k3']:.2e}",
                       f"{b['seq_log_ratio_mean']:.2e}", f"{b['seq_log_ratio_var']:.2e}", f"{b['abs_log_w']:.2e}")
    out.print(lt)
    out.print(f"plots under {Path(reports[0]['plots']['token_scatter']).parent.parent}", highlight=False)


def _pair_line(name: str, m: dict) -> str:
    """One pair's headline; where a side's log-probabilities are not finite (its activations
    overflowed the format), how many tokens, since every metric over them is NaN."""
    line = f"{name}: mean |π−μ| {m['prob_abs_diff_mean']:.2e}, KL {m['kl_k1']:.2e} nats"
    bad = [f"{m[k]} of {m['tokens']} tokens non-finite in {side}" for k, side in
           (("nonfinite_mu", "μ (rollout)"), ("nonfinite_pi", "π (training)")) if m.get(k)]
    return line + (f" — {'; '.join(bad)}: the format overflows on this model" if bad else "")
