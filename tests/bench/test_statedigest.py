"""bench/statedigest.py by hand: what each digest scheme hashes, the chain's formula with and
without the scheme, a chain over both schemes, and the checkpoint keys each scheme needs."""

import hashlib

import pytest
import torch

from bench.statedigest import (SCHEME, check_chain, checkpoint_digest, checkpoint_keys, genesis, left_out_keys, link,
                               state_digest)


def _state(rng_torch=0, rng_python=0, w=1.0, step=4):
    return {"step": step, "wall": 12.5, "stop": {"peak": 0.5},
            "model": {"w": torch.tensor([w, 2.0])}, "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3}]},
            "scaler": {"scale": 1.0}, "rng_torch": torch.tensor([rng_torch], dtype=torch.uint8),
            "rng_python": (3, (rng_python,), None)}


def test_scheme_2_hashes_the_run_state_and_no_process_wide_rng():
    s = _state()
    assert SCHEME == 2
    assert checkpoint_digest(s) == state_digest({k: s[k] for k in ("model", "optimizer", "scaler")})
    # the process-wide RNG states, which the OS seeds anew in every interpreter, do not move it
    assert checkpoint_digest(_state(rng_torch=7, rng_python=9)) == checkpoint_digest(s)
    # nor does the bookkeeping; the weights do
    assert checkpoint_digest(_state(step=6)) == checkpoint_digest(s)
    assert checkpoint_digest(_state(w=1.5)) != checkpoint_digest(s)


def test_scheme_1_still_hashes_what_it_hashed():
    s = _state()
    assert checkpoint_digest(s, 1) == state_digest({k: v for k, v in s.items() if k not in ("step", "wall", "stop")})
    assert checkpoint_digest(_state(rng_torch=7), 1) != checkpoint_digest(s, 1)
    assert checkpoint_digest(_state(rng_python=9), 1) != checkpoint_digest(s, 1)
    assert checkpoint_digest(s, 1) != checkpoint_digest(s, 2)
    with pytest.raises(ValueError, match="scheme 3"):
        checkpoint_digest(s, 3)
    assert left_out_keys(1) == {"step", "wall", "stop"}
    assert left_out_keys(2) == {"step", "wall", "stop", "rng_torch", "rng_python"}


def test_checkpoint_keys_per_scheme():
    assert checkpoint_keys(2) == {"step", "wall", "stop", "model", "optimizer", "scaler"}
    assert checkpoint_keys(1) == checkpoint_keys(2) | {"rng_torch", "rng_python"}


def test_the_chain_formula_by_hand():
    sha = lambda text: hashlib.sha256(text.encode()).hexdigest()     # noqa: E731
    assert genesis("r1") == sha("bench-state-chain:r1")
    assert link("p", 3, "d") == sha("3:d:p") == link("p", 3, "d", 1)
    assert link("p", 3, "d", 2) == sha("3:scheme 2:d:p")


def test_a_chain_over_both_schemes_links_and_a_relabelled_scheme_breaks_it():
    """An old run resumed by this bench: scheme-1 digests, then scheme-2 ones."""
    c0 = link(genesis("r"), 0, "a", 1)
    c2 = link(c0, 2, "b", 1)
    c4 = link(c2, 4, "c", 2)
    rows = [(0, "a", c0, 1), (2, "b", c2, 1), (4, "c", c4, 2)]
    assert check_chain("r", rows) is None
    assert check_chain("r", [(0, "a", c0), (2, "b", c2)]) is None          # rows without a scheme: scheme 1
    assert check_chain("r", [*rows[:2], (4, "c", c4, 1)]) == "the chain does not link at step 4"


def test_a_chain_whose_scheme_goes_back_is_refused_and_the_stores_default_is_the_current_scheme():
    from bench.store import RunDigest

    c0 = link(genesis("r"), 0, "a", 2)
    c2 = link(c0, 2, "b", 1)
    assert check_chain("r", [(0, "a", c0, 2), (2, "b", c2, 1)]) == (
        "step 2's digest is of scheme 1, older than the scheme 2 before it")
    assert RunDigest.__table__.c.scheme.default.arg == SCHEME
