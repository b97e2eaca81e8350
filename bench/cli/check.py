"""`bench check`: the training–inference consistency gate for CI (runners/check.py measures,
bench/contract.py judges, bench/junit.py reports). Exit 0 when every pair meets its contract,
1 when a line breaks (each named), 2 on bad input."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from bench.cli import DB_OPT, _store, app, console, fail, out
from bench.cli.options import DEVICE_METAVAR, ENGINE_OPT, SOURCE_OPT, Engine, knob_options, parse_device
from bench.model_sources import MODEL_HELP
from runners.check_config import CheckConfig

CONTRACTS = Path(__file__).resolve().parent.parent / "data" / "contracts"     # shipped: <model>.toml


def shipped_contract(model: str, engine: str) -> Path | None:
    """The contract bench ships for a model (tiny-math or a named real one) and engine (bench/data/contracts)."""
    p = CONTRACTS / f"{model}.{engine}.toml"
    return p if p.is_file() else None


@app.command()
@knob_options(CheckConfig, panel="Check settings (CheckConfig)", before="contract")
def check(model: str = typer.Option("tiny-math", help=MODEL_HELP),
          dtype: Optional[str] = typer.Option(None, help="Pairs: fp16, rollout=fp8,train=fp16, a list separated by "
                                              "';' (or ',' for plain names), all (35 pairs), all16 or ladder (every "
                                              "rung → fp32). Default: all where the contract judges all 35, else "
                                              "the contract's pairs (with --derive-contract: all)."),
          engine: Engine = ENGINE_OPT,
          source: Optional[str] = SOURCE_OPT,
          contract: Optional[Path] = typer.Option(None, help="The tolerance contract (TOML; default: the one bench "
                                                  "ships for the model: tiny-math, smollm2-135m, gemma3-270m). With "
                                                  "--derive-contract: where to write it."),
          derive_contract: Optional[int] = typer.Option(None, min=1, help="Measure the pairs this many times "
                                                        "(seeds seed … seed+N−1), which you trust, and write a "
                                                        "contract from them to --contract instead of checking; an "
                                                        "existing file is widened, not replaced (derive on each kind "
                                                        "of machine the check runs on)."),
          junit: Optional[Path] = typer.Option(None, help="Write JUnit XML here (a test case per pair × line)."),
          out_dir: Optional[Path] = typer.Option(None, "--out", help="Layer plots; default $BENCH_HOME/check/<model>."),
          device: str = typer.Option("auto", parser=parse_device, metavar=DEVICE_METAVAR,
                                     help="Both engines' device: auto (cuda when available), cpu, cuda, cuda:i."),
          as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
          db: Optional[str] = DB_OPT, knobs: dict = None):
    """Step-0 consistency of the rollout and training engines at each pair, judged by a tolerance
    contract: sampled-token and full-vocabulary KL, a noise floor, buffers and where the
    mismatch enters, per layer. Exit 0: every line holds; 1: a line broke; 2: bad input."""
    from bench import contract as contracts
    from bench.device import resolve_device
    from bench.engines import resolve_engine
    from bench.knobs import check as check_knobs
    from bench.models import resolve_model
    from bench.precision import parse_list
    from bench.store import bench_home

    cfg = check_knobs(CheckConfig(model=model, source=source, engine=resolve_engine(engine.value),
                                  **{k: v for k, v in knobs.items() if v is not None}))
    cfg.device = resolve_device(device)
    ref = resolve_model(model)
    plots = out_dir or bench_home() / "check" / Path(model).name
    # what it measures on: as given, else as the contract was derived, else the model's defaults
    given = {k: source if k == "source" else knobs.get(k) for k in contracts.MEASURED}
    if derive_contract is not None:
        if contract is None:
            fail("--derive-contract N writes a contract: give --contract FILE for where")
        existing = contracts.load(contract) if contract.is_file() else None    # a bad file: refused before measuring
        _measure_as(cfg, ref, given, existing)
        if existing is not None and existing.measured and existing.measured != _measured(cfg):
            fail(f"{contract} was derived on {existing.measured}, these repeats would measure {_measured(cfg)}: "
                 "derive with the same --prompts, --n, --max-tokens and --source, or into another file")
        _derive(cfg, parse_list(dtype or "all"), derive_contract, contract, existing, plots, as_json)
        return
    path, terms = _contract_for(model, cfg.engine, contract, dtype)
    pairs = parse_list(dtype) if dtype else _contract_pairs(terms)
    _measure_as(cfg, ref, given, terms)
    if (terms.model, terms.engine) != (Path(model).name, cfg.engine):
        fail(f"{path} is the contract of {terms.model or '?'} with the {terms.engine or '?'} engine, not of "
             f"{Path(model).name} with the {cfg.engine} engine: give the contract derived for this model and engine")
    store = _store(db)
    t0 = time.time()
    results = _measure(cfg, pairs, plots, as_json)
    seconds = time.time() - t0
    report = _judge(terms, results)
    conditions = _conditions(cfg, path, terms)
    _store_report(store, cfg, report, conditions)
    if junit is not None:
        from bench.junit import junit_xml, write

        write(junit, junit_xml([v for r in report for v in r["verdicts"]], conditions, seconds,
                               {r["pair"]: r["enters"] for r in report}))
    ok = all(r["ok"] for r in report)
    _emit(report, terms, path, seconds, conditions, ok, as_json)
    raise typer.Exit(0 if ok else 1)


def _contract_for(model: str, engine: str, contract: Optional[Path], dtype: Optional[str]):
    """The contract a check judges by, as (path, terms): the one given, else the one bench ships
    for the model and engine; refused (exit 2) when there is none, or when it judges no pair and
    no --dtype names any."""
    from bench import contract as contracts

    path = contract or shipped_contract(Path(model).name, engine)
    if path is None:
        fail(f"bench ships no contract for {model} with the {engine} engine: give --contract FILE, or write one "
             f"from pairs you trust with `bench check --model {model} --dtype PAIRS --derive-contract 5 --contract "
             "FILE`")
    terms = contracts.load(path)
    if not dtype and not terms.pairs:
        fail(f"{path} judges no pair: a contract needs [pairs.NAME] tables of lines (or give --dtype: each pair "
             "then fails closed)")
    return path, terms


def _emit(report: list, terms, path: Path, seconds: float, conditions: dict, ok: bool, as_json: bool) -> None:
    """Print the check's result: JSON (--json) or the per-pair table."""
    if as_json:
        out.print_json(json.dumps({"ok": ok, "seconds": seconds, "conditions": conditions,
                                   "pairs": [{**r, "verdicts": [_verdict_dict(v) for v in r["verdicts"]]}
                                             for r in report]}, default=str))
    else:
        _print(report, terms, path, seconds)


