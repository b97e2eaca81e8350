"""The one `bench sweep` command that fills a precision grid's empty cells (the Precision grid
page): the grid's algorithm and build, its empty precision pairs as one `--dtype` list, its
seeds, and the settings its cells share, so that every run the command starts lands in a
square of that grid (the same cell key: leaderboard/cells.py).

    bench sweep --algo ALGO --build B --dtype 'fp16,bf16;rollout=fp8,train=fp16' --seeds 3
                --preset tiny --lr 0.002 ...

- `--dtype`: same-format pairs by their name, separated by `,`; each mixed pair as
  `rollout=X,train=Y` after a `;` (bench/precision.py `parse_list` reads `,` and `;` alike
  between names; a mixed pair's own comma binds); `all` when every pair of the grid is empty.
- `--seeds`: N when the grid's seeds are 0..N-1, else their list (`0,3,5`; one seed `5,`).
  The sweep skips every (cell, seed) already finished, so cells that lack some seeds are filled
  too, on either trainer.
- verl's own settings (`verl_settings`, part of the cell): one `--verl-override KEY=VALUE` each;
  its resources (`verl_resources`) are the user's cluster's and are left to the user.
- the settings: the stored run config (`{"preset": name, **asdict(RunConfig)}`) against its
  preset's defaults (kept in the run's provenance, `preset_defaults`): `--preset NAME`, then one
  flag per setting that differs, a stop rule's switch and a correction's threshold among them
  (bench/knobs.py `knob_argv`), `--benchmark SOURCE` when only the first benchmark's source
  differs. Without stored defaults every top-level setting that has a value is written out. What
  has no option (the paper's `algo.*` constants, a stop rule's constant, a setting unset where the
  preset sets it) is returned as a note, never dropped silently; a when-set knob at its default that
  the stored defaults predate is neither.

The leaderboard reads only the store, so this module does not import the CLI; tests/leaderboard/test_app.py
parses the command back with the real `bench sweep` and checks that the runs it would start have
the grid's settings fingerprint.
"""

from __future__ import annotations

import shlex

from bench.algorithms import AlgoConfig
from bench.configdiff import ABSENT, diff
from bench.fingerprint import WHEN_SET
from bench.knobs import cli_knobs, knob_argv
from bench.stop import StopConfig

# top-level keys of a stored run config that are not `bench sweep` setting flags: the preset's name
# and the verl job (their own options), the seed and K (axes: --seeds, --staleness), the nested
# configs and benchmark list (below), RunConfig's two knobs fixed at 1 (temperature, top_p) and
# verl's own overrides (--verl-override, below)
NOT_FLAGS = ("preset", "verl", "seed", "staleness", "benchmarks", "algo", "stop", "temperature", "top_p",
             "verl_settings", "verl_resources")


def dtype_list(pairs: list[tuple[str, str]], every: list[tuple[str, str]] | None = None) -> str:
    """`--dtype`'s value for the (rollout, train) `pairs`: same-format names joined by `,`, each
    mixed pair `rollout=X,train=Y` after a `;`; `all` when `pairs` is all of `every`."""
    if every is not None and len(pairs) == len(every) and set(pairs) == set(every):
        return "all"
    plain = [r for r, t in pairs if r == t]
    mixed = [f"rollout={r},train={t}" for r, t in pairs if r != t]
    return ";".join(([",".join(plain)] if plain else []) + mixed)


def seeds_text(seeds: list[int]) -> str:
    """`--seeds`' value: N for seeds 0..N-1, else the list (`0,3,5`; one seed `5,`)."""
    seeds = sorted(set(int(s) for s in seeds))
    if seeds == list(range(len(seeds))):
        return str(len(seeds))
    return ",".join(map(str, seeds)) + ("," if len(seeds) == 1 else "")


def setting_flags(config: dict, defaults: dict | None) -> tuple[list[str], list[str]]:
    """(the flags that reproduce `config`'s settings from its preset, notes on those no flag can
    give); `defaults` the preset's stored defaults (None: every top-level setting is written)."""
    flags, notes = [], []
    if config.get("preset"):
        flags += ["--preset", str(config["preset"])]
    base = defaults or {}
    for key, v in config.items():
        if key in NOT_FLAGS or isinstance(v, (dict, list)):
            continue
        if defaults is not None and key in base and base[key] == v:
            continue
        if v is None and defaults is None:
            continue                        # not given: the preset's (which sets it, if anything, to the same)
        if v is None:
            notes.append(f"`{key}` is unset in these runs (the preset's {base.get(key)!r}); no flag unsets it")
        else:
            flags += knob_argv(key, v)
    if defaults is None:
        benchmarks = config.get("benchmarks") or []
        if benchmarks and benchmarks[0].get("source"):
            flags += ["--benchmark", str(benchmarks[0]["source"])]
        notes.append("the runs stored no preset defaults: nested settings (`algo.*`, `stop.*`) are taken as "
                     "the preset's")
        return flags, notes
    nested = [(k, d, r) for k, d, r in diff({k: base.get(k) for k in ("benchmarks", "algo", "stop")},
                                            {k: config.get(k) for k in ("benchmarks", "algo", "stop")})
              if not (k == "algo.max_len" and r == config.get("max_tokens"))]      # follows --max-tokens
    if [k for k, _, _ in nested] == ["benchmarks[0].source"] and nested[0][2] is not ABSENT:
        flags += ["--benchmark", str(nested[0][2])]
        nested = []
    options = {"stop": {f.name for _, f in cli_knobs(StopConfig)},      # the stop rules' switches and the
               "algo": {f.name for _, f in cli_knobs(AlgoConfig)}}      # corrections' thresholds are options
    for k, d, r in nested:
        group, _, name = k.partition(".")
        if d is ABSENT and k in WHEN_SET and r == WHEN_SET[k]:
            continue                        # a when-set knob at its default, newer than the stored defaults
        if name in options.get(group, ()) and r is not ABSENT:
            flags += knob_argv(name, r)
        else:
            notes.append(f"`{k} = {r!r}` (the preset's {d!r}) has no option: the command starts runs of another cell")
    return flags, notes


def sweep_command(algo: str, build: str, pairs: list[tuple[str, str]], *, seeds: list[int] | None = None,
                  trainer: str = "native", engine: str = "torch", staleness: int = 0, config: dict | None = None,
                  defaults: dict | None = None,
                  every: list[tuple[str, str]] | None = None) -> tuple[str, list[str]]:
    """(the shell command line, notes): one `bench sweep` that runs `algo` at every (rollout, train)
    pair of `pairs` on `build`, with the grid's trainer, engine, staleness K, seeds and the
    settings of `config` (module doc)."""
    args = ["bench", "sweep", "--algo", algo, "--build", build, "--dtype", dtype_list(pairs, every)]
    notes = []
    if trainer != "native":
        args += ["--trainer", trainer]
        notes.append(f"--trainer {trainer}: add your cluster's --verl-python, --gpus and --nodes")
    if engine != "torch":
        args += ["--engine", engine]
    if staleness:
        args += ["--staleness", str(staleness)]
    if seeds:
        args += ["--seeds", seeds_text(seeds)]
    if config is not None:
        for o in config.get("verl_settings") or []:
            args += ["--verl-override", o]
        flags, more = setting_flags(config, defaults)
        args += flags
        notes += more
    return " ".join(shlex.quote(a) for a in args), notes
