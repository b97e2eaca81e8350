"""Draw the tolerance grid of stored ladder cells: docs/results.md's picture of `bench tolerance`.

    python benchmarks/plot_tolerance.py                                  # the store's ladder cells
    python benchmarks/plot_tolerance.py --bundle benchmarks/results/tolerance/*.tar.gz \\
        --out docs/img/tolerance.png

One row per algorithm and table (build, engine and settings, as the static site's tables; a build is
one machine's split; rows of several tables say which), one column per rung of the precision ladder
(rollouts at the rung, fp32 training: bench/ladder.py), finest on the left. A square is one cell
over its seeds, coloured by the share of seeds that PASSed, with its verdict mark and k/N; blank
where the search did not run that rung (it bisects). The tolerance, the coarsest rung whose cell
PASSes on every seed as `bench tolerance` answers it, is outlined. The tables are
leaderboard/tolerance.py's (`ladder_tables`: native, non-stale runs; an extended seed stays in its
rung's cell).

`--bundle` reads run bundles (`bench runs export`) into a scratch SQLite store instead of `--db`:
a search's runs outlive the machine that ran them that way.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "tolerance.png"


def grid(ladder: pd.DataFrame, tol: pd.DataFrame, label: str = "") -> list[dict]:
    """The squares of one build's grid: for every (algorithm, rung) cell of `ladder`
    (leaderboard/tolerance.ladder_frame) a dict with its row label, rung, pass rate, text (verdict
    mark and k/N), verdict and whether it is the algorithm's tolerance (`tol`: leaderboard/tolerance.tolerances)."""
    from leaderboard.colours import VERDICT_MARKS

    at = dict(zip(tol.algo, tol.tolerance))
    return [{"row": f"{c.algo}{label}", "rung": c.rung, "pass_rate": float(c.pass_rate), "sanity": c.sanity,
             "text": f"{VERDICT_MARKS.get(c.sanity, '')} {c.passes}", "tolerance": at.get(c.algo) == c.rung}
            for c in ladder.itertuples(index=False)]


def row_order(squares: list[dict]) -> list[str]:
    """Rows from the most tolerant (coarsest tolerance) to the least, then those with none; ties by name."""
    from bench.formats import LADDER

    def key(row: str) -> tuple[int, str]:
        t = [LADDER.index(s["rung"]) for s in squares if s["row"] == row and s["tolerance"]]
        return (-t[0] if t else 1, row)

    return sorted({s["row"] for s in squares}, key=key)


def squares_of(engine) -> tuple[list[dict], list[str]]:
    """Every tolerance table's squares in the store (leaderboard/tolerance.ladder_tables: per build,
    engine and settings), and the rungs any of them ran (finest first)."""
    from bench.formats import LADDER
    from leaderboard.queries import runs_frame
    from leaderboard.tolerance import ladder_tables

    tables = ladder_tables(runs_frame(engine))
    out = []
    for (build, eng, fp), ladder, tol in tables:
        out += grid(ladder, tol, f" ({build[:8]} · {eng} · {str(fp)[:6]})" if len(tables) > 1 else "")
    return out, [r for r in LADDER if r in {s["rung"] for s in out}]


def plot(squares: list[dict], rungs: list[str], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.patches import Rectangle

    from leaderboard.colours import VERDICT_COLOURS

    rows = row_order(squares)
    cmap = LinearSegmentedColormap.from_list("pass", ["#d73027", "#fee08b", "#1a9850"])

    def fill(s: dict):      # a cell still running or with no verdict has no pass rate to show yet
        return VERDICT_COLOURS[s["sanity"]][0] if s["sanity"] in ("RUNNING", "NO VERDICT") else cmap(s["pass_rate"])

    fig, ax = plt.subplots(figsize=(max(6.5, 1.6 + 0.95 * len(rungs)), 1.4 + 0.42 * len(rows)), dpi=120)
    for s in squares:
        x, y = rungs.index(s["rung"]), rows.index(s["row"])
        ax.add_patch(Rectangle((x - 0.46, y - 0.42), 0.92, 0.84, facecolor=fill(s),
                               edgecolor="black" if s["tolerance"] else "white", lw=2.4 if s["tolerance"] else 1))
        ax.text(x, y, s["text"], ha="center", va="center", fontsize=8)
    ax.set_xlim(-0.5, len(rungs) - 0.5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xticks(range(len(rungs)), rungs, fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("rollout rung (→ fp32 training), finer → coarser", fontsize=8)
    ax.set_title(textwrap.fill(title, int(15 * fig.get_figwidth())), fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from bench.bundle import import_bundle
    from bench.store import default_url, open_store

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=None,
                    help="SQLAlchemy URL of the store (default: $BENCH_DB_URL or $BENCH_HOME's SQLite)")
    ap.add_argument("--bundle", type=Path, nargs="+", default=None,
                    help="run bundles to read into a scratch store instead of --db")
    ap.add_argument("--out", type=Path, default=OUT, help=f"PNG to write (default: {OUT.relative_to(OUT.parents[2])})")
    ap.add_argument("--title", default="Tolerance: each algorithm's cells down the precision ladder (✓ PASS, "
                                       "✗ FAIL, ? UNDECIDED, … running; k/N seeds passed; outlined: the tolerance)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if a.bundle:
            engine = open_store(f"sqlite:///{tmp}/bundles.db")
            for b in a.bundle:
                import_bundle(engine, b)
        else:
            engine = open_store(a.db or default_url(), migrate=False)
        squares, rungs = squares_of(engine)
        engine.dispose()
    if not squares:
        print("no cell on the precision ladder in the store (bench tolerance runs them)", file=sys.stderr)
        return 2
    plot(squares, rungs, a.title, a.out)
    passed = sum(s["tolerance"] for s in squares)
    print(f"wrote {a.out}: {len(squares)} cells, {len(row_order(squares))} rows, {passed} with a tolerance, "
          f"rungs {', '.join(rungs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