def _measure_as(cfg, ref, given: dict, terms) -> None:
    """Set what `cfg` measures on where the user gave nothing (`given` None): as the contract
    `terms` was derived (its `measured`), else the model's defaults (bench/models.py)."""
    from bench.models import fill_measure_defaults
    from runners.check import OTHERWISE_TOKENS

    for key, value in (terms.measured if terms is not None else {}).items():
        if given.get(key) is None:
            setattr(cfg, key, value)
    fill_measure_defaults(cfg, ref, OTHERWISE_TOKENS)


def _measured(cfg) -> dict:
    from bench.contract import MEASURED

    return {k: getattr(cfg, k) for k in MEASURED}


def _contract_pairs(terms) -> list:
    """`all` where the contract judges each of its 35 pairs, else the pairs it judges."""
    from bench.precision import Precision, parse_list

    every = parse_list("all")
    if all(p.name in terms.pairs for p in every):
        return every
    return [Precision.parse(name) for name in terms.pairs]


def _measure(cfg, pairs, plots: Path, quiet: bool):
    from runners.check import measure

    def progress(r):
        if not quiet:
            console.print(f"  measured {r.pair.name}: k3 {r.metrics['kl_k3']:.2e}", highlight=False)

    return measure(cfg, pairs, out_dir=plots, progress=progress)


def _judge(terms, results) -> list[dict]:
    from bench.contract import judge_pair
    from runners.check import judged_values, where_it_enters

    report = []
    for r in results:
        verdicts = judge_pair(terms, r.pair.name, judged_values(r))
        broken = [v for v in verdicts if not v.ok]
        report.append({**r.to_dict(), "verdicts": verdicts, "ok": not broken,
                       "enters": where_it_enters(r, broken)})
    return report


def _verdict_dict(v) -> dict:
    return {"metric": v.metric, "value": v.value, "judgment": None if v.line is None else v.line.judgment,
            "bound": None if v.line is None else v.line.bound, "ok": v.ok, "reason": v.reason}


