"""Build the iteration graph from the traced top-level jaxpr.

`fragment_call` equations become `Run` nodes; maximal runs of other equations
between them become `Glue` nodes (closed-over constants and literal outputs
become glue with no inputs). Values are named after their pytree class
(`%transition`) or their fragment and position (`%learn_1`).
"""

from __future__ import annotations

from typing import Any

from jax.extend import core as jex

from .module import FragmentDef, Glue, Graph, Run, Use, Value
from .types import LeafType, TreeType


class _Names:
    def __init__(self, taken: tuple[str, ...] = ()) -> None:
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}{i}", i + 1
        self.taken.add(name)
        return name


def build_graph(closed: jex.ClosedJaxpr, call_p: Any, state_type: TreeType, out_tree: Any,
                defs: dict[str, FragmentDef]) -> Graph:
    jaxpr = closed.jaxpr
    state_type = _inherit_axes(state_type, jaxpr, call_p, defs)
    state = Value("state", state_type)
    env: dict[Any, Use] = {v: Use(state, i) for i, v in enumerate(jaxpr.invars)}
    consts = dict(zip(jaxpr.constvars, closed.consts))
    names = _Names(("state",))
    nodes: list[Any] = []
    pending: list[Any] = []
    used_after = _last_uses(jaxpr)

    def flush(upto: int) -> None:
        if pending:
            nodes.append(_glue(pending, env, consts, used_after, upto, names))
            pending.clear()

    for i, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive is call_p:
            flush(i)
            nodes.append(_run(eqn, defs[eqn.params["fragment"]], env, names))
        else:
            pending.append(eqn)
    flush(len(jaxpr.eqns))
    loose = [v for v in jaxpr.outvars if not isinstance(v, jex.Var) or v in consts]
    if loose:
        nodes.append(_constants(loose, consts, env, names))
    outputs = tuple(env[v] for v in jaxpr.outvars)
    return Graph(inputs=(state,), nodes=tuple(nodes), outputs=outputs, out_tree=out_tree)


def _inherit_axes(state_type: TreeType, jaxpr: jex.Jaxpr, call_p: Any, defs: dict[str, FragmentDef]) -> TreeType:
    """A state leaf's batch axis is the one its first consuming fragment declares."""
    axes: dict[Any, int | None] = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive is call_p:
            for v, leaf in zip(eqn.invars, defs[eqn.params["fragment"]].in_leaf_types):
                axes.setdefault(v, leaf.axis)
    leaves = [t.replace(axis=axes.get(v)) for v, t in zip(jaxpr.invars, state_type.leaves)]
    return state_type.with_leaves(tuple(leaves))


def _last_uses(jaxpr: jex.Jaxpr) -> dict[Any, int]:
    """For each var, the index of the last equation using it (len(eqns) for outputs)."""
    last: dict[Any, int] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if isinstance(v, jex.Var):
                last[v] = i
    for v in jaxpr.outvars:
        if isinstance(v, jex.Var):
            last[v] = len(jaxpr.eqns)
    return last


def _run(eqn: Any, fdef: FragmentDef, env: dict[Any, Use], names: _Names) -> Run:
    inputs = tuple(_use(v, env) for v in eqn.invars)
    outputs, offset = [], 0
    for i, out_type in enumerate(fdef.out_types):
        base = (out_type.class_name or "").lower() or f"{fdef.name}_{i}"
        value = Value(names.fresh(base), out_type)
        for j, var in enumerate(eqn.outvars[offset : offset + len(out_type.leaves)]):
            env[var] = Use(value, j)
        offset += len(out_type.leaves)
        outputs.append(value)
    return Run(fragment=fdef.name, inputs=inputs, outputs=tuple(outputs))


def _use(v: Any, env: dict[Any, Use]) -> Use:
    if not isinstance(v, jex.Var):
        raise NotImplementedError("literal arguments to fragments are folded by JAX; report this")
    return env[v]


def _glue(eqns: list[Any], env: dict[Any, Use], consts: dict[Any, Any], used_after: dict[Any, int], end: int,
          names: _Names) -> Glue:
    defined = {v for e in eqns for v in e.outvars}
    inputs, constvars = [], []
    for e in eqns:
        for v in e.invars:
            if isinstance(v, jex.Var) and v not in defined:
                target = constvars if v in consts else inputs
                if v not in target:
                    target.append(v)
    outputs = [v for e in eqns for v in e.outvars
               if not isinstance(v, jex.DropVar) and used_after.get(v, -1) >= end]
    effects = set().union(*(e.effects for e in eqns)) if any(e.effects for e in eqns) else jex.no_effects
    jaxpr = jex.Jaxpr(constvars=constvars, invars=inputs, outvars=outputs, eqns=eqns, effects=effects,
                      debug_info=glue_debug_info(len(inputs), len(outputs)))
    body = jex.ClosedJaxpr(jaxpr, [consts[v] for v in constvars])
    value = Value(names.fresh("g"), TreeType.of(tuple(_struct(v) for v in outputs)))
    for j, v in enumerate(outputs):
        env[v] = Use(value, j)
    return Glue(body=body, inputs=tuple(env[v] for v in inputs), outputs=(value,))


def _constants(loose: list[Any], consts: dict[Any, Any], env: dict[Any, Use], names: _Names) -> Glue:
    """Literal or closed-over outputs of the iteration, as glue with no inputs."""
    outvars = [jex.Var(v.aval) for v in loose]
    values = [v.val if isinstance(v, jex.Literal) else consts[v] for v in loose]
    jaxpr = jex.Jaxpr(constvars=outvars, invars=[], outvars=outvars, eqns=[],
                      debug_info=glue_debug_info(0, len(outvars)))
    body = jex.ClosedJaxpr(jaxpr, values)
    value = Value(names.fresh("const"), TreeType.of(tuple(_struct(v) for v in outvars)))
    for j, v in enumerate(loose):
        env[v] = Use(value, j)
    return Glue(body=body, inputs=(), outputs=(value,))


def glue_debug_info(n_in: int, n_out: int) -> jex.DebugInfo:
    """What JAX wants to know about a jaxpr built by hand."""
    return jex.DebugInfo("glue", "fragc", tuple(f"in{i}" for i in range(n_in)),
                         tuple(f"out{i}" for i in range(n_out)))


def _struct(v: Any) -> Any:
    return LeafType.of(v.aval).struct()
