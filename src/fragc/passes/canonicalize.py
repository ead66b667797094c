"""canonicalize: drop dead nodes, dead glue outputs and unused fragment definitions.

Consecutive glue equations are already one node when traced (see
fragc.ir.graph_builder), so no merging is needed here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jax.extend import core as jex
from jax.interpreters import partial_eval as pe

from fragc.ir.graph_builder import glue_debug_info
from fragc.ir.module import Glue, Graph, Module, Use, Value, fragments_run_in, map_regions
from fragc.ir.types import TreeType

from .pipeline import Pass


@dataclasses.dataclass(frozen=True)
class Canonicalize(Pass):
    name = "canonicalize"

    def run(self, module: Module) -> Module:
        graph = _without_dead_nodes(module.graph, _effectful(module))
        return module.replace(graph=graph, fragments=_used_fragments(module, list(graph.nodes)))


def _effectful(module: Module) -> Callable[[Any], bool]:
    """Whether a node has an effect beyond its outputs: it runs (itself or in its regions) a fragment whose body
    has one (a `jax.debug.callback` or `io_callback` logging what it is given, say)."""
    with_effects = {name for name, f in module.fragments.items() if f.body.effects}
    return lambda node: not with_effects.isdisjoint(fragments_run_in((node,)))


def _without_dead_nodes(graph: Graph, effectful: Callable[[Any], bool]) -> Graph:
    """`graph` less what nothing it returns (or yields) reads; regions' graphs likewise, every yield live. A run
    whose fragment has an effect stays though nothing reads it: fragments are pure but for their effects."""
    live = {u.value: set() for u in graph.outputs}
    for u in graph.outputs:
        live[u.value].add(u.index)
    nodes = []
    renames: dict[Value, tuple[Value, list[int]]] = {}
    for node in reversed(graph.nodes):
        used = [sorted(live.get(v, ())) for v in node.outputs]
        if not any(used) and not effectful(node):
            continue  # an unused call of a pure fragment is dead
        if isinstance(node, Glue) and len(used[0]) < len(node.outputs[0].type.leaves):
            node, renames[node.outputs[0]] = _shrink_glue(node, used[0])
        node = map_regions(node, lambda g: _without_dead_nodes(g, effectful))
        for u in node.operands:
            live.setdefault(u.value, set()).add(u.index)
        nodes.append(node)
    nodes.reverse()
    return _rewire(graph.replace(nodes=tuple(nodes)), renames)


def _shrink_glue(node: Glue, keep: list[int]) -> tuple[Glue, tuple[Value, list[int]]]:
    """Keep only the outputs in `keep`; dead equations and inputs go too."""
    jaxpr = node.body.jaxpr
    used_outputs = [i in keep for i in range(len(jaxpr.outvars))]
    dced, used_inputs = pe.dce_jaxpr(jaxpr, used_outputs, instantiate=True)
    n_in = sum(used_inputs)
    dced = dced.replace(debug_info=glue_debug_info(n_in, len(dced.outvars)))
    body = jex.ClosedJaxpr(dced, node.body.consts)
    old = node.outputs[0]
    leaves = tuple(old.type.leaves[i] for i in keep)
    value = Value(old.name, TreeType.of(tuple(t.struct() for t in leaves)).with_leaves(leaves))
    inputs = tuple(u for u, used in zip(node.inputs, used_inputs) if used)
    return Glue(body=body, inputs=inputs, outputs=(value,)), (value, keep)


def _rewire(graph, renames: dict[Value, tuple[Value, list[int]]]):
    """Point uses of shrunk glue values at their new leaf positions."""
    if not renames:
        return graph

    def fix(u: Use) -> Use:
        if u.value in renames:
            value, keep = renames[u.value]
            return Use(value, keep.index(u.index))
        return u

    nodes = tuple(n.replace(inputs=tuple(fix(u) for u in n.inputs)) for n in graph.nodes)
    return graph.replace(nodes=nodes, outputs=tuple(fix(u) for u in graph.outputs))


def _used_fragments(module: Module, nodes: list) -> dict:
    used = set(fragments_run_in(tuple(nodes)))
    return {name: f for name, f in module.fragments.items() if name in used}
