"""A run config's settings fingerprint: which runs are seeds of one experiment.

A leaderboard cell is (model, build, algorithm, precision pair, trainer, engine, staleness K,
fingerprint); its runs differ only by their seed. The fingerprint is defined once, here:

    fingerprint(config) = first 12 hex digits of
        sha256(json.dumps(settings(config), sort_keys=True, separators=(",", ":")))

where `settings(config)` is the stored run config (`{"preset": name, **asdict(RunConfig)}`, JSON
types) without the top-level keys of `NOT_SETTINGS`, with every number written as a float
(so 1 and 1.0, or 5e-4 and 0.0005, are one value) and tuples as lists. Nested keys (algo.*,
stop.*, benchmarks[i].*) are all settings. Keys are sorted, so the order a config was written
in does not matter. `short(fp)` is what tables show (6 hex digits); the full 12 (48 bits) key
the cells, so two configs share a cell only if they are equal (a collision among even 10⁴
configs has probability ~2·10⁻⁷).

Left out (`NOT_SETTINGS`), because they are not a choice of experiment, read from the knobs'
metadata (bench/runconfig.py, `fingerprint`), never typed twice:
- the run config's own extra keys: preset (the preset's name: its values are stored key by key
  and counted) and verl (the verl job description: paths under the run's own directory, the
  command line);
- "cell" knobs, columns of the cell key of their own: seed (what tells a cell's runs apart) and
  staleness (the cell's K column);
- "resource" knobs, which say where and how fast the same run is computed, not what it computes
  (as the device, which is not in the config either): checkpoint_every, keep_checkpoints,
  threads, rollout_max_batch, gpu_memory_utilization, max_tokens_per_microbatch and
  group_by_length (the same optimizer step up to float rounding), gradient_checkpointing (a
  recompute), verl_resources (a verl run's overrides of its parallel sizes, micro-batches and
  memory: runners/verl_overrides.py; its other overrides, verl_settings, are "when-set").

The rule for a new knob (`WHEN_SET`): a knob added after runs were stored is declared
`fingerprint="when-set"` and is part of the settings only at a value other than its default
(a nested config's knob too, by its dotted path: the corrections' thresholds `algo.icepop_lo`, ...).
A stored run has no key for it and a new run at the default leaves it out: adding the knob
splits no stored cell and no published bundle's; a run at another value (other arithmetic) is a
cell of its own. A knob of "setting" (those before this rule) is part of the settings at every
value, so a run stored before such a setting existed has a fingerprint of its own (it ran other
code); `bench.configdiff` shows what differs between two cells' configs.
"""

from __future__ import annotations

import hashlib
import json

import dataclasses

from bench.knobs import knobs_where
from bench.runconfig import RunConfig

# A leaderboard cell's key, defined here once: the leaderboard groups runs by these columns
# (leaderboard/cells.py) and the sweep finds a cell's runs by them (runners/sweep.py `cell_runs`;
# the model is the build's, config_fp this module's fingerprint of runs.config).
CELL_KEY = ("model", "build", "algo", "precision", "trainer", "engine", "staleness", "config_fp")
CONFIG_EXTRAS = ("preset", "verl")      # the stored config's keys besides RunConfig's
NOT_SETTINGS = (*CONFIG_EXTRAS, *(f.name for role in ("cell", "resource") for f in knobs_where(RunConfig, "fingerprint",
                                                                                               role)))


def _when_set(cls, prefix: str = "") -> dict:
    """{dotted knob path: default} of the "when-set" knobs of `cls` and of its nested knob
    dataclasses (RunConfig.algo's thresholds are `algo.icepop_lo`, ...)."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if f.metadata.get("fingerprint") == "when-set":
            out[prefix + f.name] = default
        if f.metadata.get("nested"):
            out.update(_when_set(type(default), f"{prefix}{f.name}."))
    return out


# dotted knob path → its default, for the knobs part of the settings only when set to something else
WHEN_SET = _when_set(RunConfig)
LENGTH = 12          # hex digits that key a cell
SHOWN = 6            # hex digits a table shows


def _canonical(value):
    """JSON-typed copy: numbers (not booleans) as floats, tuples as lists, dicts recursed."""
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return str(value)


def _drop_defaults(config: dict, when_set: dict, prefix: str = "") -> dict:
    """`config` without the keys whose dotted path is in `when_set` at that default (nested dicts
    recursed)."""
    out = {}
    for k, v in config.items():
        path = f"{prefix}{k}"
        if path in when_set and _canonical(v) == _canonical(when_set[path]):
            continue
        out[k] = _drop_defaults(v, when_set, f"{path}.") if isinstance(v, dict) else v
    return out


def settings(config: dict | None, when_set: dict | None = None) -> dict:
    """The settings of a stored run config, canonical: every key but those of NOT_SETTINGS and
    those of `when_set` (default WHEN_SET: {dotted knob path: default}) at their default."""
    when_set = WHEN_SET if when_set is None else when_set
    kept = {k: v for k, v in (config or {}).items() if k not in NOT_SETTINGS}
    return _canonical(_drop_defaults(kept, when_set))


def fingerprint(config: dict | None) -> str:
    """The 12-hex-digit fingerprint of `config`'s settings (see the module docstring)."""
    text = json.dumps(settings(config), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:LENGTH]


def short(fp: str | None) -> str:
    """The fingerprint as tables show it (its first 6 hex digits)."""
    return "-" if not fp else str(fp)[:SHOWN]
