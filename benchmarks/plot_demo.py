"""Draw split accuracy per step of chosen cells from the store: the README's picture.

    python benchmarks/plot_demo.py                                   # the demo's two controls
    python benchmarks/plot_demo.py --db sqlite:///demo.db --out docs/img/demo_split_accuracy.png
    python benchmarks/plot_demo.py --algo pg-seq-is --dtype fp16 --dtype "rollout=mxfp4,train=fp16" --build ID

One line per run of each cell (algorithm × precision pair) on one build: the split's avg@m at
every evaluation step (the `evals` rows with benchmark `split`), with the 0.95 pass target.
Default cells: pg-seq-is with fp16 rollouts (the positive control) and with mxfp4 rollouts
(the negative control), as `./bench.sh demo` runs them; default build: the newest build that
has a run of every chosen cell. Reads the store only (`--db`, else $BENCH_DB_URL or SQLite
under $BENCH_HOME).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlalchemy import select

from bench.precision import Precision
from bench.store import Build, Eval, Run, default_url, open_store, session

OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "demo_split_accuracy.png"
TARGET = 0.95
DEMO_DTYPES = ("fp16", "rollout=mxfp4,train=fp16")


def label(p: Precision) -> str:
    return f"{p.rollout} rollouts → {p.train} training"


def curves(url: str, algo: str, pairs: list[Precision], build: str | None) -> tuple[str, dict]:
    """The build used and {(pair, run id, seed): [(step, split accuracy), ...]} for every run of
    the cells on it, oldest run first."""
    engine = open_store(url)
    with session(engine) as s:
        runs = s.execute(select(Run).where(Run.algo == algo).order_by(Run.created_at)).scalars().all()
        runs = [r for r in runs if Precision(r.rollout_dtype, r.train_dtype) in pairs]
        if build is None:
            builds = s.execute(select(Build.id).order_by(Build.created_at.desc())).scalars().all()
            build = next((b for b in builds
                          if all(any(r.build_id == b and Precision(r.rollout_dtype, r.train_dtype) == p for r in runs)
                                 for p in pairs)), None)
            if build is None:
                raise SystemExit(f"no build has runs of {algo} at every one of {', '.join(map(str, pairs))}")
        out = {}
        for r in (r for r in runs if r.build_id == build):
            rows = s.execute(select(Eval.step, Eval.score).where(Eval.run_id == r.id, Eval.benchmark == "split")
                             .order_by(Eval.step)).all()
            if rows:
                out[(Precision(r.rollout_dtype, r.train_dtype), r.id, r.seed)] = [(int(a), float(b)) for a, b in rows]
    if not out:
        raise SystemExit(f"no split evaluations for {algo} at {', '.join(map(str, pairs))} on build {build}")
    return build, out


def plot(build: str, algo: str, pairs: list[Precision], data: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7.5, 3.6), dpi=120)
    colours = ["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown"]
    for i, p in enumerate(pairs):
        runs = [(k, v) for k, v in data.items() if k[0] == p]
        for j, ((_, _run, seed), points) in enumerate(runs):
            steps, acc = zip(*points)
            name = label(p) + ("" if len(runs) == 1 else f", seed {seed}")
            ax.plot(steps, acc, marker="o", ms=3, lw=1.6, color=colours[i % len(colours)],
                    alpha=1.0 if j == 0 else 0.55, label=name)
    ax.axhline(TARGET, color="0.35", ls="--", lw=1, label=f"pass target {TARGET}")
    ax.set_ylim(0.0, 1.0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("split accuracy (avg@m)")
    ax.set_title(f"{algo}: split accuracy per step (build {build[:12]})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=None,
                    help="SQLAlchemy URL of the store (default: $BENCH_DB_URL or $BENCH_HOME's SQLite)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"PNG to write (default: {OUT.relative_to(OUT.parents[2])})")
    ap.add_argument("--algo", default="pg-seq-is")
    ap.add_argument("--dtype", action="append", default=None,
                    help="a precision pair as bench run takes it (fp16, rollout=nvfp4,train=fp16); repeat for "
                         f"each cell (default: {' and '.join(DEMO_DTYPES)})")
    ap.add_argument("--build", default=None, help="build id (default: the newest with a run of every cell)")
    a = ap.parse_args(argv)
    pairs = [Precision.parse(d) for d in (a.dtype or DEMO_DTYPES)]
    build, data = curves(a.db or default_url(), a.algo, pairs, a.build)
    plot(build, a.algo, pairs, data, a.out)
    print(f"wrote {a.out}: {len(data)} runs of {a.algo} on build {build}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
