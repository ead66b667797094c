"""The reference interpreter: one iteration of a module under DESIGN.md's semantics.

Each fragment runs with its replica count as `vmap(axis_name=REPLICA)` over
equal splits of its declared axes, on one device. Compiled programs are tested
against this.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Mapping

import jax
from jax.extend import core as jex

from .errors import FragcError
from .module import Delay, FragmentDef, Glue, Module, Run, Transfer, Value
from .replicas import check_divides, run_replicated

_COMPILED: "weakref.WeakKeyDictionary[FragmentDef, dict[int, Any]]" = weakref.WeakKeyDictionary()


def replica_counts(module: Module, replicas: int | Mapping[str, int]) -> dict[str, int]:
    """Per fragment name, how many replicas it runs with."""
    if isinstance(replicas, int):
        counts = {name: replicas for name in module.fragments}
    else:
        roles = {f.role for f in module.fragments.values()}
        unknown = set(replicas) - roles
        if unknown:
            raise FragcError(f"replicas names roles {sorted(unknown)} that the module lacks (it has {sorted(roles)})")
        counts = {name: replicas.get(f.role, 1) for name, f in module.fragments.items()}
    for name, r in counts.items():
        if not isinstance(r, int) or r < 1:
            raise FragcError(f"replica count for fragment '{name}' must be a positive int, got {r!r}")
        fdef = module.fragments[name]
        check_divides(name, fdef.arg_names, fdef.in_types, r)
    return counts


def fragment_runner(fdef: FragmentDef, replicas: int) -> Any:
    """A jitted `leaves -> leaves` for `fdef` with `replicas` replicas (cached)."""
    per_def = _COMPILED.setdefault(fdef, {})
    if replicas not in per_def:
        body = fdef.body_for(replicas)
        fn = functools.partial(
            run_replicated, jex.jaxpr_as_fun(body), in_axes=fdef.in_axes, out_axes=fdef.out_axes,
            replicas=replicas, name=fdef.name,
        )
        per_def[replicas] = jax.jit(lambda *leaves: fn(leaves))
    return per_def[replicas]


def run_graph(module: Module, state_leaves: list[Any], run_fragment: Any) -> list[Any]:
    """Evaluate the graph; `run_fragment(node, fdef, leaves)` runs one fragment."""
    env: dict[Value, list[Any]] = {module.graph.inputs[0]: list(state_leaves)}

    def read(uses: Any) -> list[Any]:
        return [env[u.value][u.index] for u in uses]

    for node in module.graph.nodes:
        ins = read(node.inputs)
        if isinstance(node, Run):
            outs = list(run_fragment(node, module.fragments[node.fragment], ins))
        elif isinstance(node, Glue):
            outs = jex.jaxpr_as_fun(node.body)(*ins)
        elif isinstance(node, Transfer):
            outs = ins
        elif isinstance(node, Delay):
            raise FragcError("a module with delay nodes runs through Program, not the one-step interpreter")
        else:
            raise FragcError(f"unknown node kind {type(node).__name__}")
        offset = 0
        for value in node.outputs:
            n = len(value.type.leaves)
            env[value] = list(outs[offset : offset + n])
            offset += n
    return read(module.graph.outputs)


def interpret(module: Module, state: Any, replicas: int | Mapping[str, int] = 1) -> tuple[Any, Any]:
    """One iteration of `module` from `state` -> `(state, metrics)`.

    replicas: one count for every fragment, or a mapping from role to count
      (roles not named run with one replica).
    """
    counts = replica_counts(module, replicas)
    leaves, tree = jax.tree.flatten(state)
    expected = module.graph.inputs[0].type
    if tree != expected.treedef or [tuple(x.shape) for x in leaves] != [t.shape for t in expected.leaves]:
        raise FragcError(f"interpret: the state does not have the module's state type {expected}")
    outs = run_graph(module, leaves, lambda node, fdef, ins: fragment_runner(fdef, counts[fdef.name])(*ins))
    return jax.tree.unflatten(module.graph.out_tree, outs)
