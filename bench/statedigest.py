"""Digests of a run's training state, chained over its evaluations.

At every evaluation the native trainer records the sha256 of its state — the fp32 master
weights, the optimizer's state, the loss scaler, both RNGs and the staleness queue: everything
a checkpoint restores — and a chain over those digests:

    digest_k = sha256(canonical bytes of the state after step s_k)
    chain_k  = sha256("s_k:digest_k:chain_{k−1}"),   chain_0's predecessor = sha256("bench-state-chain:RUN_ID")

A checkpoint kept at step A can then be shown to be the run's own state at A (its digest equals
the chain's), a window A..B re-run from it can be compared with the run's state at B, and a
chain edited anywhere no longer links (`check_chain`). The chain binds the digests to the run
and to each other; it does not sign them (a signature does: bench/signing.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

GENESIS = "bench-state-chain:"


def kept_checkpoint(ckpt_dir: str | Path, step: int) -> Path:
    """Where a run keeps the checkpoint of `step` (`bench run --keep-checkpoints`), under its
    checkpoint directory."""
    return Path(ckpt_dir) / "kept" / f"step-{step:06d}.pt"


def checkpoint_digest(state: dict) -> str:
    """The state digest of a checkpoint's dict (its bookkeeping — step, wall time, stop-rule
    state — left out): what the run recorded at that step."""
    return state_digest({k: v for k, v in state.items() if k not in ("step", "wall", "stop")})


def _feed(h, obj) -> None:
    """Canonical bytes of a nested state: dicts by sorted key, sequences in order, tensors as
    dtype, shape and raw bytes, scalars by repr."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k in sorted(obj, key=str):
            h.update(f"K{k!s}".encode())
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for x in obj:
            _feed(h, x)
    else:
        h.update(f"S{obj!r}".encode())


def state_digest(state: dict) -> str:
    """sha256 (hex) of a training state (a checkpoint's dict without its bookkeeping)."""
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()


def genesis(run_id: str) -> str:
    return hashlib.sha256(f"{GENESIS}{run_id}".encode()).hexdigest()


def link(prev: str, step: int, digest: str) -> str:
    """The chain value after the digest of step `step`."""
    return hashlib.sha256(f"{step}:{digest}:{prev}".encode()).hexdigest()


def check_chain(run_id: str, rows: list[tuple[int, str, str]]) -> str | None:
    """None when the (step, digest, chain) rows, in step order, link from the run's genesis;
    else where they do not, in words."""
    prev = genesis(run_id)
    last = -1
    for step, digest, chain in rows:
        if step <= last:
            return f"step {step} comes after step {last} in the chain"
        if link(prev, step, digest) != chain:
            return f"the chain does not link at step {step}"
        prev, last = chain, step
    return None
