"""Every knob declared once (bench/knobs.py) and the options generated from it: `bench run` and
`bench sweep` offer the same run settings as RunConfig's fields; every bad value of every numeric
knob of every verb is refused with exit 2, one message naming the flag and its bound, and nothing
written; user errors (BenchError) are one line and exit 2, anything else a traceback and exit 1;
presets still yield to explicit flags."""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest
import typer
from sqlalchemy import func, select
from typer.testing import CliRunner

from bench.cli import app
from bench.knobs import base_type, cli_knobs, flag_of, knob_fields, types_of
from bench.store import BuildProblem, Run, open_store, session
from bench.grading import GradeConfig
from datasets_build.config import BuildConfig
from runners.check_config import CheckConfig
from runners.mismatch_config import MismatchConfig
from runners.presets import PRESETS, RunConfig

from conftest import add_model_and_build

# the verbs whose settings are generated from (or checked against) a config, and the arguments
# each needs besides the bad value
VERBS = {
    "run": (RunConfig, ["run", "--algo", "grpo", "--dtype", "fp32", "--device", "cpu"]),
    "sweep": (RunConfig, ["sweep", "--algo", "grpo", "--dtype", "fp32", "--device", "cpu"]),
    "tolerance": (RunConfig, ["tolerance", "--algo", "grpo", "--device", "cpu"]),
    "build": (BuildConfig, ["build", "--engine", "torch", "--dtype", "fp32", "--device", "cpu"]),
    "mismatch": (MismatchConfig, ["mismatch", "--dtype", "fp32", "--device", "cpu"]),
    "grade": (GradeConfig, ["grade", "RESPONSES"]),              # a JSONL of one gradable row; no store
    "check": (CheckConfig, ["check", "--dtype", "fp32", "--device", "cpu"]),
}
NO_STORE = {"grade"}


def _type(cls, f):
    """The knob's type, read from the class that declares it (RunConfig or its nested StopConfig)."""
    owner = next(o for o, g in cli_knobs(cls) if g is f)
    return base_type(types_of(owner)[f.name])[0]


def _numeric(cls) -> list[dataclasses.Field]:
    """The numeric CLI knobs of `cls`, its nested configs' included (`bench run --futility-window`)."""
    return [f for _, f in cli_knobs(cls) if _type(cls, f) in (int, float)]


def _bad_values(f, typ) -> list[str]:
    """Values just outside each of the knob's bounds (and a negative one below a lower bound)."""
    m = f.metadata
    out = []
    step = 1 if typ is int else 0.5
    if m.get("ge") is not None:
        out += [m["ge"] - step, -3]
    if m.get("gt") is not None:
        out += [m["gt"], m["gt"] - step, -1]
    if m.get("le") is not None:
        out.append(m["le"] + step)
    if m.get("lt") is not None:
        out.append(m["lt"])
    vals = [str(int(v)) if typ is int else repr(float(v)) for v in dict.fromkeys(out)]
    return vals + (["inf", "nan"] if typ is float and m.get("finite", True) else [])       # a float knob is finite


def _table():
    """Every bad value of every numeric knob of every verb. The quick lane keeps each verb's first
    row (beside the EXAMPLES below); the rest are `slow`: ./bench.sh test and CI run all ~530."""
    rows = []
    for verb, (cls, _) in VERBS.items():
        first = len(rows)

        def row(name, value, flag):
            return pytest.param(verb, name, value, id=f"{verb}--{flag}={value}",
                                marks=() if len(rows) == first else pytest.mark.slow)
        for f in _numeric(cls):
            if verb == "sweep" and f.name == "staleness":
                rows.append(row("staleness", "-1", "staleness"))
                continue
            for v in _bad_values(f, _type(cls, f)):
                rows.append(row(f.name, v, flag_of(f)))
    return rows


# the issue's own examples, spelled out (the generated table holds them too)
EXAMPLES = [("run", "max_steps", "-3"), ("run", "lr", "-1"), ("run", "lr", "0"), ("run", "prompts_per_step", "-8"),
            ("run", "gpu_memory_utilization", "1.5"), ("run", "loss_scale_backoff", "1"),
            ("sweep", "lr", "-1"), ("sweep", "max_tokens", "0"), ("build", "k", "-1"), ("build", "confidence", "1"),
            ("build", "top_p", "1.5"), ("mismatch", "n", "0"), ("grade", "timeout", "0"), ("grade", "workers", "0"),
            # house review 2026-12-02: a float knob given inf (`--lr inf` stored a run as diverged)
            ("run", "lr", "inf"), ("run", "weight_decay", "inf"), ("run", "loss_scale_init", "inf"),
            ("run", "grad_clip", "inf")]


