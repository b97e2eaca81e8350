"""NativeTrainer's life cycle (runners/trainer.py): Ctrl-C while it starts releases what it had
started, so the process it runs in can end (a sweep's cell process once hung at exit, joining
the grader's worker processes that nobody closed)."""

import pytest

from bench.models import resolve_model
from bench.precision import Precision
from bench.problems import Problem
from runners.plan import RunPlan
from runners.presets import get_preset


def test_ctrl_c_while_starting_closes_the_grader_it_started(monkeypatch, tmp_path):
    import runners.trainer as trainer

    closed = []

    class Grader(trainer.Grader):                  # the real grader (its worker processes), its close seen
        def close(self):
            closed.append(self)
            super().close()

    def interrupted(model):
        raise KeyboardInterrupt                       # Ctrl-C after the grader started, before the end

    monkeypatch.setattr(trainer, "Grader", Grader)
    monkeypatch.setattr(trainer, "is_moe", interrupted)
    cfg = get_preset("tiny")
    cfg.benchmarks = []
    plan = RunPlan("grpo", Precision("fp32", "fp32"), cfg, "b0", 1, resolve_model("tiny-math"), "torch", "cpu")
    with pytest.raises(KeyboardInterrupt):
        trainer.NativeTrainer(None, "r0", plan, [Problem("p0", "1+1", "2")], tmp_path)
    assert len(closed) == 1
