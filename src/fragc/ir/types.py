"""Types of FDG values: one array leaf, or a pytree of them.

A leaf type is an aval (shape and dtype) plus what fragc knows about where it
lives: its environment (batch) axis, and once placed, its device group. Types
are immutable; passes derive new ones with `replace()`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_SHORT_DTYPES = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8",
    "bool": "bool",
}


def short_dtype(dtype: Any) -> str:
    """`float32` -> `f32`; typed PRNG keys print as `key<fry>`."""
    name = str(dtype)
    return _SHORT_DTYPES.get(name, name)


@dataclasses.dataclass(frozen=True)
class LeafType:
    """One array: shape, dtype, batch axis (`None`: replicated), agent axis and placement.

    Printed `f32[8@env,3@agent,18]@actors`: the batch axis marked `@env`, the agent
    axis `@agent`, then the device group. A group splits the batch axis over its
    devices, or the agent axis where its fragments are placed `split=agent`.
    """

    shape: tuple[int, ...]
    dtype: Any
    axis: int | None = None
    group: str | None = None
    agent: int | None = None
    """The agent axis (multi-agent algorithms): agents of one environment, or parameters stacked per agent."""
    weak_type: bool = dataclasses.field(default=False, compare=False)
    """JAX's weak type (a Python number's): `lr * grads` with `lr` a Python float keeps the grads' bfloat16, as
    under `jax.jit`. Carried into bodies traced from this type (`struct`); not part of the type's identity, as
    JAX's compiled programs take either."""

    @staticmethod
    def of(x: Any, axis: int | None = None, agent: int | None = None) -> "LeafType":
        """The type of anything with `.shape` and `.dtype`: arrays, tracers, avals."""
        weak = bool(getattr(getattr(x, "aval", x), "weak_type", False))
        return LeafType(tuple(int(d) for d in x.shape), x.dtype, axis, agent=agent, weak_type=weak)

    def replace(self, **changes: Any) -> "LeafType":
        return dataclasses.replace(self, **changes)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _itemsize(self.dtype)

    def stacked(self, n: int) -> "LeafType":
        """`n` of these stacked along a new leading axis (a loop's per-trip output over its trips)."""
        return self.replace(shape=(n,) + tuple(self.shape), axis=None if self.axis is None else self.axis + 1,
                            agent=None if self.agent is None else self.agent + 1)

    def struct(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.shape, self.dtype, weak_type=self.weak_type)

    def __str__(self) -> str:
        dims = [f"{d}@env" if i == self.axis else f"{d}@agent" if i == self.agent else str(d)
                for i, d in enumerate(self.shape)]
        where = f"@{self.group}" if self.group is not None else ""
        return f"{short_dtype(self.dtype)}[{','.join(dims)}]{where}"


NUMBERS = (bool, int, float, complex, np.generic, np.ndarray)
"""Leaves that JAX takes as arrays where it is given them (Python and NumPy numbers, NumPy arrays)."""


def leaf_key_paths(treedef: Any) -> list[tuple]:
    """The key path of each leaf of `treedef`, in order (a metrics tree's `loss`, `episode.return`)."""
    return [p for p, _ in jax.tree_util.tree_flatten_with_path(jax.tree.unflatten(treedef, range(treedef.num_leaves)))[0]]


def as_arrays(tree: Any) -> Any:
    """`tree` with its Python and NumPy numbers and arrays as JAX arrays, as `jax.jit` takes them: a state whose
    flax `TrainState.step` is still the int 0 of `TrainState.create`, a fragment's constant argument."""
    return jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, NUMBERS) else x, tree)


def _is_key(dtype: Any) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _itemsize(dtype: Any) -> int:
    if _is_key(dtype):
        return 8  # threefry keys are two uint32 words
    return np.dtype(dtype).itemsize


@dataclasses.dataclass(frozen=True)
class TreeType:
    """A pytree of leaf types: the type of one FDG value."""

    treedef: Any
    leaves: tuple[LeafType, ...]

    @staticmethod
    def of(tree: Any, axes: Any = None) -> "TreeType":
        """The type of a pytree of arrays or avals; `axes` is a flat per-leaf tuple."""
        leaves, treedef = jax.tree.flatten(tree)
        axes = axes if axes is not None else (None,) * len(leaves)
        return TreeType(treedef, tuple(LeafType.of(x, a) for x, a in zip(leaves, axes)))

    def replace(self, **changes: Any) -> "TreeType":
        return dataclasses.replace(self, **changes)

    def with_leaves(self, leaves: tuple[LeafType, ...]) -> "TreeType":
        return dataclasses.replace(self, leaves=tuple(leaves))

    @functools.cached_property
    def path_parts(self) -> tuple[tuple[str, ...], ...]:
        """The key path of every leaf as strings, e.g. `("train", "params", "actor")`."""
        dummy = jax.tree.unflatten(self.treedef, list(range(len(self.leaves))))
        with_paths = jax.tree_util.tree_flatten_with_path(dummy)[0]
        return tuple(tuple(_key_str(k) for k in path) for path, _ in with_paths)

    @functools.cached_property
    def paths(self) -> tuple[str, ...]:
        """Every leaf's path joined with dots, e.g. `train.params.actor`."""
        return tuple(".".join(parts) for parts in self.path_parts)

    @property
    def class_name(self) -> str | None:
        """The Python class at the root, for naming; `None` for tuples, lists, dicts, leaves."""
        node_type = self.treedef.node_data()[0] if self.treedef.num_nodes > 1 else None
        if node_type is None or node_type in (tuple, list, dict):
            return None
        return node_type.__name__

    @property
    def nbytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)

    def structs(self) -> Any:
        return jax.tree.unflatten(self.treedef, [leaf.struct() for leaf in self.leaves])

    def __str__(self) -> str:
        if self.treedef.num_leaves == 1 and self.treedef.num_nodes == 1:
            return str(self.leaves[0])
        inner = ", ".join(f"{p}: {leaf}" for p, leaf in zip(self.paths, self.leaves))
        return "{" + inner + "}"


def _key_str(key: Any) -> str:
    """One key of a path: attribute name, dict key or sequence index."""
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)
