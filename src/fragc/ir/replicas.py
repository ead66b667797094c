"""The reference semantics of running a fragment with R replicas.

Split every declared axis into R equal contiguous parts, run the body on each
part as `jax.vmap(body, axis_name=REPLICA)`, concatenate the declared outputs;
a `None` output must be equal on every replica (vmap refuses a batched value
with `out_axes=None`, which is how the semantics check it).

A fragment placed `split=agent` splits its declared agent axes instead: each
replica runs the one-replica body (its reductions over one replica dropped, so
`fragc.pmean` reduces over no one) on its share of the agents and every
environment; an output without an agent axis must be equal on every replica.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax

from .collectives import without_unit_reductions
from .errors import FragmentError
from .module import REPLICA, FragmentDef


def split_axis(x: jax.Array, axis: int, replicas: int) -> jax.Array:
    """[..., n, ...] -> [..., R, n/R, ...] with R at `axis`."""
    n = x.shape[axis]
    return x.reshape(x.shape[:axis] + (replicas, n // replicas) + x.shape[axis + 1 :])


def merge_axis(x: jax.Array, axis: int) -> jax.Array:
    """[..., R, m, ...] with R at `axis` -> [..., R*m, ...]."""
    return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2 :])


def run_replicated(
    flat_fn: Callable[..., Sequence[jax.Array]],
    leaves: Sequence[jax.Array],
    in_axes: Sequence[int | None],
    out_axes: Sequence[int | None],
    replicas: int,
    name: str = "fragment",
) -> list[jax.Array]:
    """Run `flat_fn` (per-replica shapes) on global `leaves` with `replicas` replicas."""
    split = [x if a is None else split_axis(x, a, replicas) for x, a in zip(leaves, in_axes)]
    mapped = jax.vmap(
        lambda *xs: list(flat_fn(*xs)),
        in_axes=list(in_axes),
        out_axes=list(out_axes),
        axis_name=REPLICA,
        axis_size=replicas,
    )
    try:
        outs = mapped(*split)
    except ValueError as err:
        if "out_axes" in str(err) and "None" in str(err):
            raise replicated_output_differs(name) from err
        raise
    return [x if a is None else merge_axis(x, a) for x, a in zip(outs, out_axes)]


def replicated_output_differs(name: str) -> FragmentError:
    """The error for an output declared replicated (out_axes None) that differs between replicas."""
    return FragmentError(f"fragment '{name}': an output declared replicated (out_axes None) differs between "
                         "replicas; reduce it with fragc.pmean/psum or declare its batch axis")


def check_divides(name: str, arg_names: Sequence[str], types: Sequence[Any], replicas: int,
                  agents: bool = False, source: str = "") -> None:
    """A clear error when `replicas` does not divide a declared axis (with `agents`, a declared agent axis);
    `source`: the fragment's `file.py:line`."""
    for arg, tree_type in zip(arg_names, types):
        for path, leaf in zip(tree_type.paths, tree_type.leaves):
            axis = leaf.agent if agents else leaf.axis
            if axis is not None and leaf.shape[axis] % replicas:
                where = f"{arg}.{path}" if path else arg
                raise FragmentError(
                    f"fragment '{name}'{f' ({source})' if source else ''}, argument '{where}': "
                    f"{'agent ' if agents else ''}axis {axis} has length "
                    f"{leaf.shape[axis]}, which {replicas} replicas do not divide"
                )


def splits_agents(fdef: FragmentDef) -> bool:
    return fdef.placement is not None and fdef.placement.split == "agent"


def split_axes(fdef: FragmentDef) -> tuple[tuple[int | None, ...], tuple[int | None, ...]]:
    """The axes a fragment's replicas split, flat per leaf: its environment axes, or under `split=agent` its agent
    axes."""
    if splits_agents(fdef):
        return (tuple(t.agent for t in fdef.in_leaf_types), tuple(t.agent for t in fdef.out_leaf_types))
    return fdef.in_axes, fdef.out_axes


def replica_body(fdef: FragmentDef, replicas: int) -> Any:
    """What each of `replicas` replicas runs: the body at per-replica shapes, or under `split=agent` the one-replica
    body without its reductions over one replica (the agents' learners exchange nothing)."""
    if splits_agents(fdef):
        return without_unit_reductions(fdef.body_for(replicas, agents=True))
    return fdef.body_for(replicas)
