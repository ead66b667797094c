"""Seeds: what a run accepts as its PRNG seed (the uint32 that `jax.random.key` is made from)."""

from __future__ import annotations

import numbers

from fragc.ir.errors import FragcError

MAX_SEED = 2**32 - 1


def check_seed(seed: object) -> int:
    """`seed` as an int, refused with its range unless it is an integer in [0, 2**32 - 1]."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= MAX_SEED:
        raise FragcError(f"seed must be an int from 0 to {MAX_SEED}, got {seed!r}")
    return int(seed)
