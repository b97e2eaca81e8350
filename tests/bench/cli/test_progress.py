"""Progress where the console is no terminal (a log, CI): lines, the first at once, then at most
one every `every` seconds, the last state at the end; rich's bar on a terminal."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import Progress

from bench.cli.progress import LineProgress, progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_log_gets_lines_a_terminal_the_bar():
    log = Console(file=io.StringIO(), force_terminal=False)
    assert isinstance(progress("steps", log), LineProgress)
    assert isinstance(progress("steps", Console(file=io.StringIO(), force_terminal=True)), Progress)


def test_lines_first_at_once_then_every_30_s_and_the_end():
    buf, clock = io.StringIO(), Clock()
    with progress("steps", Console(file=buf, force_terminal=False, width=200), every=30.0, clock=clock) as prog:
        task = prog.add_task("steps", total=None, rate="")
        for step in range(1, 8):                      # a step every 12 s
            clock.t = 12.0 * step
            prog.update(task, completed=step, total=7, rate=f"reward {step / 10:.2f}")
    assert buf.getvalue().splitlines() == [
        "steps 1/7 reward 0.10 [0:12 elapsed]",       # the first move at once
        "steps 4/7 reward 0.40 [0:48 elapsed]",       # 36 s after the last line
        "steps 7/7 reward 0.70 [1:24 elapsed]",       # the total reached
    ]


def test_the_end_shows_a_state_not_yet_shown():
    buf, clock = io.StringIO(), Clock()
    with LineProgress("rollouts", Console(file=buf, force_terminal=False, width=200), clock=clock) as prog:
        task = prog.add_task("rollouts")
        prog.update(task, completed=100, rate="10 rollouts/s")
        clock.t = 5.0
        prog.update(task, completed=150, rate="10 rollouts/s")
    assert buf.getvalue().splitlines() == ["rollouts 100/? 10 rollouts/s [0:00 elapsed]",
                                           "rollouts 150/? 10 rollouts/s [0:05 elapsed]"]


def test_a_runs_line_says_step_0_the_gate_and_evaluation_then_each_step():
    from bench.cli.run_common import _run_progress

    buf, clock = io.StringIO(), Clock()
    with LineProgress("steps", Console(file=buf, force_terminal=False, width=200), clock=clock) as prog:
        cb = _run_progress(prog, prog.add_task("steps", total=None, rate=""))
        clock.t = 130.0
        cb(0, 200, {"gate/k3": 3.53e-1})                          # a real model's gate: minutes in
        clock.t = 370.0
        cb(0, 200, {"eval/split": 0.2436, "eval/math500": 0.03})
        clock.t = 430.0
        cb(1, 200, {"reward": 0.328, "kl_k1": 5.3, "kl_k3": 0.4})
    assert buf.getvalue().splitlines() == ["steps 0/200 gate k3 3.5e-01 [2:10 elapsed]",
                                           "steps 0/200 split 0.24 [6:10 elapsed]",
                                           "steps 1/200 reward 0.33 kl 5.3e+00 [7:10 elapsed]"]
