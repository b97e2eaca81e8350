"""`bench tolerance`: how much training–inference mismatch an algorithm survives, searched over the
precision ladder (bench/ladder.py) with rollouts at each rung and fp32 training, so that the
rollout side alone sets the mismatch.

The search, for one algorithm over rungs r_0 (fp32) … r_{n−1} (e8m1), whose mismatch grows with
the index (tests/bench/test_ladder.py):

1. **Bisection with one seed** s_0 for the boundary between PASS and the rest: lo = −1 (no rung
   known to pass), hi = n (none known to fail); while hi − lo > 1, run mid = ⌊(lo + hi)/2⌋:
   PASS → lo = mid, else hi = mid. ⌈log2(n + 1)⌉ cells (4 for the 11-rung ladder).
2. **Every seed at the bracket**: the other seeds at lo and at hi. Where a seed does not pass at lo,
   the bracket steps down (hi = lo, lo − 1) and the seeds run there, until a rung where every seed
   passes, or none is left.
3. The **tolerance** is rung lo: the coarsest rung where every seed passed, with the seeds' count
   at hi beside it ("3/3 PASS at e8m5; 0/3 PASS at e8m4"). None when even fp32 does not pass.

Every cell is an ordinary stored run of `bench sweep` (runners/sweep.py `run_grid`): a finished
cell is not run again, so an interrupted search resumes where it stopped, and a second search of
the same algorithm at the same settings reads the first's runs. A cell that ends UNDECIDED
(`max_steps`) is extended (`bench runs extend`: runners/runs.py `extend_run`) to `extend_to`
steps when given, and counts as not passing while no rule decides it; futility stays on (the
preset's), so a hopeless rung stops early. Monotonicity is assumed, not forced: a seed that
passes above the tolerance is reported as it came.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from bench.statuses import FINISHED, MAX_STEPS, PASS, verdict


@dataclass(frozen=True)
class Probe:
    """One cell of the search: the rung, the seed, its verdict and run."""

    rung: str
    seed: int
    verdict: str
    status: str | None = None
    run: str | None = None


@dataclass
class Search:
    """The search's cells in the order they ran, and its answer (module docstring)."""

    rungs: list[str]
    seeds: list[int]
    probes: list[Probe] = field(default_factory=list)
    lo: int = -1                   # the coarsest rung where every seed passed (−1: none)
    hi: int | None = None          # the rung above it the search ran (None: lo is the last rung)

    def at(self, rung: str) -> list[Probe]:
        return [p for p in self.probes if p.rung == rung]

    @property
    def tolerance(self) -> str | None:
        return self.rungs[self.lo] if self.lo >= 0 else None

    def count(self, rung: str) -> str:
        """`k/n PASS` over the seeds run at `rung`."""
        got = self.at(rung)
        return f"{sum(p.verdict == PASS for p in got)}/{len(got)} PASS"


def search(rungs: list[str], seeds: list[int], probe: Callable[[str, int], Probe]) -> Search:
    """The tolerance search over `rungs` (finest first) with `seeds` (the first bisects), each cell
    run by `probe(rung, seed)` (module docstring); a cell is never probed twice."""
    if not rungs or not seeds:
        raise ValueError("a tolerance search needs rungs and seeds")
    out = Search(list(rungs), list(seeds))
    seen: dict[tuple[str, int], Probe] = {}

    def run(i: int, seed: int) -> bool:
        key = (rungs[i], seed)
        if key not in seen:
            seen[key] = probe(*key)
            out.probes.append(seen[key])
        return seen[key].verdict == PASS

    lo, hi = -1, len(rungs)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run(mid, seeds[0]):
            lo = mid
        else:
            hi = mid
    while lo >= 0 and not all([run(lo, s) for s in seeds]):     # every seed, not the first failing one
        hi, lo = lo, lo - 1
    if hi < len(rungs):
        for s in seeds:
            run(hi, s)
    out.lo, out.hi = lo, (hi if hi < len(rungs) else None)
    return out


def run_tolerance(store, algo: str, rungs: list[str], seeds: list[int], build_id: str | None, engine: str,
                  preset: str, overrides: dict, extend_to: int | None = None, log=print, device: str = "cpu",
                  ckpt_root=None, progress: bool = True) -> Search:
    """The search with each cell a stored native run at (rung → fp32) (module docstring)."""
    from bench.precision import Precision
    from bench.store import Run, session

    from .runs import extend_run
    from .sweep import cell_runs, plan_grid, run_grid

    def extended(pair: Precision, seed: int):
        """The cell's run already extended to `extend_to`, finished (the extension changed its budget)."""
        grid, [cell] = plan_grid(store, [algo], [pair], build_id, engine, preset,
                                 {**overrides, "max_steps": extend_to}, [seed], device=device)
        with session(store) as s:
            done = cell_runs(s, grid.build_id, algo, pair, grid.trainer, grid.k(cell), grid.recorded_engine,
                             grid.fingerprint(cell), FINISHED, seed)
            return (done[0].id, done[0].status) if done else None

    def probe(rung: str, seed: int) -> Probe:
        pair = Precision(rung, "fp32")
        got = extended(pair, seed) if extend_to else None
        if got is None:
            [res] = run_grid(store, [algo], [pair], build_id, engine, preset, overrides, log=log, seeds=[seed],
                             ckpt_root=ckpt_root, progress=progress, device=device)
            got = res["run"], res["status"].removesuffix(" (earlier)")
            if extend_to and got[1] == MAX_STEPS and got[0]:
                log(f"extend {algo} {pair.name} seed {seed} (run {got[0]}) to {extend_to} steps")
                extend_run(store, got[0], extend_to, device=device)
                with session(store) as s:
                    got = got[0], s.get(Run, got[0]).status
        p = Probe(rung, seed, verdict(got[1]) if got[1] else "NO VERDICT", got[1], got[0])
        log(f"{algo} {pair.name} seed {seed}: {p.verdict} ({p.status}, run {p.run})")
        return p

    return search(rungs, seeds, probe)
