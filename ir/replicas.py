"""The reference semantics of running a fragment with R replicas.

Split every declared axis into R equal contiguous parts, run the body on each
part as `jax.vmap(body, axis_name=REPLICA)`, concatenate the declared outputs;
a `None` output must be equal on every replica (vmap refuses a batched value
with `out_axes=None`, which is how the semantics check it).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax

from .errors import FragmentError
from .module import REPLICA


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


def check_divides(name: str, arg_names: Sequence[str], types: Sequence[Any], replicas: int) -> None:
    """A clear error when `replicas` does not divide a declared axis."""
    for arg, tree_type in zip(arg_names, types):
        for path, leaf in zip(tree_type.paths, tree_type.leaves):
            if leaf.axis is not None and leaf.shape[leaf.axis] % replicas:
                where = f"{arg}.{path}" if path else arg
                raise FragmentError(
                    f"fragment '{name}', argument '{where}': axis {leaf.axis} has length "
                    f"{leaf.shape[leaf.axis]}, which {replicas} replicas do not divide"
                )
