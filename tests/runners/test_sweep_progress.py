"""`bench sweep` shows progress while it runs: one line per step of every cell (reward, KL,
and split / benchmark accuracy at the evaluation steps; at step 0 the calibration gate's k3 and the
first evaluation), from the trainer in process and
relayed from the cells' own processes with `--jobs N` (runners/cell_process.py), and one line as
each cell ends."""

import json
import os
import re
import subprocess
import sys

import pytest

from runners.sweep import step_line


def test_step_line_shows_reward_kl_and_the_evaluations_of_that_step():
    m = {"reward": 0.5312, "kl_k3": 1.234e-4, "kl_k1": 0.1, "loss": 3.0}
    assert step_line(3, 40, m) == "step 3/40  reward 0.531  kl_k3 1.23e-04"
    m.update({"eval/split": 0.65625, "eval/synthetic-hard": 0.140625, "eval/split@train": 0.7})
    assert step_line(10, 40, m) == ("step 10/40  reward 0.531  split 0.656  split@train 0.700  synthetic-hard 0.141"
                                    "  kl_k3 1.23e-04")
    assert step_line(7, None, {"critic/score/mean": 0.25}) == "step 7  reward 0.250"     # verl's metrics
    # step 0, before any training: the calibration gate, then the first evaluation
    assert step_line(0, 40, {"gate/k3": 3.2e-4}) == "step 0/40  gate passed, k3 3.20e-04"
    assert step_line(0, 40, {"eval/split": 0.5, "eval/synthetic-hard": 0.125}) == ("step 0/40  split 0.500  "
                                                                                   "synthetic-hard 0.125")


FAST = ["--max-steps", "2", "--eval-every", "2", "--prompts-per-step", "4", "--samples-per-prompt", "4",
        "--threads", "1"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from typer.testing import CliRunner

    from bench.cli import app

    tmp = tmp_path_factory.mktemp("sweep")
    url = f"sqlite:///{tmp / 'store.db'}"
    old = os.environ.get("BENCH_HOME")
    os.environ["BENCH_HOME"] = str(tmp / "home")
    r = CliRunner().invoke(app, ["build", "--model", "tiny-math", "--limit", "48", "--k", "8", "--engine", "torch",
                                 "--dtype", "fp32", "--band", "0.1", "0.9", "--json", "--db", url])
    assert r.exit_code == 0, r.output
    yield url, json.loads(r.stdout)["build_id"], tmp
    if old is None:
        os.environ.pop("BENCH_HOME", None)
    else:
        os.environ["BENCH_HOME"] = old


def _steps(text: str, cell: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith(f"{cell} step ")]


@pytest.mark.integration
def test_sweep_prints_every_step_of_every_cell_in_process(built, monkeypatch):
    from typer.testing import CliRunner

    from bench.cli import app

    url, build, tmp = built
    monkeypatch.setenv("BENCH_HOME", str(tmp / "home"))
    r = CliRunner().invoke(app, ["sweep", "--algo", "grpo", "--dtype", "fp32", "--build", build, *FAST, "--db", url])
    assert r.exit_code == 0, r.output
    lines = _steps(r.output, "grpo fp32")
    assert len(lines) == 4, r.output
    assert re.fullmatch(r"grpo fp32 step 0/2  gate passed, k3 \S+", lines[0]), lines
    assert re.fullmatch(r"grpo fp32 step 0/2  split \d\.\d{3}  synthetic-hard \d\.\d{3}", lines[1]), lines
    assert re.fullmatch(r"grpo fp32 step 1/2  reward \d\.\d{3}  kl_k3 \S+", lines[2]), lines
    assert re.fullmatch(r"grpo fp32 step 2/2  reward \d\.\d{3}  split \d\.\d{3}  synthetic-hard \d\.\d{3}  kl_k3 \S+",
                        lines[3]), lines
    assert re.search(r"grpo fp32: max_steps after 2 steps, peak split \d\.\d{3}", r.output), r.output


@pytest.mark.integration
def test_sweep_with_jobs_relays_the_step_lines_of_its_process_cells(built):
    url, build, tmp = built
    p = subprocess.run([sys.executable, "-m", "bench.cli", "sweep", "--algo", "pg-seq-is,gspo", "--dtype", "fp32",
                        "--build", build, *FAST, "--jobs", "2", "--db", url],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "BENCH_HOME": str(tmp / "home"), "COLUMNS": "80"})
    assert p.returncode == 0, p.stdout + p.stderr
    for cell in ("pg-seq-is fp32", "gspo fp32"):
        lines = _steps(p.stderr, cell)
        assert [line.split("  ")[0] for line in lines] == [f"{cell} step {s}" for s in ("0/2", "0/2", "1/2", "2/2")], \
            p.stderr
        assert " split " in lines[3] and " synthetic-hard " in lines[3], lines
        assert f"{cell}: max_steps after 2 steps" in p.stderr
