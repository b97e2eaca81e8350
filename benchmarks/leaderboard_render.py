"""Leaderboard page render time on a large store: 1,000 runs × 500 steps (500k step rows).

    python benchmarks/leaderboard_render.py [--runs 1000] [--steps 500]

The rows are generated in bulk (a load test, not results); the page is rendered with
Streamlit's AppTest, cold (empty cache) and warm. Goal: <= 2 s. Prints the times and the
ratio to the goal."""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from sqlalchemy import insert

from bench.store import Build, Eval, Model, Run, RunStep, open_store, session

APP = str(Path(__file__).parent.parent / "leaderboard" / "app.py")
ALGOS = ["pg-seq-is", "pg-seq-tis", "pg-seq-mis", "grpo", "grpo-token-tis", "grpo-seq-mis", "gspo"]
DTYPES = ["fp32", "fp16", "bf16"]


def fill(url: str, runs: int, steps: int) -> None:
    engine = open_store(url)
    rng = random.Random(0)
    with session(engine) as s:
        m = Model(name="tiny-math", path="/x", weights_hash="bench")
        s.add(m)
        s.flush()
        s.add(Build(id="b0", model_id=m.id, source="synthetic", engine="torch", dtype="bf16", k=40, lo=0.2, hi=0.8,
                    seed=0, settings_hash="h", status="complete", n_problems=300, n_kept=170))
        s.flush()
        s.execute(insert(Run), [dict(id=f"r{i:05d}", model_id=m.id, build_id="b0", algo=ALGOS[i % 7],
                                     rollout_dtype=DTYPES[i % 3], train_dtype=DTYPES[(i // 3) % 3], trainer="native",
                                     engine="torch", config={"lr": 5e-4}, status="max_steps", step=steps,
                                     peak_accuracy=rng.random(), final_accuracy=rng.random(),
                                     steps_to_target=rng.choice([None, rng.randint(50, steps)]))
                                for i in range(runs)])
    for i in range(runs):
        rows = []
        for t in range(1, steps + 1):
            kl = rng.random() * 1e-3
            rows.append(dict(run_id=f"r{i:05d}", step=t, reward=rng.random(), kl_k1=kl, kl_k3=kl / 2,
                             prob_abs_diff_mean=kl / 10, prob_diff_max=kl, prob_diff_min=-kl, log_ratio_slope=0.0,
                             metrics={"reward": 0.5, "kl_k1": kl, "loss": -0.1, "grad_norm": 0.3}))
        with engine.begin() as c:
            c.execute(insert(RunStep), rows)
            c.execute(insert(Eval), [dict(run_id=f"r{i:05d}", step=t, benchmark=b, n=4, score=rng.random())
                                     for t in range(0, steps + 1, 50) for b in ("split", "synthetic-hard")])


def render(url: str) -> float:
    from streamlit.testing.v1 import AppTest

    os.environ["BENCH_DB_URL"] = url
    at = AppTest.from_file(APP, default_timeout=120)
    t0 = time.perf_counter()
    at.run()
    dt = time.perf_counter() - t0
    assert not at.exception, at.exception
    assert len(at.dataframe[0].value) > 0
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--db", default=None, help="store URL (default: a temporary SQLite file)")
    a = ap.parse_args()
    url = a.db or f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    t0 = time.perf_counter()
    fill(url, a.runs, a.steps)
    print(f"filled {a.runs} runs × {a.steps} steps in {time.perf_counter() - t0:.1f}s ({url.split(':')[0]})")
    from streamlit import cache_data

    cache_data.clear()
    cold = render(url)
    warm = render(url)
    print(f"leaderboard page: cold {cold:.2f}s, warm {warm:.2f}s; goal 2.00s → cold/goal {cold / 2:.2f}, "
          f"warm/goal {warm / 2:.2f}")


if __name__ == "__main__":
    main()
