"""Mutation testing of bench's core modules with cosmic-ray (`pip install -e ".[dev]"`).

    python tools/mutation.py                      # every module below (hours on 1 core: see docs/development.md)
    python tools/mutation.py bench/stop.py ...  # some of them
    python tools/mutation.py --list               # the modules and the tests that cover each
    python tools/mutation.py --rerun-survivors M  # only the last session's survivors of M, e.g. after new tests

Each module is mutated in a scratch copy of the working tree (never in place: cosmic-ray edits
the file it mutates), one mutant at a time, and only the tests mapped to it below are run,
stopping at the first failure (`pytest -x`). A mutant is *killed* when those tests fail,
*survives* when they pass, and is *incompetent* when it cannot be imported; a test run over
`--timeout` seconds counts as killed (cosmic-ray's convention). The operator set is a core one
(EXCLUDE keeps): arithmetic swaps, comparison boundaries and negations, and/or, True/False, numbers
±1, `not` added to conditions, loops run zero times, break/continue, exception handlers that
catch nothing; not every-operator-to-every-operator (cosmic-ray's default makes ~10× more
mutants, most of them trivially killed).

Writes, under --out (default .mutation/): per module its cosmic-ray session (<name>.sqlite) and
survivors with their diffs (<name>.survivors.md), and summary.md (the score table).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The modules mutated. Each is covered by its tests where the layout puts them (`mirror`:
# tests/<package>/test_<module>.py, when it exists) and by the further tests or pytest arguments
# listed beside it (node ids, -m / -k expressions).
MUTATED: dict[str, list[str]] = {
    "runners/algos.py": [],
    "bench/mismatch.py": [],
    "bench/formats.py": ["tests/bench/test_mxfp4.py", "-m", "not vllm"],
    "bench/quantizers.py": ["tests/bench/test_formats.py", "tests/bench/test_mxfp4.py", "-m", "not vllm"],
    "bench/gemms.py": ["tests/bench/test_formats.py", "tests/bench/test_rollout_kernels.py", "-m", "not vllm"],
    "bench/grids.py": ["tests/bench/test_formats.py", "tests/bench/test_mxfp4.py", "-m", "not vllm"],
    "bench/stop.py": [],
    "bench/stats.py": [],
    "bench/calibration.py": ["-m", "not integration"],
    "runners/staleness.py": ["tests/runners/test_staleness_metrics.py", "tests/runners/test_weight_queue.py",
                             "tests/runners/test_staleness.py::test_rollouts_use_the_weights_of_k_updates_ago"],
    "leaderboard/cells.py": ["tests/leaderboard/test_cell_helpers.py", "tests/leaderboard/test_seeds.py",
                             "tests/leaderboard/test_report_summary.py", "-m", "not integration"],
    "leaderboard/summary.py": ["tests/leaderboard/test_summary_helpers.py", "tests/leaderboard/test_report_summary.py"],
    "bench/bundle.py": ["tests/bench/test_bundle_export.py", "-m", "not postgres"],
    "bench/engines/torch_engine.py": ["tests/bench/engines/test_kv_cache.py",    # decoding, the cache, shared prefill
                                      # an MoE model's routes, recorded only when asked
                                      "tests/bench/test_moe.py::test_the_rollout_engine_records_a_route_for_every_"
                                      "position_it_ran"],
    "bench/router_metrics.py": ["tests/bench/test_moe.py", "-k", "router or at_positions or replayed"],
}
# where the mirror's other tests take minutes a mutant (real runs, the app): only the tests listed run
NO_MIRROR = {"runners/staleness.py": "its mirror trains real runs", "leaderboard/cells.py": "its mirror drives the app"}


def mirror(module: str) -> Path:
    """Where the layout puts a module's tests: bench/stop.py → tests/bench/test_stop.py."""
    m = Path(module)
    return ROOT / "tests" / m.parent / f"test_{m.stem}.py"


def tests_of(module: str) -> list[str]:
    """The pytest arguments that cover `module`: its mirror (where it exists and is not left
    out), then the tests and arguments MUTATED lists."""
    own = mirror(module)
    listed = MUTATED[module]
    use = own.exists() and module not in NO_MIRROR and str(own.relative_to(ROOT)) not in listed
    return ([str(own.relative_to(ROOT))] if use else []) + listed


KEEP_BINARY = ("Add_Sub", "Sub_Add", "Mul_Div", "Div_Mul", "Pow_Mul", "FloorDiv_Div", "Mod_FloorDiv")
KEEP_COMPARE = ("Lt_LtE", "LtE_Lt", "Gt_GtE", "GtE_Gt", "Eq_NotEq", "NotEq_Eq", "Is_IsNot", "IsNot_Is",
                "In_NotIn", "NotIn_In")
KEEP_UNARY = ("USub_UAdd", "Delete_Not")
EXCLUDE = [rf"core/ReplaceBinaryOperator_(?!({'|'.join(KEEP_BINARY)})$).*",
           rf"core/ReplaceComparisonOperator_(?!({'|'.join(KEEP_COMPARE)})$).*",
           rf"core/ReplaceUnaryOperator_(?!({'|'.join(KEEP_UNARY)})$).*",
           r"core/VariableReplacer", r"core/VariableInserter", r"core/RemoveDecorator"]


