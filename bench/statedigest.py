"""Digests of a run's training state, chained over its evaluations.

At every evaluation the native trainer records the sha256 of its state — the fp32 master
weights, the optimizer's state, the loss scaler and the staleness queue: everything a checkpoint
restores, each a function of the run's settings and seed — and a chain over those digests:

    digest_k = sha256(canonical bytes of the state after step s_k)
    chain_k  = sha256("s_k:digest_k:chain_{k−1}")              (scheme 1)
    chain_k  = sha256("s_k:scheme S:digest_k:chain_{k−1}")     (scheme S ≥ 2: the scheme is chained too)
    chain_0's predecessor = sha256("bench-state-chain:RUN_ID")

A checkpoint kept at step A can then be shown to be the run's own state at A (its digest equals
the chain's), a window A..B re-run from it can be compared with the run's state at B, and a
chain edited anywhere no longer links (`check_chain`). The chain binds the digests to the run
and to each other; it does not sign them (a signature does: bench/signing.py).

Digest schemes (`SCHEME`, recorded with every digest, `run_digests.scheme`):

    1  (runs before 2026-12-04) also hashed the process-wide torch and Python RNG states. Neither
       is a function of the run: torch 2.13 seeds its default generator from the OS at import
       (`torch.initial_seed()` differs between two interpreters) and Python seeds `random` from
       os.urandom at start, and bench draws from neither (its sampling, shuffling and batch
       orders use generators seeded from the run's seed), so a run re-run in another process
       had the same weights, optimizer and metrics and another digest. A scheme-1 digest is
       compared only with a scheme-1 state: a kept checkpoint of such a run still hashes to it
       (`checkpoint_digest(state, 1)`), a re-run's new digests are "not comparable".
    2  the state without the process-wide RNGs (`PROCESS_RNG_KEYS`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

GENESIS = "bench-state-chain:"
SCHEME = 2                                    # the scheme the trainer records now
SCHEMES = (1, 2)
PROCESS_RNG_KEYS = ("rng_torch", "rng_python")   # scheme 1's process-wide RNG states
BOOKKEEPING_KEYS = ("step", "wall", "stop")       # a checkpoint's, never hashed


def kept_checkpoint(ckpt_dir: str | Path, step: int) -> Path:
    """Where a run keeps the checkpoint of `step` (`bench run --keep-checkpoints`), under its
    checkpoint directory."""
    return Path(ckpt_dir) / "kept" / f"step-{step:06d}.pt"


def left_out_keys(scheme: int = SCHEME) -> frozenset[str]:
    """The checkpoint keys a digest of `scheme` leaves out: the bookkeeping always, the
    process-wide RNG states from scheme 2 on."""
    if scheme not in SCHEMES:
        raise ValueError(f"state digest scheme {scheme!r} is not one this bench knows ({SCHEMES})")
    return frozenset(BOOKKEEPING_KEYS + (PROCESS_RNG_KEYS if scheme >= 2 else ()))


def checkpoint_digest(state: dict, scheme: int = SCHEME) -> str:
    """The state digest of a checkpoint's dict under `scheme` (its bookkeeping — step, wall
    time, stop-rule state — left out; from scheme 2 on also any process-wide RNG state an older
    checkpoint carries): what the run recorded at that step."""
    left_out = left_out_keys(scheme)
    return state_digest({k: v for k, v in state.items() if k not in left_out})


def checkpoint_keys(scheme: int = SCHEME) -> frozenset[str]:
    """What a checkpoint whose step a digest of `scheme` recorded must hold (the trainer's
    save_checkpoint): scheme 1's checkpoints also held the process-wide RNG states."""
    base = frozenset(BOOKKEEPING_KEYS + ("model", "optimizer", "scaler"))
    return base | frozenset(PROCESS_RNG_KEYS) if scheme == 1 else base


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


def link(prev: str, step: int, digest: str, scheme: int = 1) -> str:
    """The chain value after the digest of step `step` under `scheme` (from 2 on the scheme is
    chained too: relabelling a digest as an older scheme's breaks the chain unless the whole chain
    is recomputed, which whoever edits a run can do; a signature covers that)."""
    text = f"{step}:{digest}:{prev}" if scheme == 1 else f"{step}:scheme {scheme}:{digest}:{prev}"
    return hashlib.sha256(text.encode()).hexdigest()


def check_chain(run_id: str, rows: list[tuple]) -> str | None:
    """None when the (step, digest, chain[, scheme]) rows, in step order, link from the run's
    genesis (a row without its scheme is scheme 1's) and no scheme is older than the one before
    it (a run only ever moves to a newer scheme: an old run resumed by a newer bench); else
    where they do not, in words."""
    prev = genesis(run_id)
    last, last_scheme = -1, 1
    for step, digest, chain, *rest in rows:
        scheme = rest[0] if rest else 1
        if step <= last:
            return f"step {step} comes after step {last} in the chain"
        if scheme < last_scheme:
            return f"step {step}'s digest is of scheme {scheme}, older than the scheme {last_scheme} before it"
        if link(prev, step, digest, scheme) != chain:
            return f"the chain does not link at step {step}"
        prev, last, last_scheme = chain, step, scheme
    return None
