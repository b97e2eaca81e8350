"""The app's surface (issue 21 item 7): the viewer toolbar wherever the app is launched, the grid's
empty cells as one `bench sweep` command parsed back by the real CLI, PASS/FAIL colours, and the
Leaderboard page's chart of peak split accuracy per cell with its seed interval and the 0.95 line."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bench.cli.serve import STREAMLIT_FLAGS, streamlit_argv

ROOT = Path(__file__).parents[2]
APP = ROOT / "leaderboard" / "app.py"
CONFIG = ROOT / "leaderboard" / ".streamlit" / "config.toml"


# ------------------------------------------------------------------ the viewer toolbar

def test_bench_leaderboard_passes_the_viewer_toolbar():
    argv = streamlit_argv(APP, "sqlite:///x.db", 8555, "127.0.0.1", True)
    assert argv[argv.index("--client.toolbarMode") + 1] == "viewer"
    assert argv[-3:] == ["--", "--db", "sqlite:///x.db"] and argv[argv.index("run") + 1] == str(APP)


def test_the_shipped_config_sets_what_bench_leaderboard_passes():
    cfg = tomllib.loads(CONFIG.read_text())
    assert cfg["client"]["toolbarMode"] == "viewer"
    flat = {f"{section}.{k}": str(v).lower() if isinstance(v, bool) else str(v)
            for section, values in cfg.items() for k, v in values.items()}
    assert flat == STREAMLIT_FLAGS
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert ".streamlit/config.toml" in shipped["leaderboard"]


def test_streamlit_run_reads_the_config_beside_the_app_from_any_directory(tmp_path):
    """What `streamlit run leaderboard/app.py` does before serving (streamlit/web/cli.py sets the
    main script, then the config is parsed): from another working directory, with an empty home,
    the toolbar mode is the app's own."""
    code = ("import streamlit.config as c, sys; c._main_script_path = sys.argv[1]; "
            "c.get_config_options(force_reparse=True); print(c.get_option('client.toolbarMode'))")
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("STREAMLIT_CLIENT_TOOLBAR_MODE", None)
    got = subprocess.run([sys.executable, "-c", code, str(APP)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert got[-1] == "viewer"
    moved = tmp_path / "elsewhere" / "app.py"        # the same script without its .streamlit: the default
    moved.parent.mkdir()
    moved.write_text(APP.read_text())
    got = subprocess.run([sys.executable, "-c", code, str(moved)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert got[-1] == "auto"


# ------------------------------------------------------------------ the grid's empty cells: one sweep

def parse_sweep(command: str) -> dict:
    """The real `bench sweep` parses `command` (every option checked by Click and Typer, nothing
    run): its parameters by name."""
    import shlex

    import typer

    from bench.cli import app

    argv = shlex.split(command)
    assert argv[:2] == ["bench", "sweep"], argv
    cmd = typer.main.get_command(app).commands["sweep"]
    return cmd.make_context("sweep", argv[2:]).params


def sweep_fingerprint(params: dict) -> str:
    """The settings fingerprint of the runs a parsed sweep starts (as runners/runs.py stores them)."""
    import json
    from dataclasses import asdict

    from bench.fingerprint import fingerprint
    from bench.knobs import cli_knobs
    from runners.presets import RunConfig, get_preset

    from runners.verl_overrides import split_overrides

    knobs = {f.name: params[f.name] for _, f in cli_knobs(RunConfig) if f.name != "staleness"}
    if params.get("verl_override"):
        knobs["verl_settings"], knobs["verl_resources"] = split_overrides(params["verl_override"])
    cfg = get_preset(params["preset"].value, benchmark=params["benchmark"], **knobs)
    return fingerprint(json.loads(json.dumps({"preset": params["preset"].value, **asdict(cfg)})))


def test_dtype_list_by_hand_and_read_back_by_the_cli_parser():
    from bench.precision import ALL_PAIRS, parse_list
    from leaderboard.fill_command import dtype_list

    pairs = [("fp16", "fp16"), ("bf16+head32", "bf16+head32"), ("fp8", "fp16"), ("int8", "fp32")]
    text = dtype_list(pairs)
    assert text == "fp16,bf16+head32;rollout=fp8,train=fp16;rollout=int8,train=fp32"
    assert [(p.rollout, p.train) for p in parse_list(text)] == pairs
    assert dtype_list(pairs[2:]) == "rollout=fp8,train=fp16;rollout=int8,train=fp32"
    assert dtype_list(pairs[:2]) == "fp16,bf16+head32"
    every = [(p.rollout, p.train) for p in ALL_PAIRS]
    assert dtype_list(list(reversed(every)), every) == "all" and len(parse_list("all")) == len(every) == 35
    assert dtype_list(every[1:], every) != "all"


def test_seeds_text_by_hand_and_read_back_by_the_sweep():
    from leaderboard.fill_command import seeds_text
    from runners.sweep import parse_seeds

    for seeds, text in (([0, 1, 2], "3"), ([2, 0, 1], "3"), ([0, 3, 5], "0,3,5"), ([5], "5,"), ([0], "1"),
                        ([1, 2], "1,2")):
        assert seeds_text(seeds) == text
        assert parse_seeds(text) == sorted(seeds)


def test_every_setting_of_a_stored_config_is_a_sweep_flag():
    """The flags fill_command.py writes (a stored config's top-level settings, key with dashes) are the
    sweep's own options, and every RunConfig knob but the two axes is one of them: a knob added or
    renamed in RunConfig without its option fails here."""
    import json
    from dataclasses import asdict

    import typer

    from bench.cli import app
    from bench.knobs import flag_of, knob_fields
    from leaderboard.fill_command import NOT_FLAGS
    from runners.presets import RunConfig

    stored = json.loads(json.dumps({"preset": "tiny", **asdict(RunConfig())}))
    written = {k for k, v in stored.items() if k not in NOT_FLAGS and not isinstance(v, (dict, list))}
    options = {o for p in typer.main.get_command(app).commands["sweep"].params for o in p.opts + p.secondary_opts}
    assert {f"--{k.replace('_', '-')}" for k in written} <= options
    assert {"--no-gradient-checkpointing", "--preset", "--benchmark", "--seeds", "--seed"} <= options
    assert {f"--{flag_of(f)}" for f in knob_fields(RunConfig)} - {"--seed", "--staleness"} == \
        {f"--{k.replace('_', '-')}" for k in written}


def _stored(**overrides) -> dict:
    import json
    from dataclasses import asdict

    from runners.presets import get_preset

    return json.loads(json.dumps({"preset": "tiny", **asdict(get_preset("tiny", **overrides))}))


def test_setting_flags_reproduce_the_settings_and_name_what_no_flag_gives():
    from bench.fingerprint import fingerprint
    from leaderboard.fill_command import setting_flags, sweep_command
    from runners.presets import preset_defaults

    config = _stored(lr=2e-3, max_tokens=32, gradient_checkpointing=True, threads=2, seed=4)
    flags, notes = setting_flags(config, preset_defaults("tiny"))
    assert flags == ["--preset", "tiny", "--lr", "0.002", "--max-tokens", "32", "--threads", "2",
                     "--gradient-checkpointing"] and notes == []        # algo.max_len follows --max-tokens
    command, notes = sweep_command("grpo", "b0", [("fp16", "fp16"), ("fp8", "fp16")], seeds=[0, 1], config=config,
                                   defaults=preset_defaults("tiny"))
    assert command == ("bench sweep --algo grpo --build b0 --dtype 'fp16;rollout=fp8,train=fp16' --seeds 2 "
                       "--preset tiny --lr 0.002 --max-tokens 32 --threads 2 --gradient-checkpointing")
    params = parse_sweep(command)
    assert sweep_fingerprint(params) == fingerprint(config) and params["build_id"] == "b0"
    # the benchmark's source has its flag; a loss hyper-parameter has none: said, not dropped
    bench = _stored(benchmark="aime24")
    flags, notes = setting_flags(bench, preset_defaults("tiny"))
    assert flags == ["--preset", "tiny", "--benchmark", "aime24"] and notes == []
    assert sweep_fingerprint(parse_sweep("bench sweep " + " ".join(flags))) == fingerprint(bench)
    odd = {**_stored(), "algo": {**_stored()["algo"], "C": 2.0}}
    flags, notes = setting_flags(odd, preset_defaults("tiny"))
    assert flags == ["--preset", "tiny"] and len(notes) == 1 and "`algo.C = 2.0` (the preset's 3.0)" in notes[0]
    # a correction's threshold is an option; at its default in a run whose stored defaults predate it, nothing
    moved = {**_stored(), "algo": {**_stored()["algo"], "icepop_hi": 2.0}}
    flags, notes = setting_flags(moved, preset_defaults("tiny"))
    assert flags == ["--preset", "tiny", "--icepop-hi", "2.0"] and notes == []
    assert sweep_fingerprint(parse_sweep("bench sweep " + " ".join(flags))) == fingerprint(moved)
    old_defaults = {**preset_defaults("tiny")}
    old_defaults["algo"] = {k: old_defaults["algo"][k] for k in ("max_len", "C", "eps_lo", "eps_hi", "gspo_lo",
                                                                 "gspo_hi")}
    assert setting_flags(_stored(), old_defaults) == (["--preset", "tiny"], [])
    # a stop rule's switch is an option: written as one, the same fingerprint; its constants are not
    stopped = {**_stored(), "stop": {**_stored()["stop"], "futility": False, "futility_window": 6, "hold": 4}}
    flags, notes = setting_flags(stopped, preset_defaults("tiny"))
    assert flags == ["--preset", "tiny", "--no-futility", "--futility-window", "6"], flags
    assert len(notes) == 1 and "`stop.hold = 4` (the preset's 3)" in notes[0]
    switched = {**stopped, "stop": {**stopped["stop"], "hold": 3}}
    assert sweep_fingerprint(parse_sweep("bench sweep " + " ".join(flags))) == fingerprint(switched)
    # without stored defaults: every top-level setting written out, and still the same fingerprint
    flags, notes = setting_flags(config, None)
    assert "--prompts-per-step" in flags and "--seed" not in flags and len(notes) == 1
    assert sweep_fingerprint(parse_sweep("bench sweep " + " ".join(flags))) == fingerprint(config)
    # the verl trainer: its seeds as on the native trainer, and what the cluster adds
    command, notes = sweep_command("grpo", "b0", [("bf16", "bf16")], seeds=[3], trainer="verl", engine="vllm",
                                   staleness=2)
    assert command == "bench sweep --algo grpo --build b0 --dtype bf16 --trainer verl --engine vllm " \
                      "--staleness 2 --seeds 3," and "--verl-python" in notes[0]
    params = parse_sweep(command)
    assert (params["trainer"].value, params["engine"].value, params["seeds"], params["staleness"]) == \
        ("verl", "vllm", "3,", "2")
    # verl's own settings are part of the cell: each one an override, the same fingerprint; resources are not
    tuned = {**config, "verl_settings": ["actor_rollout_ref.actor.optim.weight_decay=0.1"],
             "verl_resources": ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"]}
    command, notes = sweep_command("grpo", "b0", [("bf16", "bf16")], trainer="verl", config=tuned, defaults=None)
    assert "--verl-override actor_rollout_ref.actor.optim.weight_decay=0.1" in command
    assert "tensor_model_parallel_size" not in command
    assert sweep_fingerprint(parse_sweep(command)) == fingerprint(tuned) != fingerprint(config)


def _grid_store(url: str, config: dict) -> None:
    """grpo on build b0: fp32 at seeds 0 and 1 (converged), bf16 at seed 0 only (max_steps), every
    run at `config` with the tiny preset's defaults in its provenance, as `bench run` stores them."""
    from datetime import datetime, timedelta

    from bench.store import Run, open_store, session
    from conftest import add_model_and_build
    from runners.presets import preset_defaults

    with session(open_store(url)) as s:
        model_id = add_model_and_build(s)
        for i, (rid, dt, seed, status, peak) in enumerate([("a0", "fp32", 0, "converged", 0.97),
                                                             ("a1", "fp32", 1, "converged", 0.96),
                                                             ("b0", "bf16", 0, "max_steps", 0.90)]):
            s.add(Run(id=rid, model_id=model_id, build_id="b0", algo="grpo", rollout_dtype=dt, train_dtype=dt,
                      trainer="native", engine="torch", config={**config, "seed": seed}, seed=seed, status=status,
                      peak_accuracy=peak, steps_to_target=40 if status == "converged" else None, step=60,
                      provenance={"preset_defaults": preset_defaults("tiny")},
                      created_at=datetime(2026, 1, 1) + timedelta(minutes=i)))


@pytest.mark.slow
def test_grid_fills_its_empty_cells_with_one_sweep_of_its_settings(tmp_path, monkeypatch):
    from bench.fingerprint import fingerprint
    from bench.formats import ROLLOUT_FORMATS, TRAIN_FORMATS
    from bench.precision import parse_list
    from conftest import app_page
    from runners.sweep import parse_seeds

    url = f"sqlite:///{tmp_path / 's.db'}"
    config = _stored(lr=2e-3, eval_every=3, max_tokens=48)
    _grid_store(url, config)
    monkeypatch.setenv("BENCH_DB_URL", url)
    at = app_page("pages/grid.py")
    at.selectbox(key="grid_algo").set_value("grpo").run()
    (code,) = at.code                                                   # one command, not one per cell
    params = parse_sweep(code.value)
    every = [(r, t) for r in ROLLOUT_FORMATS for t in TRAIN_FORMATS]
    filled = [(p.rollout, p.train) for p in parse_list(params["dtype"])]
    assert sorted(filled) == sorted(set(every) - {("fp32", "fp32")})     # bf16 lacks seed 1: filled too
    assert (params["algo"], params["build_id"], parse_seeds(params["seeds"])) == ("grpo", "b0", [0, 1])
    assert (params["trainer"].value, params["engine"].value, params["staleness"]) == ("native", "torch", None)
    assert sweep_fingerprint(params) == fingerprint(config)             # the runs land in this grid's cells
    assert any("33 of 35 cells have no run, 1 lack some of the grid's seeds (2)" in c.value for c in at.caption)
    at.selectbox(key="grid_algo").set_value("gspo").run()               # nothing run yet: the preset's sweep
    (code,) = at.code
    assert code.value == "bench sweep --algo gspo --build b0 --dtype all"


# ------------------------------------------------------------------ colours and the Leaderboard chart

def test_status_kinds_and_verdict_colours_by_hand():
    from leaderboard.colours import VERDICT_COLOURS, status_css, status_kind, verdict_css

    assert [status_kind(s) for s in ("converged", "converged ×2", "converged, futile", "running, max_steps",
                                     "skipped ×2, plateaued", "plateaued", "max_steps ×3", "max_steps, plateaued",
                                     "", None)] == \
        ["pass", "pass", "early", "pending", "early", "fail", "undecided", "fail", None, None]
    assert verdict_css("PASS") == "background-color: #c7e9c0; color: #00441b; font-weight: 600"
    assert VERDICT_COLOURS["FAIL"][0] in verdict_css("FAIL") and VERDICT_COLOURS["RUNNING"][0] in \
        verdict_css("RUNNING")
    # UNDECIDED is neither green nor red (nor RUNNING's amber): a colour of its own
    assert len({VERDICT_COLOURS[v] for v in ("PASS", "FAIL", "UNDECIDED", "RUNNING")}) == 4
    assert verdict_css("converged") == "" and status_css(None) == ""
    assert "italic" in status_css("futile") and "italic" not in status_css("max_steps")
    assert len({status_css(s) for s in ("converged", "running", "futile", "plateaued", "max_steps")}) == 5


def test_chart_labels_name_only_what_tells_the_cells_apart():
    import pandas as pd

    from leaderboard.peak_chart import labels

    cells = pd.DataFrame({"algo": ["grpo", "grpo"], "precision": ["bf16", "bf16"], "staleness": [0, 2],
                          "engine": ["torch", "torch"], "config_fp": ["abcdef123456", "abcdef123456"]})
    assert labels(cells) == ["grpo · bf16 · K=0", "grpo · bf16 · K=2"]
    cells["config_fp"] = ["abcdef123456", "012345abcdef"]
    assert labels(cells) == ["grpo · bf16 · K=0 · cfg abcdef", "grpo · bf16 · K=2 · cfg 012345"]


def _leaderboard_store(url: str) -> None:
    """grpo on b0: fp32 seeds 0 and 1 converged at peaks 0.97 and 0.96; bf16 seed 0 max_steps at
    0.90; fp16 seed 0 still running at 0.50; rollout fp8 → train fp16 seed 0 futile at 0.80."""
    from datetime import datetime, timedelta

    from bench.store import Run, open_store, session
    from conftest import add_model_and_build

    rows = [("a0", "fp32", "fp32", 0, "converged", 0.97), ("a1", "fp32", "fp32", 1, "converged", 0.96),
            ("b0", "bf16", "bf16", 0, "max_steps", 0.90), ("h0", "fp16", "fp16", 0, "running", 0.50),
            ("f0", "fp8", "fp16", 0, "futile", 0.80)]
    with session(open_store(url)) as s:
        model_id = add_model_and_build(s)
        for i, (rid, r, t, seed, status, peak) in enumerate(rows):
            s.add(Run(id=rid, model_id=model_id, build_id="b0", algo="grpo", rollout_dtype=r, train_dtype=t,
                      trainer="native", engine="torch", config=_stored(seed=seed), seed=seed, status=status,
                      peak_accuracy=peak, steps_to_target=40 if status == "converged" else None, step=60,
                      created_at=datetime(2026, 1, 1) + timedelta(minutes=i)))


def _datasets(chart) -> list:
    import pyarrow as pa

    return [pa.ipc.open_stream(ds.data.data).read_all().to_pandas() for ds in chart.proto.datasets]


def test_leaderboard_chart_carries_each_cells_peak_interval_and_the_pass_line(tmp_path, monkeypatch):
    import json
    import math

    from conftest import app_page

    url = f"sqlite:///{tmp_path / 's.db'}"
    _leaderboard_store(url)
    monkeypatch.setenv("BENCH_DB_URL", url)
    at = app_page()
    (chart,) = [c for c in at.get("vega_lite_chart") if json.loads(c.proto.spec).get("title")
                == "Peak split accuracy per cell"]
    spec = json.loads(chart.proto.spec)
    frames = _datasets(chart)
    (points,) = [f for f in frames if "peak_mean" in f.columns]
    (line,) = [f for f in frames if "target" in f.columns]
    assert list(line.target) == [0.95]
    marks = [(layer["mark"]["type"], layer["encoding"]["x"]["field"]) for layer in spec["layer"]]
    assert ("rule", "target") in marks and ("point", "peak_mean") in marks and ("rule", "peak_ci_lo") in marks
    # the table's order (ranked) and, for fp32, the two seeds' mean and Student-t interval on the logit
    # scale by hand: logits ln(0.97/0.03) = 3.476099, ln(0.96/0.04) = 3.178054; mean 3.327077,
    # s = 0.210749, half = t(0.975, 1) · s/√2 = 12.7062047 · 0.149022; mapped back by σ
    assert list(points.cell) == ["grpo · fp32", "grpo · bf16", "grpo · fp8→fp16", "grpo · fp16"]
    fp32 = points.set_index("cell").loc["grpo · fp32"]
    half = 12.7062047 * 0.210749 / math.sqrt(2)
    assert (fp32.peak_mean, fp32.peak_ci_lo, fp32.peak_ci_hi) == pytest.approx(
        (0.965, 1 / (1 + math.exp(-(3.327077 - half))), 1 / (1 + math.exp(-(3.327077 + half)))), abs=1e-5)
    assert fp32.sanity == "PASS" and fp32.n_seeds == 2 and fp32.peak_ci_hi < 1
    assert fp32.evidence == "2/2 pass: p ≥ 0.22"
    one = points.set_index("cell").loc["grpo · bf16"]       # one seed: its peak, no interval; its budget ran out
    assert one.peak_mean == pytest.approx(0.90) and math.isnan(one.peak_ci_lo) and one.sanity == "UNDECIDED"
    assert points.set_index("cell").sanity.to_dict()["grpo · fp16"] == "RUNNING"
    # the same numbers as the table below it (the cell statistics, not recomputed)
    table = at.dataframe[0].value.set_index("precision")
    assert table.loc["fp32", ["peak_mean", "peak_ci_lo", "peak_ci_hi"]].tolist() == pytest.approx(
        [fp32.peak_mean, fp32.peak_ci_lo, fp32.peak_ci_hi])


def test_leaderboard_table_colours_verdicts_and_tells_early_and_pending_apart(tmp_path, monkeypatch):
    import re

    from conftest import app_page
    from leaderboard.colours import KIND_COLOURS, VERDICT_COLOURS

    url = f"sqlite:///{tmp_path / 's.db'}"
    _leaderboard_store(url)
    monkeypatch.setenv("BENCH_DB_URL", url)
    at = app_page()
    table = at.dataframe[0]
    df = table.value
    css = {}                                        # (row, col) → its CSS; pandas groups equal rules
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", table.proto.arrow_data.styler.styles):
        for r, c in re.findall(r"_row(\d+)_col(\d+)", selectors):
            css[(int(r), int(c))] = body
    sanity, status = list(df.columns).index("sanity"), list(df.columns).index("status")
    for i, (verdict, st) in enumerate(zip(df.sanity, df.status)):
        assert VERDICT_COLOURS[verdict][0] in css[(i, sanity)], (verdict, css.get((i, sanity)))
        kind = {"converged ×2": "pass", "running": "pending", "futile": "early", "max_steps": "undecided"}[st]
        assert KIND_COLOURS[kind] in css[(i, status)], (st, css.get((i, status)))
    assert "italic" in css[(list(df.status).index("futile"), status)]
