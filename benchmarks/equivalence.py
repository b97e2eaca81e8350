"""The equivalence protocol: did a deliberate change of arithmetic order leave what bench
measures where it was? (docs/development.md, "Changing the arithmetic")

    python benchmarks/equivalence.py BEFORE AFTER [--out DIR] [--parts ...] [--seeds 5] [--jobs 2]

BEFORE and AFTER are git revisions of this repository (or checkouts); each is checked out as a
worktree under --out and run with its own code (PYTHONPATH) in this environment, each in a
store of its own. One build, made by BEFORE, serves both sides, so a change to the engine cannot
move the split under the comparison. The parts, each decided by a rule written once below:

calibration  AFTER: the step-0 calibration gate passes at every one of the 35 pairs, on both
             16-bit kernel paths (BENCH_CPU_16BIT=none: bench's emulated kernels; =all: the
             native ones, as on a CPU that has them): `bench sweep --dtype all --max-steps 0`.
parity       AFTER: the verl cross-check (bench's seven losses and gradients against verl
             0.9.1's core_algos within its tolerance): tests/runners/test_verl_crosscheck.py.
             bench has no TRL parity test: TRL is only the speed baseline of train_step.py.
engines      AFTER: the engines still differ at every pair: tests/bench/engines/test_engine_mismatch.py.
mismatch     both: the offline table (`bench mismatch --dtype all`); at every pair KL k1 moves
             by less than its standard error or by at most ±15% (`mismatch_moves`), and the
             bf16 ÷ fp16 k3 ratio by at most ±15%.
seeds        both: pg-seq-is at fp16 and rollout=nvfp4,train=fp16 over --seeds seeds (every seed
             run to its end): each cell's verdict unchanged, and its steps (to the decision) and
             peak accuracy not different by an exact two-sided permutation test at 0.05
             (`seed_cells`). Single seeds may move: a changed rounding changes a trajectory.

Writes --out/equivalence.json and prints one line per check; exit 0 when every check holds,
1 when one does not. Each part's work is kept under --out: a rerun reuses what finished (the
sweeps skip finished (cell, seed) pairs), so a stopped protocol resumes. On 2 cores the seeds
part is the long one (two cells × 5 seeds × ~50–100 steps, per side).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.precision import ALL_PAIRS  # noqa: E402
from bench.stats import permutation_p  # noqa: E402
from bench.statuses import EVALUATED, FINISHED, MAX_STEPS  # noqa: E402

PARTS = ("calibration", "parity", "engines", "mismatch", "seeds")
CELLS = "fp16;rollout=nvfp4,train=fp16"
REL = 0.15                       # the table's and the ratio's relative tolerance
ALPHA = 0.05                     # the seeds' permutation tests


# ------------------------------------------------------------------------------ the rules


def moved_ok(before: float, after: float, se: float, rel: float = REL) -> bool:
    """A number holds when |after − before| < se (its own standard error) or ≤ rel·|before|."""
    d = abs(after - before)
    return d < se or d <= rel * abs(before)


def mismatch_moves(before: list[dict], after: list[dict], rel: float = REL) -> list[dict]:
    """One row per pair of the offline table (`bench mismatch --json` rows): KL k1 before and
    after, the larger of the two standard errors, and whether it held (`moved_ok`); then the
    bf16 ÷ fp16 k3 ratio (the rows rollout=train=bf16 and =fp16), held when within ±rel. A
    pair on one side only is a failed row."""
    key = lambda r: f"{r['rollout']}/{r['train']}"  # noqa: E731
    b, a = {key(r): r for r in before}, {key(r): r for r in after}
    rows = []
    for pair in sorted(b.keys() | a.keys()):
        if pair not in b or pair not in a:
            rows.append({"check": f"mismatch {pair}", "ok": False, "detail": "on one side only"})
            continue
        se = max(b[pair]["kl_k1_stderr"], a[pair]["kl_k1_stderr"])
        rows.append({"check": f"mismatch {pair}", "ok": moved_ok(b[pair]["kl_k1"], a[pair]["kl_k1"], se, rel),
                     "before": b[pair]["kl_k1"], "after": a[pair]["kl_k1"], "se": se})
    if {"bf16/bf16", "fp16/fp16"} <= b.keys() & a.keys():
        rb, ra = (s["bf16/bf16"]["kl_k3"] / s["fp16/fp16"]["kl_k3"] for s in (b, a))
        rows.append({"check": "mismatch bf16÷fp16 k3", "ok": moved_ok(rb, ra, 0.0, rel), "before": rb, "after": ra})
    return rows


def seed_cells(before: list[dict], after: list[dict], verdicts: tuple[dict, dict], alpha: float = ALPHA) -> list[dict]:
    """Per cell (its `precision`), from `bench runs --json` rows of finished runs on each side:
    the steps each seed ran (to its decision or limit) and its peak accuracy, compared by
    `permutation_p` (held when p ≥ alpha), and the cell's verdict (`bench report --json`'s
    `sanity`, in `verdicts` as {precision: sanity} per side), held when equal."""
    rows = []
    for cell in sorted({r["precision"] for r in before} | {r["precision"] for r in after}):
        sides = [[r for r in runs if r["precision"] == cell] for runs in (before, after)]
        for metric in ("steps", "peak_accuracy"):
            xs, ys = ([r[metric] for r in side] for side in sides)
            p = permutation_p(xs, ys)
            rows.append({"check": f"seeds {cell} {metric}", "ok": bool(xs and ys) and p >= alpha, "p": p,
                         "before": xs, "after": ys})
        vb, va = (v.get(cell) for v in verdicts)
        rows.append({"check": f"seeds {cell} verdict", "ok": vb is not None and vb == va, "before": vb, "after": va})
    return rows


# ------------------------------------------------------------------------------ running each side


def commit_of(rev: str) -> str | None:
    """The commit `rev` names in this repository, or None."""
    r = subprocess.run(["git", "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"], cwd=ROOT, text=True,
                       capture_output=True)
    return r.stdout.strip() if r.returncode == 0 else None


def checkout(rev: str, out: Path) -> Path:
    """A directory holding `rev`: the directory itself when it is one, else a worktree of the
    commit under out/trees (made once)."""
    if Path(rev).is_dir():
        return Path(rev).resolve()
    sha = commit_of(rev)
    tree = out / "trees" / sha[:12]
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), sha], cwd=ROOT, check=True)
    return tree


class Side:
    """One revision's worktree, run with its own code in this Python environment."""

    def __init__(self, name: str, tree: Path, out: Path):
        self.name, self.tree, self.out = name, tree, out

    def env(self, home: Path, **extra) -> dict:
        return {**os.environ, "PYTHONPATH": str(self.tree), "BENCH_HOME": str(home), **extra}

    def bench(self, home: Path, *args: str, **extra) -> subprocess.CompletedProcess:
        """`bench ARGS` with this side's code and store; its progress (stderr) goes to a log under
        --out as it runs (`tail -f` it), its stdout is returned."""
        log = self.out / "logs" / f"{self.name}-{args[0]}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"$ bench {' '.join(args)}\n")
            f.flush()
            r = subprocess.run([sys.executable, "-m", "bench.cli", *args], cwd=self.tree, env=self.env(home, **extra),
                               stdout=subprocess.PIPE, stderr=f, text=True)
            f.write(f"(exit {r.returncode})\n")
        r.stderr = log.read_text()[-3000:]
        return r

    def json(self, home: Path, *args: str, **extra):
        r = self.bench(home, *args, "--json", **extra)
        if r.returncode:
            raise RuntimeError(f"{self.name}: bench {' '.join(args)} exited {r.returncode}:\n{r.stderr}")
        return json.loads(r.stdout)

    def pytest(self, *args: str) -> dict:
        """pytest ARGS in this side's tree, every service required (a test that would skip for
        want of verl or vLLM fails: a skipped check is not a held one); verl's environment is
        this checkout's .venv-verl unless BENCH_VERL_PYTHON names one."""
        verl = os.environ.get("BENCH_VERL_PYTHON") or str(ROOT / ".venv-verl" / "bin" / "python")
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=self.tree,
                           env=self.env(self.out / "pytest-home", BENCH_TEST_SERVICES="require",
                                        BENCH_VERL_PYTHON=verl), capture_output=True, text=True)
        tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-500:]
        return {"check": f"pytest {' '.join(args)}", "ok": r.returncode == 0, "detail": tail}


