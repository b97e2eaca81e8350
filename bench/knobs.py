"""Every knob declared once: a config dataclass field carries its help, unit and bounds in its
metadata (as TRL's `GRPOConfig` does), and everything else reads them from there:

    lr: float = knob(5e-4, help="AdamW learning rate, constant.", gt=0)

- `check(cfg)` refuses a value out of its bounds (or of the wrong type) with one `ConfigError`
  naming the knob's flag and the bound; the config's own check functions call it, so a run
  started from Python is held to the same bounds as one started from the CLI.
- bench/cli/options.py turns the fields into the Typer options of `bench run`, `bench sweep`,
  `bench build` and `bench mismatch`: the flag is the field name with dashes, its help the
  field's help with the unit and the bound appended.

Metadata keys: help (one sentence or two), unit (what the number counts: "prompts", "steps"),
ge / gt / le / lt (bounds; None values are always allowed where the field's type admits None),
finite (a float knob is a finite number unless it says finite=False: `--lr inf` is a typo, not
a run that diverges),
cli (False: not a command-line option, e.g.
nested configs or knobs that must keep their default), nested (True on a field holding a knob
dataclass whose own CLI knobs are options of the verbs that read the outer config, under their
own names: RunConfig.stop's `futility` is `bench run --futility`; `cli_knobs` lists them),
fingerprint (a run knob's part in the settings fingerprint: "setting", "resource", "cell" or "when-set",
bench/fingerprint.py), verl (True: verl's launcher or follower applies the knob).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import typing
from dataclasses import MISSING, Field, field
from functools import lru_cache

from bench.errors import ConfigError


FINGERPRINT_ROLES = ("setting", "resource", "cell", "when-set")


def knob(default=MISSING, *, help: str, unit: str | None = None, ge=None, gt=None, le=None, lt=None,
         cli: bool = True, nested: bool = False, finite: bool = True, fingerprint: str = "setting",
         verl: bool = False, default_factory=MISSING) -> Field:
    """A dataclass field with its help, unit and bounds (see the module doc)."""
    if fingerprint not in FINGERPRINT_ROLES:
        raise ValueError(f"fingerprint={fingerprint!r}: one of {FINGERPRINT_ROLES}")
    meta = {"help": help, "unit": unit, "ge": ge, "gt": gt, "le": le, "lt": lt, "cli": cli,
            "nested": nested, "finite": finite, "fingerprint": fingerprint, "verl": verl}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def flag_of(f: Field | str) -> str:
    """The command-line flag of a knob (its field, or its field's name), without the dashes: the
    name with dashes, `max_steps` → `max-steps`."""
    return (f if isinstance(f, str) else f.name).replace("_", "-")


def knob_argv(name: str, value) -> list[str]:
    """The words that give knob `name` the value `value` on a command line the knobs generate
    (bench/cli/options.py parses them back): `--flag VALUE`, a bool as `--flag` / `--no-flag`,
    a float as its repr (every digit kept). The one place a command is written from settings
    (the app's fill command)."""
    flag = flag_of(name)
    if isinstance(value, bool):
        return [f"--{flag}" if value else f"--no-{flag}"]
    return [f"--{flag}", repr(value) if isinstance(value, float) else str(value)]


def bound_text(f: Field) -> str:
    """The knob's bounds as text: `>= 1`, `> 0`, `in (0, 1]`; empty when it has none."""
    m = f.metadata
    lo = (f">= {m['ge']:g}" if m.get("ge") is not None else f"> {m['gt']:g}" if m.get("gt") is not None else None)
    hi = (f"<= {m['le']:g}" if m.get("le") is not None else f"< {m['lt']:g}" if m.get("lt") is not None else None)
    if lo and hi:
        left = "[" if m.get("ge") is not None else "("
        right = "]" if m.get("le") is not None else ")"
        a = m["ge"] if m.get("ge") is not None else m["gt"]
        b = m["le"] if m.get("le") is not None else m["lt"]
        return f"in {left}{a:g}, {b:g}{right}"
    return lo or hi or ""


@lru_cache(maxsize=None)
def types_of(cls) -> dict[str, object]:
    """The resolved annotation of every field of a config dataclass (`object` for one that names
    a type its module imports only for type checkers: a nested config, never a bounded number)."""
    ns = vars(sys.modules[cls.__module__])
    out = {}
    for f in dataclasses.fields(cls):
        try:
            out[f.name] = eval(f.type, ns) if isinstance(f.type, str) else f.type
        except NameError:
            out[f.name] = object
    return out


def base_type(annotation) -> tuple[object, bool]:
    """(the type without `None`, whether None is allowed) of an annotation such as `int | None`."""
    args = typing.get_args(annotation)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else annotation), True
    return annotation, False


def knob_fields(cls, cli_only: bool = True) -> list[Field]:
    """The declared knobs of `cls` (fields made with `knob`), in declaration order."""
    return [f for f in dataclasses.fields(cls)
            if "help" in f.metadata and (f.metadata.get("cli", True) or not cli_only)]


def cli_knobs(cls) -> list[tuple[type, Field]]:
    """(owner class, field) of every CLI knob of `cls` and of its `nested` knob dataclasses (their
    defaults' classes), in declaration order: the options a verb reading `cls` offers."""
    out = [(cls, f) for f in knob_fields(cls)]
    for f in dataclasses.fields(cls):
        if f.metadata.get("nested"):
            inner = type(f.default_factory()) if f.default_factory is not MISSING else type(f.default)
            out += cli_knobs(inner)
    return out


def check_value(cls, name: str, value, where: str = ""):
    """`value` for field `name` of `cls`, or ConfigError naming the flag and the bound."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    typ, optional = base_type(types_of(cls)[name])
    label = f"--{flag_of(f)}" if f.metadata.get("cli", True) else f"{where}{name}"
    unit = f" ({f.metadata['unit']})" if f.metadata.get("unit") else ""
    if value is None:
        if optional:
            return value
        raise ConfigError(f"{label} needs a value")
    bound = f" {bound_text(f)}" if bound_text(f) else ""
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{label} must be an integer{bound}{unit}, got {value!r}")
    if typ is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigError(f"{label} must be a number{bound}{unit}, got {value!r}")
    if typ is bool and not isinstance(value, bool):
        raise ConfigError(f"{label} must be true or false, got {value!r}")
    m = f.metadata
    if typ is float and m.get("finite", True) and not math.isfinite(value):
        raise ConfigError(f"{label} must be a finite number{bound}{unit}, got {value!r}")
    if typ in (int, float):
        bad = ((m.get("ge") is not None and not value >= m["ge"]) or (m.get("gt") is not None and not value > m["gt"])
               or (m.get("le") is not None and not value <= m["le"])
               or (m.get("lt") is not None and not value < m["lt"]))
        if bad:
            raise ConfigError(f"{label} must be {bound_text(f)}{unit}, got {value!r}")
    return value


def check(cfg, where: str = ""):
    """Refuse the first knob of `cfg` (and of its nested knob dataclasses) that is out of its
    bounds or of the wrong type; returns `cfg`."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if "help" in f.metadata:
            check_value(type(cfg), f.name, value, where)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check(value, f"{where}{f.name}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    check(item, f"{where}{f.name}[{i}].")
    return cfg


def knobs_where(cls, key: str, value) -> list[Field]:
    """The knobs of `cls` (CLI or not) whose metadata `key` is `value`, in declaration order."""
    return [f for f in knob_fields(cls, cli_only=False) if f.metadata.get(key) == value]
