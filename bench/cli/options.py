"""Typer options generated from the config dataclasses' knobs (bench/knobs.py), and the choices
the commands share as enums.

    @app.command()
    @knob_options(RunConfig, defaults=preset_values)
    def run(..., knobs: dict = None): ...

adds one option per knob of RunConfig (`--max-steps`, `--lr`, ...; and of its nested StopConfig:
`--futility`, ...) to the command: the flag is
the field's name with dashes, the help its help with the unit, the bound and the default
appended; a bool knob is a `--x/--no-x` switch. Every generated option defaults to None
("not given"), and the command receives them as one dict `knobs` {field: value or None}, so
the preset's value stays wherever a flag is not given. Bounds are checked by the config's own
check (bench/knobs.py `check`) before anything is written, with one message naming the flag.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from enum import Enum
from typing import Callable, Optional

import typer

from bench.knobs import base_type, bound_text, cli_knobs, flag_of, types_of


class Trainer(str, Enum):
    native = "native"
    verl = "verl"


class Engine(str, Enum):
    """A rollout engine (bench/engines): auto takes vllm when it is importable, else torch."""

    torch = "torch"
    vllm = "vllm"
    auto = "auto"


ENGINE_OPT = typer.Option(Engine.torch, help="Rollout engine (auto: vllm when importable, else torch).")
SOURCE_OPT = typer.Option(None, help="Problems (any `bench build --source`; default: synthetic-hard for the embedded "
                          "models, a named or warmed real model's own, arithmetic).")


class Preset(str, Enum):
    """runners/presets.py PRESETS (tests/bench/cli/test_cli_knobs.py keeps the two in step)."""

    tiny = "tiny"
    paper = "paper"
    small = "small"


DEVICE_METAVAR = "[auto|cpu|cuda|cuda:i]"


def parse_device(value: str) -> str:
    """`auto`, `cpu`, `cuda` or `cuda:i`, checked for its form while parsing (a usage error,
    exit 2); whether this machine has that device is bench/device.py's `resolve_device`."""
    import re

    text = str(value).strip().lower()
    if text in ("auto", "cpu") or re.fullmatch(r"cuda(:\d+)?", text):
        return text
    raise typer.BadParameter(f"{value!r} is not one of auto, cpu, cuda, cuda:i")


def knob_help(f, defaults: dict[str, dict] | None = None) -> str:
    """The option's help: the knob's help, then its unit and bound, then the default (per preset
    when `defaults` {preset: {field: value}} is given and the presets differ)."""
    m = f.metadata
    text = m["help"].rstrip()
    facts = [x for x in (m.get("unit"), bound_text(f)) if x]
    if facts:
        text += f" ({'; '.join(facts)})"
    if defaults:
        values = {name: d.get(f.name) for name, d in defaults.items()}
        shown = {name: ("unset" if v is None else f"{v:g}" if isinstance(v, float) else str(v).lower()
                        if isinstance(v, bool) else str(v)) for name, v in values.items()}
        if len(set(shown.values())) == 1:
            if not (set(values.values()) == {None} and "default" in m["help"].lower()):   # the help says it
                text += f" Default: {next(iter(shown.values()))}."
        else:
            text += " Default: " + ", ".join(f"{v} ({name})" for name, v in shown.items()) + "."
    return text


def knob_options(cls, *, defaults: dict[str, dict] | None = None, exclude: tuple[str, ...] = (),
                 replace: dict[str, tuple[object, object]] | None = None, panel: str | None = None,
                 before: str | None = "db") -> Callable:
    """Decorate a command so that it takes one option per CLI knob of `cls` (module doc).
    `replace` {field: (annotation, typer.Option)} gives a knob another option on this command
    (e.g. `bench sweep --staleness 0,1,2`, an axis); `exclude` leaves knobs out; the generated
    options go before the parameter named `before` (else last) and, with `panel`, under that
    heading of `--help`. Without `defaults`, the help shows the dataclass's own defaults."""
    replace = replace or {}
    if defaults is None:
        defaults = {cls.__name__: {f.name: f.default for f in dataclasses.fields(cls)
                                   if f.default is not dataclasses.MISSING}}

    def decorate(fn):
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        own = [p.replace(annotation=hints.get(p.name, p.annotation), kind=inspect.Parameter.KEYWORD_ONLY)
               for p in sig.parameters.values() if p.name != "knobs"]
        names, generated = [], []
        for owner, f in cli_knobs(cls):
            if f.name in exclude:
                continue
            names.append(f.name)
            if f.name in replace:
                annotation, option = replace[f.name]
            else:
                typ, _ = base_type(types_of(owner)[f.name])
                decls = [f"--{flag_of(f)}/--no-{flag_of(f)}"] if typ is bool else [f"--{flag_of(f)}"]
                option = typer.Option(None, *decls, help=knob_help(f, defaults), show_default=False,
                                      rich_help_panel=panel)
                annotation = Optional[typ]
            generated.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                               annotation=annotation))
        at = next((i for i, p in enumerate(own) if p.name == before), len(own))
        params = own[:at] + generated + own[at:]

        @functools.wraps(fn)
        def command(**kwargs):
            knobs = {name: kwargs.pop(name) for name in names}
            return fn(**kwargs, knobs=knobs)

        del command.__wrapped__            # Typer reads the signature below, not fn's
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate
