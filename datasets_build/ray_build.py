"""`bench build --ray`: the shards of one build as Ray tasks, then `merge_shards`.

One task per shard, each holding one rollout engine: a whole GPU per task on a cluster with
GPUs, one CPU (and `threads` torch threads) per task otherwise. Every task writes its rollouts
to the same store, exactly as `bench build --shard i/n` run by hand on n machines, so the
store must be reachable from every node (PostgreSQL for a cluster; a SQLite file serves one
machine). Samples are seeded per (problem, sample): the merged split equals the unsharded
build's. A failed shard leaves its rows; `--ray --resume` finishes only what is missing.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable

from bench.store import bench_home, open_store

from .builder import BuildConfig, BuildError, run_build
from .merge import merge_shards


def _build_shard(store_url: str, cfg: BuildConfig) -> dict:
    """Runs inside a Ray worker."""
    m = run_build(open_store(store_url), cfg)
    return {"build_id": m["build_id"], "shard": cfg.shard, "problems": m["problems"], "rollouts": m["rollouts"]}


def ray_build(store_url: str, cfg: BuildConfig, shards: int | None = None, address: str | None = None,
              on_shard: Callable[[dict, int, int], None] | None = None) -> dict:
    """Build `shards` shards (default: one per GPU, else one per CPU of the cluster) as Ray
    tasks on the cluster at `address` ($RAY_ADDRESS; a local instance when neither is set),
    merge them and return the merged manifest. `on_shard(result, done, n)` reports progress."""
    try:
        import ray
    except ImportError:
        raise BuildError("--ray needs Ray: pip install 'bench[ray]'") from None
    if cfg.shard:
        raise BuildError("--ray makes the shards itself; drop --shard")
    if shards is not None and shards < 1:
        raise BuildError("--shards must be >= 1")
    open_store(store_url)                      # migrate once, before the workers connect
    started = not ray.is_initialized()
    if started:
        ray.init(address=address or os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"BENCH_HOME": str(bench_home())}})
    try:
        res = ray.cluster_resources()
        gpus = int(res.get("GPU", 0))
        n = shards or gpus or max(1, int(res.get("CPU", 1)))
        task = ray.remote(num_gpus=1, num_cpus=0, max_retries=0)(_build_shard) if gpus else \
            ray.remote(num_cpus=1, max_retries=0)(_build_shard)
        pending = [task.remote(store_url, replace(cfg, shard=f"{i}/{n}", out=None, force=False,
                                                  device="cuda" if gpus else "cpu"))     # each task sees its one GPU
                   for i in range(n)]
        results = []
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                results.append(ray.get(ready[0]))
            except ray.exceptions.RayTaskError as e:
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise BuildError(f"a shard failed; fix the cause and rerun with --resume: {e.cause}") from None
            if on_shard:
                on_shard(results[-1], len(results), n)
    finally:
        if started:
            ray.shutdown()
    return merge_shards(open_store(store_url), [r["build_id"] for r in results], cfg.out)