def home_from(base: Path, home: Path) -> Path:
    """A store of its own that starts from the shared build (a copy of `base`, once)."""
    if not home.exists():
        shutil.copytree(base, home)
    return home


def calibration(after: Side, base: Path, out: Path, jobs: int) -> list[dict]:
    rows = []
    for path in ("none", "all"):
        home = home_from(base, out / f"calibration-{path}")
        after.bench(home, "sweep", "--algo", "pg-seq-is", "--dtype", "all", "--max-steps", "0", "--jobs", str(jobs),
                    "--threads", "1", BENCH_CPU_16BIT=path)
        runs = after.json(home, "runs", BENCH_CPU_16BIT=path)
        bad = sorted(r["precision"] for r in runs if r["status"] not in (EVALUATED, MAX_STEPS))   # MAX_STEPS: before
        rows.append({"check": f"calibration, 16-bit kernels {path}", "ok": len(runs) == len(ALL_PAIRS) and not bad,
                     "detail": f"{len(runs)} pairs, not passed: {', '.join(bad) or 'none'}"})
    return rows


def offline_table(side: Side, base: Path, out: Path, limit: int, n: int) -> list[dict]:
    """`bench mismatch --dtype all --json` on this side: one row per pair."""
    return side.json(home_from(base, out / f"mismatch-{side.name}"), "mismatch", "--model", "tiny-math", "--dtype",
                     "all", "--limit", str(limit), "--n", str(n))


