"""What else changed: a stored run config against the defaults of its preset (`diff`), and the
settings on which several cells' configs differ (`spread`, with bench/fingerprint.py's
NOT_SETTINGS: what tells their cells apart).

Pure dict functions shared by the CLI (which knows the presets) and the leaderboard (which
reads the preset's defaults as the run stored them, in `runs.provenance["preset_defaults"]`)."""

from __future__ import annotations

ABSENT = "(absent)"
NOT_SETTINGS = ("preset", "verl")       # the preset's name and the verl job description


def leaves(value, prefix: str = "") -> dict:
    """Dotted key → leaf value (lists of dicts by index: benchmarks[0].source)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(leaves(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def diff(defaults: dict, config: dict) -> list[tuple[str, object, object]]:
    """[(key, default, run value), ...] for every leaf of `config` (or of `defaults`) that
    differs; both as stored (JSON: tuples are lists)."""
    return [(k, v["defaults"], v["run"]) for k, v in spread({"defaults": defaults, "run": config})]


def spread(configs: dict[str, dict], ignore: tuple[str, ...] = NOT_SETTINGS) -> list[tuple[str, dict[str, object]]]:
    """[(key, {name: value, ...}), ...] for every leaf on which the named configs do not all
    agree (a leaf one of them lacks reads ABSENT there), top-level keys in `ignore` left out; the
    keys in the order they first appear. Two configs: the same keys as `diff`."""
    flat = {name: leaves({k: v for k, v in (c or {}).items() if k not in ignore}) for name, c in configs.items()}
    keys = list(dict.fromkeys(k for f in flat.values() for k in f))
    out = []
    for k in keys:
        values = {name: f.get(k, ABSENT) for name, f in flat.items()}
        first = next(iter(values.values()))
        if any(v != first for v in values.values()):
            out.append((k, values))
    return out