def scratch_copy(dest: Path) -> None:
    """The working tree (tracked and untracked, not ignored files) copied to `dest`."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        src = ROOT / f.decode()
        if src.is_file():
            (dest / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f.decode())


def config(module: str, tests: list[str], timeout: float) -> str:
    cmd = " ".join([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                    *[f"'{t}'" if " " in t else t for t in tests]])
    excl = ", ".join(f"'{e}'" for e in EXCLUDE)
    return (f'[cosmic-ray]\nmodule-path = "{module}"\ntimeout = {timeout}\nexcluded-modules = []\n'
            f'test-command = "{cmd}"\n\n[cosmic-ray.distributor]\nname = "local"\n\n'
            f'[cosmic-ray.filters.operators-filter]\nexclude-operators = [{excl}]\n')


def run_module(module: str, work: Path, out: Path, timeout: float, rerun: bool = False) -> dict:
    """Mutate `module` and run its tests on each mutant; with `rerun`, keep the last session's
    mutants and verdicts and re-run only its survivors (against the tests as they are now)."""
    import sqlite3

    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    name = module.replace("/", ".").removesuffix(".py")
    cfg, db = work / f"{name}.toml", out / f"{name}.sqlite"
    cfg.write_text(config(module, tests_of(module), timeout))
    if rerun and not db.exists():
        raise SystemExit(f"{module}: no earlier session {db} to re-run the survivors of")
    if not rerun:
        db.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(work), "OMP_NUM_THREADS": "1",
           "BENCH_HOME": tempfile.mkdtemp(prefix="bench-mut-home-")}
    t0 = time.time()
    base = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests_of(module)],
                          cwd=work, env=env, capture_output=True, text=True)
    baseline_s = time.time() - t0
    if base.returncode != 0:
        raise SystemExit(f"{module}: its tests fail unmutated:\n{base.stdout[-2000:]}")
    cr = [sys.executable, "-m", "cosmic_ray.cli"]              # the `cosmic-ray` command
    if rerun:                                                   # survivors become pending again
        with sqlite3.connect(db) as c:
            c.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED'")
    else:
        subprocess.run([*cr, "init", str(cfg), str(db)], cwd=work, env=env, check=True)
        subprocess.run([sys.executable, "-m", "cosmic_ray.tools.filters.operators_filter", str(db), str(cfg)],
                       cwd=work, env=env, check=True)
    t0 = time.time()
    subprocess.run([*cr, "exec", str(cfg), str(db)], cwd=work, env=env, check=True)
    exec_s = time.time() - t0
    counts = {"killed": 0, "survived": 0, "incompetent": 0}
    survivors = []
    with use_db(str(db), WorkDB.Mode.open) as wdb:
        for item, result in wdb.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:          # an operator outside the core set
                continue
            outcome = {TestOutcome.KILLED: "killed", TestOutcome.SURVIVED: "survived"}.get(result.test_outcome,
                                                                                         "incompetent")
            counts[outcome] += 1
            if outcome == "survived":
                m = item.mutations[0]
                survivors.append((m.start_pos[0], m.operator_name, result.diff))
    survivors.sort()
    lines = [f"# Surviving mutants of {module}\n"]
    for line, op, diff in survivors:
        lines += [f"## line {line}: {op}\n", "```diff", diff.strip(), "```\n"]
    (out / f"{name}.survivors.md").write_text("\n".join(lines))
    competent = counts["killed"] + counts["survived"]
    return {"module": module, **counts, "score": counts["killed"] / competent if competent else 1.0,
            "baseline_s": baseline_s, "exec_s": exec_s, "survivors": survivors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="modules to mutate (default: all of MUTATED)")
    ap.add_argument("--out", type=Path, default=ROOT / ".mutation")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for one mutant's test run")
    ap.add_argument("--rerun-survivors", action="store_true",
                    help="re-run only the survivors of the last session in --out (after adding tests)")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for m in MUTATED:
            print(f"{m}: {' '.join(tests_of(m))}")
        return
    mods = a.modules or list(MUTATED)
    unknown = [m for m in mods if m not in MUTATED]
    if unknown:
        raise SystemExit(f"not mapped to tests: {', '.join(unknown)} (see MUTATED in {__file__})")
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-mutation-") as tmp:
        work = Path(tmp)
        scratch_copy(work)
        for m in mods:
            r = run_module(m, work, a.out, a.timeout, a.rerun_survivors)
            rows.append(r)
            print(f"{m}: {r['killed']} killed, {r['survived']} survived, {r['incompetent']} incompetent, "
                  f"score {r['score']:.1%}, {r['exec_s']:.0f} s", flush=True)
    table = ["| module | mutants | killed | survived | incompetent | score | time (s) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        n = r["killed"] + r["survived"] + r["incompetent"]
        table.append(f"| {r['module']} | {n} | {r['killed']} | {r['survived']} | {r['incompetent']} | "
                     f"{r['score']:.1%} | {r['exec_s']:.0f} |")
    k, s = sum(r["killed"] for r in rows), sum(r["survived"] for r in rows)
    table.append(f"| **all** | | {k} | {s} | | {k / max(1, k + s):.1%} | {sum(r['exec_s'] for r in rows):.0f} |")
    (a.out / "summary.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
