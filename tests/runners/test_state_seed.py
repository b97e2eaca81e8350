"""A run's state digest and numbers are functions of its settings and seed alone (issue: an
honest run failed its own re-run because its digest hashed process-wide RNG states). In one
process, the same run twice with the process-wide torch, Python and NumPy RNGs set to other
states before each: the same steps and state digests; and the run leaves those states as it
found them (bench draws from none of them, so they have no place in the digest).
tests/runners/test_verify_processes.py checks the same across processes."""

import json
import random

import numpy as np
import pytest
import torch
from sqlalchemy import select
from typer.testing import CliRunner

from bench.cli import app
from bench.machine_metrics import is_machine_metric
from bench.store import RunDigest, RunStep, open_store, session

pytestmark = pytest.mark.integration


def _process_states():
    return torch.get_rng_state().clone(), random.getstate(), np.random.get_state()


def _same_states(a, b) -> bool:
    return (torch.equal(a[0], b[0]) and a[1] == b[1] and a[2][0] == b[2][0] and np.array_equal(a[2][1], b[2][1])
            and a[2][2:] == b[2][2:])


def _record(url, run):
    with session(open_store(url)) as s:
        digests = [(d.step, d.digest, d.scheme) for d in s.scalars(select(RunDigest).where(RunDigest.run_id == run)
                                                                   .order_by(RunDigest.step))]
        steps = [(x.step, x.reward, {k: v for k, v in x.metrics.items() if not is_machine_metric(k)})
                 for x in s.scalars(select(RunStep).where(RunStep.run_id == run).order_by(RunStep.step))]
    return digests, steps


@pytest.mark.parametrize("dtype, extra", [("fp32", []), ("fp16", ["--staleness", "1"])], ids=["fp32", "fp16-stale1"])
def test_no_process_wide_rng_state_enters_the_digest_or_the_numbers(tmp_path, dtype, extra):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    r = CliRunner().invoke(app, ["build", "--limit", "12", "--k", "2", "--engine", "torch", "--dtype", "fp32",
                                 "--band", "0", "1", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    seen = []
    for process_seed in (11, 12345):
        torch.manual_seed(process_seed)
        random.seed(process_seed)
        np.random.seed(process_seed)
        before = _process_states()
        r = CliRunner().invoke(app, ["run", "--algo", "grpo", "--dtype", dtype, "--max-steps", "2", "--eval-every", "1",
                                     *extra, "--prompts-per-step", "2", "--samples-per-prompt", "2", "--threads", "1",
                                     "--db", url, "--json"])
        assert r.exit_code == 0, r.output
        assert _same_states(before, _process_states()), "the run drew from a process-wide RNG"
        seen.append(_record(url, json.loads(r.stdout)["id"]))
    (digests_a, steps_a), (digests_b, steps_b) = seen
    assert [d[0] for d in digests_a] == [0, 1, 2] and digests_a == digests_b
    assert steps_a == steps_b
