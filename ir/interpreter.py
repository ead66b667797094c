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


def eval_nodes(module: Module, indices: Any, env: dict[Value, list[Any]], run_fragment: Any,
               delayed: dict[int, list[Any]] | None = None) -> None:
    """Evaluate the nodes at `indices` into `env` (value -> leaves).

    run_fragment(node, fdef, leaves) runs one fragment; `delayed[i]` is the
    value delay node i yields this iteration (its `initial` operand when absent).
    """
    def read(uses: Any) -> list[Any]:
        return [env[u.value][u.index] for u in uses]

    for i in indices:
        node = module.graph.nodes[i]
        if isinstance(node, Run):
            outs = list(run_fragment(node, module.fragments[node.fragment], read(node.inputs)))
        elif isinstance(node, Glue):
            outs = jex.jaxpr_as_fun(node.body)(*read(node.inputs))
        elif isinstance(node, Transfer):
            outs = read(node.inputs)
        elif isinstance(node, Delay):
            outs = delayed[i] if delayed and i in delayed else read(node.initial)
        else:
            raise FragcError(f"unknown node kind {type(node).__name__}")
        assign_outputs(env, node.outputs, outs)


def assign_outputs(env: dict[Value, list[Any]], values: Any, outs: Any) -> None:
    """A node's flat results into `env`, value by value."""
    offset = 0
    for value in values:
        n = len(value.type.leaves)
        env[value] = list(outs[offset : offset + n])
        offset += n


def delay_inputs(module: Module, env: dict[Value, list[Any]]) -> dict[int, list[Any]]:
    """What each delay node yields next iteration: its operands' values in this one."""
    return {i: [env[u.value][u.index] for u in node.inputs]
            for i, node in enumerate(module.graph.nodes) if isinstance(node, Delay)}


def run_graph(module: Module, state_leaves: list[Any], run_fragment: Any,
              delayed: dict[int, list[Any]] | None = None) -> tuple[list[Any], dict[int, list[Any]]]:
    """One iteration -> (flat outputs, the delay values for the next iteration)."""
    env: dict[Value, list[Any]] = {module.graph.inputs[0]: list(state_leaves)}
    eval_nodes(module, range(len(module.graph.nodes)), env, run_fragment, delayed)
    outs = [env[u.value][u.index] for u in module.graph.outputs]
    return outs, delay_inputs(module, env)


def _check_state(module: Module, state: Any) -> list[Any]:
    leaves, tree = jax.tree.flatten(state)
    expected = module.graph.inputs[0].type
    if tree != expected.treedef or [tuple(x.shape) for x in leaves] != [t.shape for t in expected.leaves]:
        raise FragcError(f"interpret: the state does not have the module's state type {expected}")
    return jax.device_put(leaves, jax.devices()[0])  # the reference runs on one device


def run_iterations(module: Module, state: Any, iterations: int, replicas: int | Mapping[str, int] | None = None
                   ) -> tuple[Any, list[Any]]:
    """`iterations` iterations carrying delay values -> (state, [metrics per iteration]).

    replicas: as for `interpret`; `None` takes each fragment's placed count.
    """
    if replicas is None:
        counts = {n: (f.placement.replicas if f.placement else 1) for n, f in module.fragments.items()}
    else:
        counts = replica_counts(module, replicas)
    leaves, delayed, history = _check_state(module, state), None, []
    n_state = module.graph.out_tree.children()[0].num_leaves
    for _ in range(iterations):
        outs, delayed = run_graph(module, leaves, lambda node, f, ins: fragment_runner(f, counts[f.name])(*ins),
                                  delayed)
        leaves = outs[:n_state]
        history.append(jax.tree.unflatten(module.graph.out_tree, outs)[1])
    return jax.tree.unflatten(module.graph.out_tree.children()[0], leaves), history


def interpret(module: Module, state: Any, replicas: int | Mapping[str, int] = 1) -> tuple[Any, Any]:
    """One iteration of `module` from `state` -> `(state, metrics)`.

    replicas: one count for every fragment, or a mapping from role to count
      (roles not named run with one replica).
    """
    counts = replica_counts(module, replicas)
    leaves = _check_state(module, state)
    if any(isinstance(n, Delay) for n in module.graph.nodes):
        raise FragcError("interpret runs one iteration of a module without delays; use run_iterations for "
                         "a pipelined module")
    outs, _ = run_graph(module, leaves, lambda node, fdef, ins: fragment_runner(fdef, counts[fdef.name])(*ins))
    return jax.tree.unflatten(module.graph.out_tree, outs)