def _conditions(cfg, path: Path, terms) -> dict:
    from bench.kernels import cpu_kernel_path

    vllm = None
    if cfg.engine == "vllm":
        import vllm as _vllm

        vllm = _vllm.__version__
    return {"model": cfg.model, "engine": cfg.engine, "source": cfg.source, "prompts": cfg.prompts, "n": cfg.n,
            "max_tokens": cfg.max_tokens, "seed": cfg.seed, "device": cfg.device,
            "cpu_16bit": cpu_kernel_path() if str(cfg.device).startswith("cpu") else None, "vllm": vllm,
            "contract": str(path), "contract_digest": terms.digest()}


def _store_report(store, cfg, report: list[dict], conditions: dict) -> None:
    from bench.models import resolve_model, weights_hash
    from bench.store import CheckReport, get_or_create_model, session

    ref = resolve_model(cfg.model)
    with session(store) as s:
        m = get_or_create_model(s, ref.name, ref.path, weights_hash(ref))
        s.add(CheckReport(model_id=m.id, engine=cfg.engine, ok=all(r["ok"] for r in report),
                          contract_digest=conditions["contract_digest"], conditions=conditions,
                          pairs=[{**{k: v for k, v in r.items() if k != "verdicts"},
                                  "verdicts": [_verdict_dict(v) for v in r["verdicts"]]} for r in report]))


def _print(report: list[dict], terms, path: Path, seconds: float) -> None:
    t = Table("pair", "lines", "broken", "k3", "kl full", "noise μ / π", "where it enters")
    for r in report:
        m = r["metrics"]
        broken = [v for v in r["verdicts"] if not v.ok]
        full = "-" if m["kl_full"] is None else f"{m['kl_full']:.2e}"
        t.add_row(r["pair"], str(len(r["verdicts"])), "[green]0[/]" if not broken else f"[red]{len(broken)}[/]",
                  f"{m['kl_k3']:.2e}", full, f"{m['noise_rollout']:.2g} / {m['noise_train']:.2g}", r["enters"] or "-")
    out.print(t)
    for r in report:
        for v in (v for v in r["verdicts"] if not v.ok):
            out.print(f"FAIL {r['pair']} {v.metric}: {v.reason}", highlight=False)
        for f in r["flags"]:
            out.print(f"WARN {r['pair']}: {f}", highlight=False)
    lines = sum(len(r["verdicts"]) for r in report)
    broken = sum(not v.ok for r in report for v in r["verdicts"])
    out.print(f"{len(report)} pair(s), {lines} contract lines, {broken} broken, in {seconds:.1f} s; contract {path} "
              f"(digest {terms.digest()}{', ' + terms.derived if terms.derived else ''})", highlight=False)


def _derive(cfg, pairs, repeats: int, path: Path, existing, plots: Path, quiet: bool) -> None:
    from dataclasses import replace
    from datetime import date

    from bench import contract as contracts
    from runners.check import judged_values

    if existing is not None and (existing.model, existing.engine) != (Path(cfg.model).name, cfg.engine):
        raise contracts.ContractError(f"{path} is the contract of {existing.model}/{existing.engine}: derive "
                                      f"{Path(cfg.model).name}/{cfg.engine} into another file")
    runs: dict[str, list[dict]] = {}
    for k in range(repeats):
        for r in _measure(replace(cfg, seed=cfg.seed + k), pairs, plots, quiet):
            runs.setdefault(r.pair.name, []).append(judged_values(r))
    how = (f"{date.today().isoformat()}: {repeats} repeat(s) (seeds {cfg.seed}-{cfg.seed + repeats - 1}) of "
           f"{cfg.prompts} problems x {cfg.n}, bound = {cfg.margin:g} x the largest deviation")
    from bench.kernels import cpu_kernel_path

    if str(cfg.device).startswith("cpu"):
        how += f", CPU 16-bit path {cpu_kernel_path()}"
    terms = contracts.derive(runs, cfg.margin, Path(cfg.model).name, cfg.engine, how, measured=_measured(cfg))
    if existing is not None:
        terms = contracts.widen(existing, terms)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(contracts.dumps(terms))
    out.print(f"wrote {path}: {sum(len(v) for v in terms.pairs.values())} lines for {len(terms.pairs)} pair(s) "
              f"({how})", highlight=False)
