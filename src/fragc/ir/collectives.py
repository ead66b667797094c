"""`fragc.pmean` and `fragc.psum`: reductions over the replicas of the enclosing fragment; `fragc.fold_in_replica`:
a replicated key made one per replica.

Deterministic by default: the result's bits do not depend on how the replicas
are spread over devices and processes. An all-reduce's summation order
belongs to its implementation (XLA's in-process one and gloo's across
processes differ), so `lax.psum` of floats can change in the last bit when
the same devices are spread over processes. Here the reduction is split in
two data movements that copy bytes exactly and one addition in a fixed
order:

1. reduce-scatter: the payload (all leaves of one dtype as one vector, padded
   to a multiple of R) is cut into R chunks; an all-to-all hands chunk j of
   every replica to replica j, which adds the R copies in replica order
   0, 1, ..., R-1;
2. all-gather: every replica receives the R reduced chunks.

Each device so receives 2 (R-1)/R times the payload, as with a ring
all-reduce, instead of the (R-1) times of gathering every replica's whole
payload. `deterministic=False` uses XLA's native all-reduce
(`lax.psum`), for users who prefer its speed to bit-reproducibility.
With one replica both are the identity (and cost nothing).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex

from .errors import FragcError
from .module import REPLICA


def pmean(x: Any, *, deterministic: bool = True) -> Any:
    """Mean of `x` (any pytree) over the replicas of the enclosing fragment."""
    return _reduce(x, "pmean", mean=True, deterministic=deterministic)


def psum(x: Any, *, deterministic: bool = True) -> Any:
    """Sum of `x` (any pytree) over the replicas of the enclosing fragment."""
    return _reduce(x, "psum", mean=False, deterministic=deterministic)


def fold_in_replica(key: jax.Array) -> jax.Array:
    """`key` folded with this replica's index where the enclosing fragment runs several replicas, so that a key
    declared replicated (`in_axes` None) draws different numbers on each; with one replica, `key` itself (a
    one-replica run draws what it drew without this call)."""
    if _replica_count("fold_in_replica") == 1:
        return key
    return jax.random.fold_in(key, lax.axis_index(REPLICA))


def _replica_count(name: str) -> int:
    try:
        return lax.axis_size(REPLICA)
    except NameError as err:
        raise FragcError(f"fragc.{name} must be called inside a @fragc.fragment function") from err


def _reduce(tree: Any, name: str, mean: bool, deterministic: bool) -> Any:
    replicas = _replica_count(name)
    if replicas == 1 or not deterministic:  # one replica: lowering drops it (without_unit_reductions)
        return lax.pmean(tree, REPLICA) if mean else lax.psum(tree, REPLICA)
    return _by_dtype(tree, lambda flat: _ordered_sum(flat, replicas) / replicas if mean else _ordered_sum(flat, replicas))


def _by_dtype(tree: Any, reduce: Any) -> Any:
    """Apply `reduce` to the leaves of each dtype concatenated into one vector: one collective per dtype."""
    leaves, treedef = jax.tree.flatten(tree)
    out: list[Any] = [None] * len(leaves)
    by_dtype: dict[Any, list[int]] = {}
    for i, leaf in enumerate(leaves):
        by_dtype.setdefault(jnp.result_type(leaf), []).append(i)
    for dtype, idx in by_dtype.items():
        total = reduce(jnp.concatenate([jnp.ravel(jnp.asarray(leaves[i], dtype)) for i in idx]))
        offset = 0
        for i in idx:
            shape = jnp.shape(leaves[i])
            size = int(np.prod(shape, dtype=np.int64))
            out[i] = total[offset : offset + size].reshape(shape)
            offset += size
    return jax.tree.unflatten(treedef, out)


def _ordered_sum(flat: jax.Array, replicas: int) -> jax.Array:
    """Reduce-scatter (all-to-all, then a sum in replica order) and all-gather of one vector."""
    size = flat.shape[0]
    chunk = -(-size // replicas)
    rows = jnp.pad(flat, (0, chunk * replicas - size)).reshape(replicas, chunk)
    # The same on every replica, whatever the operand: vmap's all_to_all rule (the reference
    # interpreter's replicas) gives a wrong shape for an operand not batched over the replicas.
    rows = lax.select(jnp.full(rows.shape, lax.axis_index(REPLICA) >= 0), rows, rows)
    received = lax.all_to_all(rows, REPLICA, split_axis=0, concat_axis=0)  # row r: replica r's copy of my chunk
    mine = received[0]
    for r in range(1, replicas):  # spelled out: a `reduce` leaves its order to the compiler
        mine = mine + received[r]
    return lax.all_gather(mine, REPLICA, tiled=True)[:size]


UNIT_REDUCTIONS = ("psum", "pmax", "pmin")
"""Reductions that are the identity over one replica (`fragc.pmean` traces as psum, then a division by 1)."""


def without_unit_reductions(closed: Any) -> Any:
    """A one-replica body (`FragmentDef.body`) with its reductions over `REPLICA` dropped, in nested jaxprs too.

    Under `shard_map` on a one-device mesh XLA keeps such a reduction as an all-reduce over one device: a copy of
    the payload on the CPU, a collective kernel on a GPU, for every gradient step. The results are unchanged:
    each reduction is the identity there, and the shapes of every nested jaxpr stay as they were."""
    return closed.replace(jaxpr=_drop_unit_reductions(closed.jaxpr))


def _drop_unit_reductions(jaxpr: Any) -> Any:
    rename: dict[Any, Any] = {}
    eqns = []
    for eqn in jaxpr.eqns:
        invars = [rename.get(v, v) if isinstance(v, jex.Var) else v for v in eqn.invars]
        if eqn.primitive.name in UNIT_REDUCTIONS and tuple(eqn.params.get("axes", ())) == (REPLICA,):
            rename.update((o, i) for o, i in zip(eqn.outvars, invars) if not isinstance(o, jex.DropVar))
            continue
        eqns.append(eqn.replace(invars=invars, params={k: _in_param(v) for k, v in eqn.params.items()}))
    outvars = [rename.get(v, v) if isinstance(v, jex.Var) else v for v in jaxpr.outvars]
    return jaxpr.replace(eqns=eqns, outvars=outvars)


def _in_param(value: Any) -> Any:
    """An equation's parameter with the reductions dropped from any jaxpr it holds (a scan's body, a cond's
    branches, a pjit's callee)."""
    if isinstance(value, jex.ClosedJaxpr):
        return without_unit_reductions(value)
    if isinstance(value, jex.Jaxpr):
        return _drop_unit_reductions(value)
    if isinstance(value, tuple) and any(isinstance(v, (jex.ClosedJaxpr, jex.Jaxpr)) for v in value):
        return tuple(_in_param(v) for v in value)
    return value