def test_every_numeric_knob_is_bounded():
    """Each numeric CLI knob of every config declares a lower bound, so the table below holds
    at least one bad value for each of them."""
    for cls in (RunConfig, BuildConfig, MismatchConfig, GradeConfig, CheckConfig):
        for f in _numeric(cls):
            m = f.metadata
            assert m.get("ge") is not None or m.get("gt") is not None, (cls.__name__, f.name)
            assert m["help"].strip(), (cls.__name__, f.name)


@pytest.fixture(scope="module")
def _store_made_once(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "store.db"
    engine = open_store(f"sqlite:///{path}")
    with session(engine) as s:
        add_model_and_build(s, "b0")
        for i in range(4):
            s.add(BuildProblem(build_id="b0", problem_id=f"p{i}", position=i, problem=f"Compute {i}+1.",
                               answer=str(i + 1), n_samples=8, n_correct=4, accuracy=0.5, bucket="kept", kept=True))
    engine.dispose()                  # the last connection closed: SQLite writes its WAL into the file copied
    assert not path.with_name("store.db-wal").exists()
    return path


@pytest.fixture
def store_with_build(_store_made_once, tmp_path):
    """A store outside BENCH_HOME holding a complete build with kept problems: a run that got
    past the checks would create its row here. Each test its own copy of one store made once
    (made and migrated afresh for each of ~240 tests, it cost ~70 ms a test)."""
    (tmp_path / "outside").mkdir()
    shutil.copyfile(_store_made_once, tmp_path / "outside" / "store.db")
    return f"sqlite:///{tmp_path / 'outside' / 'store.db'}"


def _files(root):
    return sorted(p for p in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize("verb,name,value", _table() + [pytest.param(*e, id=f"example-{e[0]}-{e[1]}={e[2]}")
                                                        for e in EXAMPLES])
def test_bad_value_is_refused_with_nothing_written(verb, name, value, store_with_build, bench_home, tmp_path):
    cls, args = VERBS[verb]
    responses = tmp_path / "responses.jsonl"
    responses.write_text('{"response": "\\\\boxed{2}", "gold": "2"}\n')
    args = [str(responses) if a == "RESPONSES" else a for a in args]
    f = next(f for _, f in cli_knobs(cls) if f.name == name)
    flag = f"--{flag_of(f)}"
    before = _files(bench_home)
    r = CliRunner().invoke(app, [*args, flag, value, *([] if verb in NO_STORE else ["--db", store_with_build])])
    text = " ".join(r.output.split())
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert flag in text and "error:" in text, text               # one message naming the knob...
    assert re.search(r"must be (a finite number )?(>=|>|<=|<|in [\[(])|integers >= 0", text), text  # ...its bound
    assert len(r.output.strip().splitlines()) == 1, r.output      # one line, no traceback
    assert _files(bench_home) == before                           # nothing new under BENCH_HOME
    with session(open_store(store_with_build)) as s:
        assert s.scalar(select(func.count()).select_from(Run)) == 0


def _knob_options(command: str) -> dict[str, str]:
    """{flag: help} of the options `bench COMMAND` generates from RunConfig."""
    cmd = typer.main.get_command(app).commands[command]
    return {p.opts[0]: p.help for p in cmd.params if p.opts[0][2:].replace("-", "_") in
            {f.name for _, f in cli_knobs(RunConfig)}}


def test_run_and_sweep_offer_the_same_knobs_as_runconfig():
    knobs = {f"--{flag_of(f)}" for _, f in cli_knobs(RunConfig)}
    assert {"--max-tokens", "--lr", "--seed", "--updates-per-batch", "--eval-split-m", "--checkpoint-every",
            "--max-steps", "--staleness", "--futility", "--futility-window", "--futility-confidence",
            "--plateau", "--collapse"} <= knobs
    hidden = {f.name for f in dataclasses.fields(RunConfig)} - {f.name for f in knob_fields(RunConfig)}
    # fixed at 1 / nested configs / --verl-override's two halves (runners/verl_overrides.py)
    assert hidden == {"temperature", "top_p", "benchmarks", "algo", "stop", "verl_settings", "verl_resources"}
    for command in ("run", "sweep"):
        r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
        assert r.exit_code == 0, r.output
        offered = set(re.findall(r"(--[a-z][a-z0-9-]+)", r.output))
        assert knobs <= offered, (command, knobs - offered)
    run, sweep = _knob_options("run"), _knob_options("sweep")
    assert set(run) == set(sweep) == knobs
    # the same words, but for sweep's staleness, which is an axis there (0,1,2,...)
    assert {k: v for k, v in run.items() if k != "--staleness"} == \
           {k: v for k, v in sweep.items() if k != "--staleness"}
    for _, f in cli_knobs(RunConfig):
        assert run[f"--{flag_of(f)}"].startswith(f.metadata["help"].rstrip()), f.name


def test_build_and_mismatch_options_come_from_their_configs():
    root = typer.main.get_command(app)
    build = {p.opts[0] for p in root.commands["build"].params}
    assert {f"--{flag_of(f)}" for f in knob_fields(BuildConfig)} <= build
    band = next(p for p in root.commands["build"].params if p.name == "band")
    assert band.nargs == 2
    mismatch = {p.opts[0] for p in root.commands["mismatch"].params}
    assert {f"--{flag_of(f)}" for f in knob_fields(MismatchConfig)} <= mismatch


def test_preset_enum_matches_presets():
    from bench.cli.options import Preset

    assert [p.value for p in Preset] == list(PRESETS)


@pytest.fixture
def captured(monkeypatch):
    """run_plan and run_grid replaced by recorders: what `bench run` / `bench sweep` pass on."""
    import runners.sweep
    import runners.runs

    calls = {}

    def run_plan(store, plan, *args, **kw):
        calls["run"] = plan.cfg
        raise SystemExit(0)

    def run_grid(store, algos, pairs, build_id, engine, preset, overrides, jobs, **kw):
        calls["sweep"] = (preset, overrides, kw)
        return []

    monkeypatch.setattr(runners.runs, "run_plan", run_plan)
    monkeypatch.setattr(runners.sweep, "run_grid", run_grid)
    return calls


def test_explicit_flags_override_the_preset(captured, store_with_build):
    r = CliRunner().invoke(app, ["run", "--algo", "grpo", "--preset", "paper", "--lr", "0.01", "--max-tokens", "32",
                                 "--no-gradient-checkpointing", "--device", "cpu", "--db", store_with_build])
    assert r.exit_code == 0, r.output
    cfg, paper = captured["run"], PRESETS["paper"]()
    assert cfg.lr == 0.01 and cfg.max_tokens == 32 and cfg.algo.max_len == 32        # Dr.GRPO's L follows
    assert cfg.gradient_checkpointing is False
    for f in dataclasses.fields(RunConfig):
        if f.name not in ("lr", "max_tokens", "algo", "gradient_checkpointing"):
            assert getattr(cfg, f.name) == getattr(paper, f.name), f.name              # the rest: the preset's
    r = CliRunner().invoke(app, ["sweep", "--algo", "grpo", "--dtype", "fp16;bf16", "--lr", "0.002", "--seed", "3",
                                 "--updates-per-batch", "2", "--eval-split-m", "2", "--checkpoint-every", "7",
                                 "--device", "cpu", "--db", store_with_build])
    assert r.exit_code == 0, r.output
    preset, overrides, kw = captured["sweep"]
    assert preset == "tiny" and overrides == {"lr": 0.002, "seed": 3, "updates_per_batch": 2, "eval_split_m": 2,
                                              "checkpoint_every": 7}
    assert kw["staleness"] is None


def test_stop_rule_flags_reach_the_nested_stop_config(captured, store_with_build):
    """The StopConfig knobs are flat options (`--futility-window`), set on cfg.stop; the rest of
    the stop config keeps its defaults, and a sweep passes them on by name."""
    from bench.stop import StopConfig

    r = CliRunner().invoke(app, ["run", "--algo", "grpo", "--futility", "--futility-window", "6", "--no-plateau",
                                 "--device", "cpu", "--db", store_with_build])
    assert r.exit_code == 0, r.output
    stop = captured["run"].stop
    assert (stop.futility, stop.futility_window, stop.plateau, stop.collapse) == (True, 6, False, True)
    assert stop.futility_confidence == StopConfig().futility_confidence and stop.patience == 10
    assert not hasattr(captured["run"], "futility_window") or "futility_window" not in vars(captured["run"])
    r = CliRunner().invoke(app, ["sweep", "--algo", "grpo", "--dtype", "fp16", "--futility-confidence", "0.9",
                                 "--no-collapse", "--device", "cpu", "--db", store_with_build])
    assert r.exit_code == 0, r.output
    assert captured["sweep"][1] == {"futility_confidence": 0.9, "collapse": False}


def test_dtype_lists_take_comma_or_semicolon():
    from bench.precision import parse_list

    names = lambda text: [p.name for p in parse_list(text)]   # noqa: E731
    assert names("fp16;bf16") == names("fp16,bf16") == ["fp16", "bf16"]
    assert names("fp16;rollout=fp8,train=fp16") == names("fp16,rollout=fp8,train=fp16") == ["fp16", "fp8→fp16"]
    assert names("rollout=fp8,train=fp16;rollout=int8,train=bf16") == ["fp8→fp16", "int8→bf16"]
    assert names("fp16,fp8→fp16") == ["fp16", "fp8→fp16"]              # the display name reads back
    from bench.precision import PrecisionError

    with pytest.raises(PrecisionError, match="other half"):
        parse_list("fp16;rollout=fp8")


def test_every_user_error_class_is_a_bench_error():
    from bench.bundle import BundleError
    from bench.device import DeviceError
    from bench.errors import BenchError, ConfigError
    from bench.errors import PrecisionError
    from bench.models import ModelError
    from bench.errors import SourceError
    from bench.store import StoreError
    from datasets_build.builder import BuildError
    from runners.plan import RunError
    from runners.verl_runner import VerlError

    for cls in (BundleError, DeviceError, ConfigError, PrecisionError, ModelError, SourceError, StoreError,
                BuildError, RunError, VerlError):
        assert issubclass(cls, BenchError), cls


def test_a_bug_shows_its_traceback_and_exits_1(monkeypatch, store_with_build):
    """A ValueError from deep inside (torch, transformers) is no user error: exit 1 with the
    exception, not one red line with exit 2."""
    import runners.runs

    def boom(*a, **kw):
        raise ValueError("Invalid learning rate: deep inside torch")

    monkeypatch.setattr(runners.runs, "run_plan", boom)
    r = CliRunner().invoke(app, ["run", "--algo", "grpo", "--device", "cpu", "--db", store_with_build])
    assert r.exit_code == 1 and isinstance(r.exception, ValueError), r.output
    assert "error:" not in r.output


def test_a_bench_error_from_deep_inside_is_one_line_exit_2(monkeypatch, store_with_build):
    import runners.runs
    from runners.plan import RunError

    def refuse(*a, **kw):
        raise RunError("no such thing; do this instead")

    monkeypatch.setattr(runners.runs, "run_plan", refuse)
    r = CliRunner().invoke(app, ["run", "--algo", "grpo", "--device", "cpu", "--db", store_with_build])
    assert r.exit_code == 2 and r.output.strip().splitlines()[-1] == "error: no such thing; do this instead", \
        r.output
    assert "Traceback" not in r.output


def test_no_progress_bar_before_the_inputs_are_checked(monkeypatch, store_with_build):
    import bench.cli.run_common

    def no_bar(*a, **kw):
        raise AssertionError("progress bar drawn before the inputs were checked")

    monkeypatch.setattr(bench.cli.run_common, "_progress", no_bar)
    for args, needle in ((["--build", "nope"], "no build 'nope'"), (["--model", "other"], "no build yet"),
                         (["--max-steps", "-1"], "--max-steps must be >= 0"), (["--dtype", "fp6"], "unknown dtype")):
        r = CliRunner().invoke(app, ["run", "--algo", "grpo", "--device", "cpu", *args, "--db", store_with_build])
        assert r.exit_code == 2 and needle in r.output, (args, r.output, r.exception)


@pytest.mark.parametrize("argv,said", [
    (["run", "--algo", "pg-seq-si", "--dtype", "fp16"], "unknown algorithm 'pg-seq-si' (did you mean 'pg-seq-is'?)"),
    (["run", "--algo", "grpo", "--dtype", "bf61"], "unknown dtype 'bf61' (did you mean 'bf16'?)"),
    (["sweep", "--algo", "grpo,gspoo", "--dtype", "fp16"], "unknown algorithm 'gspoo' (did you mean 'gspo'?)"),
    (["mismatch", "--model", "tiny-mat", "--dtype", "fp16"], "unknown model 'tiny-mat' (did you mean 'tiny-math'?)"),
    (["compare", "pg-seq-is:fp16", "grp:fp16"], "unknown algorithm 'grp' in 'grp:fp16' (did you mean 'grpo'?)"),
])
def test_a_misspelt_name_suggests_the_nearest(argv, said, store_with_build):
    r = CliRunner().invoke(app, [*argv, "--db", store_with_build])
    assert r.exit_code == 2 and said in " ".join(r.output.split()), r.output
