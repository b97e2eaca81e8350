"""The progress of long work (a build's rollouts, a run's steps, a warm-up): rich's bar on a
terminal; elsewhere (a log file, `nohup`, CI, a batch job's output) a plain line when a task
moves, at most one every `every` seconds, its first move at once and its last state at the end,
where rich draws nothing until the work ends."""

from __future__ import annotations

import time


def progress(description: str, console, every: float = 30.0, clock=time.monotonic):
    """A progress display for `console`: rich's bar where it is a terminal, else `LineProgress`."""
    if console.is_terminal and not console.is_dumb_terminal:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        return Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                        TimeRemainingColumn(), console=console, transient=False)
    return LineProgress(description, console, every, clock)


class LineProgress:
    """The part of rich's `Progress` bench's commands use (`add_task`, `update`, a context manager)
    written as lines: "steps 12/200 reward 0.55 kl 3.1e-04 [5:02 elapsed]"."""

    def __init__(self, description: str, console, every: float = 30.0, clock=time.monotonic):
        self.description, self.console, self.every, self.clock = description, console, every, clock
        self.tasks: list[dict] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for task in self.tasks:
            if task["shown"] != self._state(task):
                self._print(task)

    def add_task(self, name: str, total=None, completed=0, **fields) -> int:
        self.tasks.append({"name": name, "total": total, "completed": completed, "fields": fields,
                           "start": self.clock(), "last": None, "shown": None})
        return len(self.tasks) - 1

    def update(self, task_id: int, completed=None, total=None, **fields) -> None:
        task = self.tasks[task_id]
        if total is not None:
            task["total"] = total
        if completed is not None:
            task["completed"] = completed
        task["fields"].update(fields)
        now = self.clock()
        if task["shown"] == self._state(task):
            return
        if task["last"] is None or now - task["last"] >= self.every or task["completed"] == task["total"]:
            self._print(task)

    @staticmethod
    def _state(task: dict) -> tuple:
        return task["completed"], task["total"], tuple(sorted(task["fields"].items()))

    def _print(self, task: dict) -> None:
        now = self.clock()
        elapsed = int(now - task["start"])
        total = "?" if task["total"] is None else _count(task["total"])
        rate = task["fields"].get("rate") or ""
        self.console.print(f"{self.description} {_count(task['completed'])}/{total}{' ' + rate if rate else ''} "
                           f"[{elapsed // 60}:{elapsed % 60:02d} elapsed]", markup=False, highlight=False,
                           soft_wrap=True)
        task["last"], task["shown"] = now, self._state(task)


def _count(x) -> str:
    """A count as an integer where it is one (1000000, not 1e+06), else as given."""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:g}"
