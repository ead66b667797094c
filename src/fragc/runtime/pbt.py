"""Population-based training (Jaderberg et al. 2017) inside a population's compiled program.

Truncation selection, every `every` iterations (the program ends a dispatch
at each multiple of `every`, and the step follows that dispatch's loop):

1. rank the members by the mean of `metric` over the dispatch's iterations;
2. exploit: each member of the worst `fraction` copies the state of a member
   of the best `fraction` drawn at random: its weights, optimizer state,
   environment state and hyperparameters, every leaf but its PRNG keys (so
   that the copy goes on with randomness of its own);
3. explore: each copied hyperparameter is resampled from the grid's values
   with probability `resample`, else multiplied by 0.8 or 1.2 (even odds),
   kept within the field's range (a whole number stays whole).

The draws come from `fold_in(key(seed), iteration)`: the same seed gives the
same lineage on every run, and a resumed run the same as an uninterrupted one.
`SweepState.lineage` says, per member, whose training its state continues.
The step runs on the devices, after the dispatch's loop, as a `cond` on
whether it is due; no state leaves the devices.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

from fragc.ir.sweep import PBT


def due(pbt: PBT, start: jax.Array, n: jax.Array) -> jax.Array:
    """Whether a multiple of `every` falls in the dispatch of iterations start+1 .. start+n (at its end:
    `Program` ends a dispatch there)."""
    return (start + n) // pbt.every > start // pbt.every


def exploit_explore(pbt: PBT, leaves: Sequence[jax.Array], hyper: dict[str, int], lineage: int,
                    choices: dict[str, jax.Array], scores: jax.Array, iteration: jax.Array) -> list[jax.Array]:
    """One step over the whole population's state leaves (member axis first).

    hyper: per swept field, the index of its leaf; lineage: the index of `SweepState.lineage`;
    choices: per swept field, the grid's values; scores: [members], higher is better."""
    members = scores.shape[0]
    q = max(1, int(math.floor(members * pbt.fraction)))
    key = jax.random.fold_in(jax.random.key(pbt.seed), iteration)
    k_source, k_factor, k_resample, k_choice = jax.random.split(key, 4)
    order = jnp.argsort(jnp.where(jnp.isnan(scores), -jnp.inf, scores), stable=True)  # worst first
    losers, winners = order[:q], order[members - q:]
    source = jnp.arange(members).at[losers].set(winners[jax.random.randint(k_source, (q,), 0, q)])
    copied = jnp.zeros(members, bool).at[losers].set(True)
    out = [x if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x[source] for x in leaves]
    out[lineage] = leaves[lineage][source]
    bounds = {f: (lo, hi) for f, lo, hi in pbt.bounds}
    for i, (field, index) in enumerate(sorted(hyper.items())):
        value = out[index]
        factor = jnp.where(jax.random.bernoulli(jax.random.fold_in(k_factor, i), 0.5, (members,)), 0.8, 1.2)
        grid = choices[field]
        drawn = grid[jax.random.randint(jax.random.fold_in(k_choice, i), (members,), 0, grid.shape[0])]
        again = jax.random.bernoulli(jax.random.fold_in(k_resample, i), pbt.resample, (members,))
        new = jnp.where(again, drawn.astype(jnp.float32), value.astype(jnp.float32) * factor)
        if field in bounds:
            new = jnp.clip(new, *bounds[field])
        if jnp.issubdtype(value.dtype, jnp.integer):
            new = jnp.maximum(jnp.round(new), 1)
        out[index] = jnp.where(copied, new.astype(value.dtype), value)
    return out


def member_scores(rows: jax.Array, n: jax.Array) -> jax.Array:
    """[members]: the mean of a metric's rows [members, k, ...] over the dispatch's first n rows (and any
    further axes)."""
    rows = rows.astype(jnp.float32).reshape(rows.shape[0], rows.shape[1], -1).mean(-1)
    mask = jnp.arange(rows.shape[1]) < n
    return jnp.sum(jnp.where(mask, rows, 0.0), 1) / n
