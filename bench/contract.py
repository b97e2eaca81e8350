"""The tolerance contract of `bench check`: per precision pair and metric, a judgment and its
threshold, in a versioned TOML file; and the verdict of measured values against it.

    version = 1
    model = "tiny-math"
    engine = "torch"
    margin = 4.0
    derived = "…how and when…"

    [measured]                      # optional: what it was derived on, a check's defaults
    prompts = 32
    n = 4

    [pairs."fp16"]
    kl_k3 = { judgment = "bound", bound = 1.2e-06 }
    noise_rollout = { judgment = "bitwise" }
    "layer:layers.0.mlp" = { judgment = "bound", bound = 1.3e-03 }

Each line judges a metric's deviation from its ideal, |value − ideal| (the ideal is 0 but for
`token_mult_prob_error`, mean exp|Δ log p|, whose ideal is 1; signed metrics such as
`kl_k1_token` are judged by their size). Judgments: `bitwise` — the deviation must be exactly 0:
the pair claims invariance; `bound` — deviation ≤ bound (NaN fails): the pair claims parity
within the bound. The
contract fails closed: a measured metric with no line for its pair fails, as does a line whose
metric was not measured (`not measured`). `derive` writes a contract from repeats of pairs a
user trusts: a metric 0 in every repeat is `bitwise`, any other gets bound = margin × its
largest deviation. runners/check.py defines the metrics. `measured` records what the repeats
measured on (problems, responses, length, source): a maximum over more tokens is larger, so a
check against the contract measures on the same unless told otherwise.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from bench.errors import BenchError

VERSION = 1
JUDGMENTS = ("bitwise", "bound")
MEASURED = {"prompts": int, "n": int, "max_tokens": int, "source": str}     # what `measured` may hold
LAYER = "layer:"                    # prefix of a per-layer divergence line
IDEAL = {"token_mult_prob_error": 1.0}  # a metric's value when the engines agree bit for bit (else 0)


def deviation(metric: str, value: float) -> float:
    """|value − ideal|: what a line judges."""
    return abs(value - IDEAL.get(metric, 0.0))


class ContractError(BenchError, ValueError):
    """A contract file that cannot be read or is not version 1; the message says what is wrong."""


@dataclass(frozen=True)
class Line:
    judgment: str                   # bitwise | bound
    bound: float | None = None      # bound only


@dataclass
class Contract:
    model: str
    engine: str
    pairs: dict[str, dict[str, Line]]           # pair display name → metric → line
    margin: float | None = None
    derived: str = ""
    version: int = VERSION
    measured: dict = field(default_factory=dict)      # what the repeats measured on (MEASURED)

    def digest(self) -> str:
        """sha256 of the contract's TOML text (what a stored result names)."""
        return hashlib.sha256(dumps(self).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Verdict:
    pair: str
    metric: str
    value: float | None
    line: Line | None
    ok: bool
    reason: str = ""


def load(path: str | Path) -> Contract:
    """A contract from its TOML file; ContractError (bad input) for a missing file, bad TOML, another
    version, an unknown judgment or a bound that is not a finite number."""
    p = Path(path)
    if not p.is_file():
        raise ContractError(f"no contract file at {p}")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ContractError(f"{p} is not TOML: {e}") from None
    if data.get("version") != VERSION:
        raise ContractError(f"{p}: contract version {data.get('version')!r}; this bench reads version {VERSION}")
    measured = data.get("measured") or {}
    if not isinstance(measured, dict) or any(k not in MEASURED or not isinstance(v, MEASURED[k]) or
                                             isinstance(v, bool) for k, v in measured.items()):
        raise ContractError(f"{p}: `measured` holds {', '.join(MEASURED)} (integers, the source a string), got "
                            f"{measured!r}")
    pairs: dict[str, dict[str, Line]] = {}
    table = data.get("pairs") or {}
    if not isinstance(table, dict):
        raise ContractError(f"{p}: `pairs` must be a table of pairs, got {table!r}")
    for pair, lines in table.items():
        if not isinstance(lines, dict):
            raise ContractError(f"{p}: pairs.{pair} must be a table of metric lines")
        pairs[pair] = {}
        for metric, spec in lines.items():
            if not isinstance(spec, dict):
                raise ContractError(f"{p}: {pair} {metric}: write {{ judgment = \"bound\", bound = … }} or "
                                    f"{{ judgment = \"bitwise\" }}, got {spec!r}")
            judgment, bound = spec.get("judgment"), spec.get("bound")
            if judgment not in JUDGMENTS:
                raise ContractError(f"{p}: {pair} {metric}: judgment {judgment!r}; choose one of "
                                    f"{', '.join(JUDGMENTS)}")
            if judgment == "bound" and not (isinstance(bound, (int, float)) and not isinstance(bound, bool)
                                            and math.isfinite(bound) and bound >= 0):
                raise ContractError(f"{p}: {pair} {metric}: a bound line needs a finite bound >= 0, got {bound!r}")
            pairs[pair][metric] = Line(judgment, float(bound) if judgment == "bound" else None)
    return Contract(model=str(data.get("model", "")), engine=str(data.get("engine", "")), pairs=pairs,
                    margin=data.get("margin"), derived=str(data.get("derived", "")), measured=measured)


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() and k.isascii() else json.dumps(k)


def dumps(c: Contract) -> str:
    """The contract as TOML (load(dumps(c)) == c)."""
    head = ["# bench check contract (docs/check.md): what a correct engine pair shows at step 0",
            f"version = {c.version}", f"model = {json.dumps(c.model)}", f"engine = {json.dumps(c.engine)}"]
    if c.margin is not None:
        head.append(f"margin = {float(c.margin)!r}")
    if c.derived:
        head.append(f"derived = {json.dumps(c.derived)}")
    out = ["\n".join(head)]
    if c.measured:
        out.append("\n".join(["[measured]", *(f"{k} = {json.dumps(v)}" for k, v in c.measured.items())]))
    for pair, lines in c.pairs.items():
        body = [f"[pairs.{_key(pair)}]"]
        for metric, line in lines.items():
            spec = '{ judgment = "bitwise" }' if line.judgment == "bitwise" else \
                f'{{ judgment = "bound", bound = {line.bound!r} }}'
            body.append(f"{_key(metric)} = {spec}")
        out.append("\n".join(body))
    return "\n\n".join(out) + "\n"


def judge_pair(contract: Contract, pair: str, values: dict[str, float | None]) -> list[Verdict]:
    """One verdict per metric measured for `pair` and per contract line of it (module doc)."""
    lines = contract.pairs.get(pair)
    if lines is None:
        return [Verdict(pair, "(pair)", None, None, False, f"the contract has no lines for {pair} (fails closed)")]
    out = []
    for metric in list(dict.fromkeys([*values, *lines])):
        v, line = values.get(metric), lines.get(metric)
        if line is None:
            if v is not None:
                out.append(Verdict(pair, metric, v, None, False, "no contract line for this metric (fails closed)"))
            continue
        if v is None:
            out.append(Verdict(pair, metric, None, line, False, "not measured (this engine cannot give it)"))
            continue
        dev = deviation(metric, v)
        ideal = f" (ideal {IDEAL[metric]:g})" if metric in IDEAL else ""
        if line.judgment == "bitwise":
            out.append(Verdict(pair, metric, v, line, dev == 0, "" if dev == 0 else f"{v:.3g} differs from "
                               f"{IDEAL.get(metric, 0.0):g} (bitwise)"))
        else:
            ok = dev <= line.bound                                  # NaN fails
            out.append(Verdict(pair, metric, v, line, ok, "" if ok else f"{v:.4g}{ideal} beyond the bound "
                               f"{line.bound:.3g}"))
    return out


def widen(old: Contract, new: Contract) -> Contract:
    """The looser of two contracts of the same model and engine, line by line: a metric bounded
    in either keeps the larger bound (a bitwise line counts as 0), a line in only one is kept;
    for a contract derived on each kind of machine a check runs on."""
    if (old.model, old.engine) != (new.model, new.engine):
        raise ContractError(f"cannot widen a contract of {old.model}/{old.engine} with one of {new.model}/{new.engine}")
    if old.measured and new.measured and old.measured != new.measured:
        raise ContractError(f"cannot widen a contract measured on {old.measured} with repeats measured on "
                            f"{new.measured}: derive with the same --prompts, --n, --max-tokens and --source")
    pairs = {p: dict(lines) for p, lines in old.pairs.items()}
    for p, lines in new.pairs.items():
        mine = pairs.setdefault(p, {})
        for metric, line in lines.items():
            a = mine.get(metric)
            top = max(x.bound or 0.0 for x in (a, line) if x is not None)
            mine[metric] = Line("bitwise") if top == 0 else Line("bound", top)
    derived = "; ".join(x for x in (old.derived, new.derived) if x)
    return Contract(model=new.model, engine=new.engine, pairs=pairs, margin=new.margin, derived=derived,
                    measured=old.measured or new.measured)


def derive(repeats: dict[str, list[dict[str, float | None]]], margin: float, model: str, engine: str,
           derived: str, measured: dict | None = None) -> Contract:
    """A contract from repeated measurements of trusted pairs: per pair and metric measured in
    every repeat, `bitwise` where every deviation is 0, else bound = margin × the largest
    deviation (an infinite or NaN value cannot be bounded: ContractError)."""
    pairs: dict[str, dict[str, Line]] = {}
    for pair, runs in repeats.items():
        pairs[pair] = {}
        for metric in runs[0]:
            vals = [r.get(metric) for r in runs]
            if any(v is None for v in vals):
                continue
            if not all(math.isfinite(v) for v in vals):
                raise ContractError(f"{pair} {metric}: a trusted repeat measured {vals}; a contract cannot bound it")
            top = max(deviation(metric, v) for v in vals)
            pairs[pair][metric] = Line("bitwise") if top == 0 else Line("bound", margin * top)
    return Contract(model=model, engine=engine, pairs=pairs, margin=margin, derived=derived,
                    measured=dict(measured or {}))
