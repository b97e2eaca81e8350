"""Which per-step metrics measure the machine rather than the run: wall-clock times, throughputs
and peak memory. Re-running a step (a resume after a kill, `bench runs verify`) gives them new
values while every other metric comes out bit for bit the same on the same device and CPU kind;
so a continuation's steps and a verification are compared on the other metrics only."""

from __future__ import annotations

# prefixes (and whole names) of the metrics that time or size the machine
MACHINE_METRICS = ("time_", "tokens_per_s", "train_tokens_per_s", "peak_memory_mb", "rss_mb", "wall_s")


def is_machine_metric(name: str) -> bool:
    return any(name == p or name.startswith(p) for p in MACHINE_METRICS)


def deterministic(metrics: dict) -> dict:
    """`metrics` without the machine's: what a re-run of the step must reproduce."""
    return {k: v for k, v in metrics.items() if not is_machine_metric(k)}