def seeds_of(side: Side, base: Path, out: Path, seeds: int, jobs: int) -> tuple[list[dict], dict]:
    home = home_from(base, out / f"seeds-{side.name}")
    side.bench(home, "sweep", "--algo", "pg-seq-is", "--dtype", CELLS, "--seeds", str(seeds), "--all-seeds",
               "--jobs", str(jobs), "--threads", "1")
    runs = [r for r in side.json(home, "runs") if r["status"] in FINISHED]
    cells = side.json(home, "report")["cells"]
    return runs, {c["precision"]: c["sanity"] for c in cells}


def seeds_both(before: Side, after: Side, base: Path, out: Path, seeds: int, jobs: int):
    """`seed_cells`' arguments: each side's finished runs, then both sides' verdicts."""
    (rb, vb), (ra, va) = (seeds_of(s, base, out, seeds, jobs) for s in (before, after))
    return rb, ra, (vb, va)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("before", help="git revision (or checkout) before the change")
    ap.add_argument("after", help="git revision (or checkout) with the change")
    ap.add_argument("--out", type=Path, default=ROOT / ".equivalence", help="work and results (default .equivalence/)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per cell in the seeds part (default 5)")
    ap.add_argument("--jobs", type=int, default=2, help="cells at once in the sweeps (default 2)")
    ap.add_argument("--limit", type=int, default=100, help="problems of the offline table (bench mismatch's default)")
    ap.add_argument("--n", type=int, default=32, help="responses per problem of the offline table")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := sorted(set(parts) - set(PARTS)):
        print(f"--parts: unknown {', '.join(unknown)} (the parts: {', '.join(PARTS)})", file=sys.stderr)
        return 2
    if "seeds" in parts and args.seeds < 2:
        print("--seeds: at least 2 (a permutation test of one seed a side decides nothing)", file=sys.stderr)
        return 2
    if bad := [r for r in (args.before, args.after) if not Path(r).is_dir() and commit_of(r) is None]:
        print(f"{bad[0]!r} is neither a revision of {ROOT} nor a directory", file=sys.stderr)
        return 2
    out = args.out.resolve()
    before, after = (Side(name, checkout(rev, out), out) for name, rev in (("before", args.before),
                                                                           ("after", args.after)))
    base = out / "build"
    if not (base / "done").exists():
        before.json(base, "build", "--model", "tiny-math", "--engine", "torch")
        (base / "done").write_text("")

    steps = {
        "calibration": lambda: calibration(after, base, out, args.jobs),
        "parity": lambda: [after.pytest("tests/runners/test_verl_crosscheck.py")],
        "engines": lambda: [after.pytest("tests/bench/engines/test_engine_mismatch.py")],
        "mismatch": lambda: mismatch_moves(*(offline_table(s, base, out, args.limit, args.n) for s in (before, after))),
        "seeds": lambda: seed_cells(*seeds_both(before, after, base, out, args.seeds, args.jobs)),
    }
    rows: list[dict] = []
    for part in PARTS:
        if part in parts:
            print(f"== {part} (logs under {out / 'logs'})", flush=True)
            rows += steps[part]()
    for r in rows:
        print(f"{'ok ' if r['ok'] else 'NOT'}  {r['check']}  " +
              "  ".join(f"{k} {v}" for k, v in r.items() if k not in ("check", "ok")))
    (out / "equivalence.json").write_text(json.dumps({"before": str(before.tree), "after": str(after.tree),
                                                      "parts": parts, "rows": rows}, indent=1))
    held = all(r["ok"] for r in rows)
    print(f"{sum(r['ok'] for r in rows)}/{len(rows)} checks hold: {'equivalent' if held else 'NOT equivalent'}"
          f" ({out / 'equivalence.json'})")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
