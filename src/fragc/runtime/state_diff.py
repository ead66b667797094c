"""Where a state differs from the program's state type: the first leaf or static field, by path.

A state's type is its pytree structure, including the static (non-array)
fields of its nodes, and the shape and dtype of every leaf. Static fields are
compared by equality, and a function or an optax optimizer is equal only to
itself: a `TrainState` whose `tx` is a fresh `optax.chain(...)` built inside
`init` (or whose `apply_fn` is a fresh lambda) has a new type at every call of
`init`. The program was traced with the objects of one call; since the
compiled program reads static fields only while tracing, `Program.init` may
rebuild its state with those (see `only_static`), but a state made elsewhere
is refused with the field named.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, NamedTuple

import jax

from fragc.ir.types import LeafType


class Difference(NamedTuple):
    path: str
    text: str
    static: bool  # a static field's value differs; the structure and the leaves agree


def differences(expected: Any, actual: Any, path: str = "state") -> Iterator[Difference]:
    """Every difference between `expected` (the program's state type, leaves with shape and dtype)
    and `actual`, outermost first; below a node whose structure differs, nothing more."""
    exp_children, exp_tree = _one_level(expected)
    act_children, act_tree = _one_level(actual)
    if _is_leaf(exp_tree) and _is_leaf(act_tree):
        if not same_leaf_type(expected, actual):
            want, got = LeafType.of(expected), _leaf_type(actual)
            yield Difference(path, f"{path} is {got} here, {want} in the program's state type", False)
        return
    if exp_tree == act_tree:
        pass
    elif type(expected) is not type(actual) or [k for k, _ in exp_children] != [k for k, _ in act_children]:
        yield Difference(path, f"{path} is {_node(actual, act_children)} here, {_node(expected, exp_children)} in "
                               "the program's state type", False)
        return
    else:
        yield from _static_differences(expected, actual, path, {_key_name(k) for k, _ in exp_children})
    for (key, exp_child), (_, act_child) in zip(exp_children, act_children):
        yield from differences(exp_child, act_child, path + jax.tree_util.keystr((key,)))


def same_leaf_type(expected: Any, actual: Any) -> bool:
    """Same shape and dtype (NumPy's float64 counts as JAX's float32 where JAX would convert it)."""
    want, got = LeafType.of(expected), _leaf_type(actual)
    return (want.shape, _dtype(want.dtype)) == (got.shape, _dtype(got.dtype))


def only_static(diffs: list[Difference]) -> bool:
    """Whether the states differ only in static fields' values (same structure, same leaves)."""
    return bool(diffs) and all(d.static for d in diffs)


def _static_differences(expected: Any, actual: Any, path: str, children: set[str]) -> Iterator[Difference]:
    fields = [f.name for f in dataclasses.fields(expected)] if dataclasses.is_dataclass(expected) else []
    named = False
    for name in fields:
        if name in children:
            continue
        a, b = getattr(expected, name), getattr(actual, name)
        if not _same(a, b):
            named = True
            yield Difference(f"{path}.{name}", _static_text(f"{path}.{name}", a, b), True)
    if not named:  # a custom pytree node: its auxiliary data differs
        yield Difference(path, f"{path}'s static (non-array) data differs from the program's state type "
                               f"({_short(jax.tree.structure(actual, is_leaf=lambda x: x is not actual))} here)", True)


def _static_text(path: str, expected: Any, actual: Any) -> str:
    return (f"{path}, a static field (part of the state's type), is {_short(actual)} here but "
            f"{_short(expected)} in the program's state type. A function or optimizer made afresh at each call "
            "of init (an optax.chain(...) or a lambda built inside init) is a new object every time: build it "
            "once, in __init__ (self.tx = optax.chain(...)), and reuse it")


def _one_level(tree: Any) -> tuple[list[tuple[Any, Any]], Any]:
    """The children of the root node with their keys, and the root's one-level treedef."""
    children, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
    if _is_leaf(treedef):
        return [], treedef
    return [(path[0], child) for path, child in children], treedef


def _is_leaf(treedef: Any) -> bool:
    return treedef.num_nodes == 1 and treedef.num_leaves == 1  # an empty node (None, ()) is one node, no leaf


def _leaf_type(x: Any) -> LeafType:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return LeafType.of(x)
    return LeafType.of(jax.numpy.asarray(x))


def _dtype(dtype: Any) -> Any:
    return jax.dtypes.canonicalize_dtype(dtype, allow_extended_dtype=True)


def _node(tree: Any, children: list) -> str:
    if isinstance(tree, dict):
        return f"a dict with keys {sorted(map(str, tree))}"
    if hasattr(tree, "shape"):
        return f"a leaf {_leaf_type(tree)}"
    return f"a {type(tree).__name__} with {len(children)} children"


def _key_name(key: Any) -> str:
    return str(getattr(key, "name", getattr(key, "key", getattr(key, "idx", key))))


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # arrays, or objects whose == is not a bool
        return a is b


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 100 else text[:97] + "..."
