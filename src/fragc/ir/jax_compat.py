"""Reading jaxpr equations the same way across the JAX releases fragc meets.

fragc pins jax 0.10.2, but the lent GPU machines (and users who upgrade) run newer releases. JAX 0.11 replaced a
`scan` equation's `num_consts` / `num_carry` parameters with `ft_in`, a flat tree of (consts, carry, xs); the
counts are read here, from whichever the equation has, so no pass depends on one release's parameter names.
"""

from __future__ import annotations

from typing import Any


def scan_counts(eqn: Any) -> tuple[int, int]:
    """(number of consts, number of carried leaves) of a `scan` equation; its remaining operands are the xs."""
    p = eqn.params
    if "num_consts" in p:  # jax <= 0.10
        return p["num_consts"], p["num_carry"]
    consts, carry, _ = p["ft_in"].update(list(range(len(eqn.invars)))).unpack()  # jax >= 0.11
    return len(list(consts)), len(list(carry))


def ordered_effects(effects: Any) -> list:
    """The ordered effects among `effects` (`jax.debug.callback(..., ordered=True)`, an ordered `io_callback`): JAX
    runs them on one device only, and not under `vmap`. Read from `jax._src.effects`, which JAX exports nowhere
    public."""
    from jax._src import effects as jax_effects

    return [e for e in effects if jax_effects.ordered_effects.contains(e)]
