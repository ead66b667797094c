"""Build the iteration graph from the traced top-level jaxpr.

`fragment_call` equations become `Run` nodes; maximal runs of other equations
between them become `Glue` nodes. Control flow around fragment calls becomes
region nodes: a `scan` (and `fori_loop` with a static trip count, which JAX
traces as one) whose body calls a fragment is a `For`, a `while` (`lax.while_loop`,
`fori_loop` with traced bounds) a `While`, a `cond` (`lax.cond`, `lax.switch`)
an `If`, each holding graphs built the same way; a `jit` of the user's own
around fragment calls is inlined. Constants a node reads (a
Python number passed to a fragment, a `jnp` literal, a constant metric, a
closed-over array) are `const` glue: glue with no inputs. Values are named
after their pytree class (`%transition`) or their fragment and position
(`%learn_1`).

What cannot be a region is refused here, in one line naming the fragment and
the user's line: a fragment called under `custom_jvp`/`custom_vjp`/`remat` of
the user's own, and so on.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.extend import core as jex
from jax.extend import source_info_util

from .errors import FragcError
from .jax_compat import scan_counts
from .traps import short_location, user_site
from .module import FragmentDef, For, Glue, Graph, If, Run, Use, Value, While
from .types import LeafType, TreeType

Axes = tuple  # (batch axis, agent axis) of a leaf, each an int or None
NO_AXES: Axes = (None, None)

INLINED = ("pjit", "jit", "closed_call", "core_call")
"""Calls of a jaxpr (the user's own `jax.jit`): their equations are the enclosing graph's."""

REFUSED = {
    "custom_jvp_call": "a jax.custom_jvp function; call the fragment outside it",
    "custom_vjp_call": "a jax.custom_vjp function; call the fragment outside it",
    "custom_vjp_call_jaxpr": "a jax.custom_vjp function; call the fragment outside it",
    "checkpoint": "jax.checkpoint (remat); call the fragment outside it, or checkpoint inside the fragment",
    "remat": "jax.checkpoint (remat); call the fragment outside it, or checkpoint inside the fragment",
    "remat2": "jax.checkpoint (remat); call the fragment outside it, or checkpoint inside the fragment",
    "shard_map": "a shard_map of your own; fragc places fragments itself (choose a policy)",
}
"""Primitives around a fragment call that do not become regions, and what to write instead."""


class FreshNames:
    """Value names not taken yet: `base`, else `base1`, `base2`, ..."""

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
    builder = _Builder(call_p, defs)
    jaxpr = closed.jaxpr
    state = Value("state", _inherit_axes(state_type, jaxpr, builder))
    return builder.graph(jaxpr, dict(zip(jaxpr.constvars, closed.consts)), (state,), state.uses(), out_tree)


def calls_fragments(eqn: Any, call_p: Any) -> bool:
    """Whether `eqn` is a fragment call or holds one in a sub-jaxpr (a scan's body, a cond's branch, ...)."""
    if eqn.primitive is call_p:
        return True
    return any(calls_fragments(e, call_p) for sub in jex.jaxprs_in_params(eqn.params) for e in sub.eqns)


def _inherit_axes(state_type: TreeType, jaxpr: jex.Jaxpr, builder: "_Builder") -> TreeType:
    """A state leaf's batch axis is the one its first consuming fragment declares; a leaf that no fragment reads
    has the one its next value has where a fragment makes it (a leaf the iteration only writes). The state's
    leaves come first among the iteration's results, in the same order."""
    read, made = builder.declared_axes(jaxpr), builder.produced_axes(jaxpr)
    leaves = [_with_axes(t, read[v] if v in read else made.get(out, NO_AXES))
              for v, out, t in zip(jaxpr.invars, jaxpr.outvars, state_type.leaves)]
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


def call_site(eqn: Any) -> str:
    """The user's `folder/file.py:line` of an equation (from JAX's summary of its traceback's user frame)."""
    text = source_info_util.summarize(eqn.source_info) or "?"
    where = text.split(" (", 1)[0]
    path, _, rest = where.partition(":")
    line = rest.split(":", 1)[0]
    return short_location(path, line) if line else where


def _first_call(eqn: Any, call_p: Any) -> Any:
    """The first fragment call equation in `eqn` (itself, or in the jaxprs it holds), or None."""
    if eqn.primitive is call_p:
        return eqn
    for sub in jex.jaxprs_in_params(eqn.params):
        for e in sub.eqns:
            if calls_fragments(e, call_p):
                return _first_call(e, call_p)
    return None


def first_fragment(eqn: Any, call_p: Any) -> str:
    call = _first_call(eqn, call_p)
    return call.params["fragment"] if call is not None else "?"


def _site_of_call(eqn: Any, call_p: Any) -> str:
    """Where `eqn` is, or, for an equation JAX makes with no user frame of its own (`jax.checkpoint`'s), where the
    first fragment call inside it is."""
    where = call_site(eqn)
    call = _first_call(eqn, call_p) if where == "?" else None
    return (user_site(call.source_info) if call is not None else None) or where


class _Builder:
    """Builds a graph per jaxpr (the iteration, a region's body), all naming values from one pool."""

    def __init__(self, call_p: Any, defs: dict[str, FragmentDef]):
        self.call_p, self.defs = call_p, defs
        self.names = FreshNames(("state",))

    # ---------------------------------------------------------------- graphs

    def graph(self, jaxpr: jex.Jaxpr, consts: dict[Any, Any], inputs: tuple[Value, ...], in_uses: list[Use],
              out_tree: Any) -> Graph:
        env: dict[Any, Use] = dict(zip(jaxpr.invars, in_uses))
        nodes: list[Any] = []
        self.equations(jaxpr, env, consts, nodes)
        outputs = tuple(self.use(v, env, consts, nodes) for v in jaxpr.outvars)
        return Graph(inputs=inputs, nodes=tuple(nodes), outputs=outputs, out_tree=out_tree)

    def equations(self, jaxpr: jex.Jaxpr, env: dict[Any, Use], consts: dict[Any, Any], nodes: list[Any]) -> None:
        """Nodes for `jaxpr`'s equations, appended to `nodes`; `env` maps its vars to the leaves they are."""
        pending: list[Any] = []
        used_after = _last_uses(jaxpr)
        declared = self.declared_axes(jaxpr)

        def flush(upto: int) -> None:
            if pending:
                nodes.append(self.glue(pending, env, consts, used_after, upto, nodes, declared))
                pending.clear()

        for i, eqn in enumerate(jaxpr.eqns):
            if not calls_fragments(eqn, self.call_p):
                pending.append(eqn)
                continue
            flush(i)
            name = eqn.primitive.name
            if eqn.primitive is self.call_p:
                nodes.append(self.run(eqn, env, consts, nodes))
            elif name == "scan":
                nodes.append(self.for_region(eqn, env, consts, nodes))
            elif name == "cond":
                nodes.append(self.if_region(eqn, env, consts, nodes))
            elif name == "while":
                nodes.append(self.while_region(eqn, env, consts, nodes))
            elif name in INLINED:
                self.inline(eqn, env, consts, nodes)
            else:
                what = REFUSED.get(name, f"a '{name}' of your own (fragc holds fragment calls under lax.scan, "
                                         "fori_loop, lax.while_loop, lax.cond, lax.switch and jax.jit)")
                raise FragcError(f"fragment '{first_fragment(eqn, self.call_p)}' is called inside {what} "
                                 f"(at {_site_of_call(eqn, self.call_p)})")
        flush(len(jaxpr.eqns))

    def declared_axes(self, jaxpr: jex.Jaxpr) -> dict[Any, Axes]:
        """For each var of `jaxpr` read by a fragment (in a region or inlined call too), the batch and agent axes
        the first such fragment declares for it."""
        axes: dict[Any, Axes] = {}
        for eqn in jaxpr.eqns:
            if eqn.primitive is self.call_p:
                for v, leaf in zip(eqn.invars, self.defs[eqn.params["fragment"]].in_leaf_types):
                    if isinstance(v, jex.Var):
                        axes.setdefault(v, (leaf.axis, leaf.agent))
            elif calls_fragments(eqn, self.call_p):
                for sub in jex.jaxprs_in_params(eqn.params):
                    inner = self.declared_axes(sub)
                    for v, w in zip(_operands_of(eqn, sub), sub.invars):
                        if w in inner and isinstance(v, jex.Var):
                            axes.setdefault(v, _outer_axis(eqn, sub, w, inner[w]))
        return axes

    def produced_axes(self, jaxpr: jex.Jaxpr) -> dict[Any, Axes]:
        """For each var of `jaxpr` that a fragment called at its top level returns, the axes declared for it."""
        axes: dict[Any, Axes] = {}
        for eqn in jaxpr.eqns:
            if eqn.primitive is self.call_p:
                for v, leaf in zip(eqn.outvars, self.defs[eqn.params["fragment"]].out_leaf_types):
                    axes[v] = (leaf.axis, leaf.agent)
        return axes

    # ---------------------------------------------------------------- operands

    def use(self, v: Any, env: dict[Any, Use], consts: dict[Any, Any], nodes: list[Any], axis: Axes = NO_AXES
            ) -> Use:
        """The leaf a var or literal is; a literal or closed-over constant becomes a `const` glue node, with the
        batch and agent `axis` its reader declares (a NumPy array of one value per environment passed to a
        fragment)."""
        if isinstance(v, jex.Var) and v in env:
            return env[v]
        value = v.val if isinstance(v, jex.Literal) else consts[v]
        node = self.constant(v.aval, value, axis)
        nodes.append(node)
        use = Use(node.outputs[0], 0)
        if isinstance(v, jex.Var):
            env[v] = use
        return use

    def constant(self, aval: Any, value: Any, axis: Axes = NO_AXES) -> Glue:
        var = jex.Var(aval)
        if not jax.dtypes.issubdtype(aval.dtype, jax.dtypes.prng_key):
            value = np.asarray(value, dtype=aval.dtype)  # Python scalars as arrays: one type in every branch
        jaxpr = jex.Jaxpr(constvars=[var], invars=[], outvars=[var], eqns=[], debug_info=glue_debug_info(0, 1))
        out = Value(self.names.fresh("c"), _flat_type((LeafType.of(aval, *axis),)))
        return Glue(body=jex.ClosedJaxpr(jaxpr, [value]), inputs=(), outputs=(out,))

    # ---------------------------------------------------------------- nodes

    def run(self, eqn: Any, env: dict[Any, Use], consts: dict[Any, Any], nodes: list[Any]) -> Run:
        fdef = self.defs[eqn.params["fragment"]]
        inputs = tuple(self.as_declared(self.use(v, env, consts, nodes, (leaf.axis, leaf.agent)), leaf, nodes)
                       for v, leaf in zip(eqn.invars, fdef.in_leaf_types))
        outputs, offset = [], 0
        for i, out_type in enumerate(fdef.out_types):
            base = (out_type.class_name or "").lower() or f"{fdef.name}_{i}"
            value = Value(self.names.fresh(base), out_type)
            for j, var in enumerate(eqn.outvars[offset : offset + len(out_type.leaves)]):
                env[var] = Use(value, j)
            offset += len(out_type.leaves)
            outputs.append(value)
        return Run(fragment=fdef.name, inputs=inputs, outputs=tuple(outputs))

    def as_declared(self, use: Use, leaf: LeafType, nodes: list[Any]) -> Use:
        """`use` as the reading fragment declares it: a value made with another batch or agent axis than the reader
        declares (an actor's per-environment output passed whole to a buffer's `add`, declared `None`) passes
        through an identity glue typed as the reader declares, as when the user's own glue sits between them (a
        glue runs on the whole value), so the passes move it as they move a glue's operand."""
        have = use.type
        if (have.axis, have.agent) == (leaf.axis, leaf.agent):
            return use
        var = jex.Var(jax.core.ShapedArray(have.shape, have.dtype, weak_type=have.weak_type))
        jaxpr = jex.Jaxpr(constvars=[], invars=[var], outvars=[var], eqns=[], debug_info=glue_debug_info(1, 1))
        out = Value(self.names.fresh("g"), _flat_type((_with_axes(have, (leaf.axis, leaf.agent)),)))
        nodes.append(Glue(body=jex.ClosedJaxpr(jaxpr, []), inputs=(use,), outputs=(out,)))
        return Use(out, 0)

    def glue(self, eqns: list[Any], env: dict[Any, Use], consts: dict[Any, Any], used_after: dict[Any, int],
             end: int, nodes: list[Any], declared: dict[Any, Axes] | None = None) -> Glue:
        """Glue of `eqns`; an output that a fragment reads has the batch axis that fragment declares for it
        (`declared`), as a state leaf has: a per-environment value the iteration computes between fragments."""
        defined = {v for e in eqns for v in e.outvars}
        inputs, constvars = [], []
        for e in eqns:
            for v in e.invars:
                if isinstance(v, jex.Var) and v not in defined:
                    target = constvars if v in consts and v not in env else inputs
                    if v not in target:
                        target.append(v)
        outputs = [v for e in eqns for v in e.outvars
                   if not isinstance(v, jex.DropVar) and used_after.get(v, -1) >= end]
        effects = set().union(*(e.effects for e in eqns)) if any(e.effects for e in eqns) else jex.no_effects
        jaxpr = jex.Jaxpr(constvars=constvars, invars=inputs, outvars=outputs, eqns=eqns, effects=effects,
                          debug_info=glue_debug_info(len(inputs), len(outputs)))
        body = jex.ClosedJaxpr(jaxpr, [consts[v] for v in constvars])
        leaves = tuple(LeafType.of(_struct(v), *(declared or {}).get(v, NO_AXES)) for v in outputs)
        value = Value(self.names.fresh("g"), _flat_type(leaves))
        node = Glue(body=body, inputs=tuple(env[v] for v in inputs), outputs=(value,))
        for j, v in enumerate(outputs):
            env[v] = Use(value, j)
        return node

    def inline(self, eqn: Any, env: dict[Any, Use], consts: dict[Any, Any], nodes: list[Any]) -> None:
        """A jit of the user's own around fragment calls: its equations join the enclosing graph."""
        closed = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
        inner = closed.jaxpr if hasattr(closed, "jaxpr") else closed
        inner_consts = dict(zip(inner.constvars, getattr(closed, "consts", ())))
        inner_env = {w: self.use(v, env, consts, nodes) for v, w in zip(eqn.invars, inner.invars)}
        self.equations(inner, inner_env, inner_consts, nodes)
        for v, w in zip(eqn.outvars, inner.outvars):
            if not isinstance(v, jex.DropVar):
                env[v] = self.use(w, inner_env, inner_consts, nodes)

    def for_region(self, eqn: Any, env: dict[Any, Use], consts: dict[Any, Any], nodes: list[Any]) -> For:
        p = eqn.params
        closed, (nc, nk) = p["jaxpr"], scan_counts(eqn)
        inputs = tuple(self.use(v, env, consts, nodes) for v in eqn.invars)
        body_jaxpr = closed.jaxpr
        inner_axes = self.declared_axes(body_jaxpr)
        groups = (inputs[:nc], inputs[nc:nc + nk], inputs[nc + nk:])
        bases = ("consts", "carry", "xs")
        invars = (body_jaxpr.invars[:nc], body_jaxpr.invars[nc:nc + nk], body_jaxpr.invars[nc + nk:])
        params = []
        for base, uses, vars_, sliced in zip(bases, groups, invars, (False, False, True)):
            leaves = tuple(_leaf(w, inner_axes, u, sliced) for u, w in zip(uses, vars_))
            params.append(Value(self.names.fresh(base), _structured_type(uses, leaves)))
        body_in = [u for v in params for u in v.uses()]
        n_out = len(body_jaxpr.outvars)
        out_tree = jax.tree.structure(tuple(body_jaxpr.outvars))
        body = self.graph(body_jaxpr, dict(zip(body_jaxpr.constvars, closed.consts)), tuple(params), body_in,
                          out_tree)
        ys = tuple(u.type.stacked(p["length"]) for u in body.outputs[nk:n_out])
        carry = Value(self.names.fresh("carry"), params[1].type)
        stacked = Value(self.names.fresh("ys"), _flat_type(ys))
        for var, use in zip(eqn.outvars, carry.uses() + stacked.uses()):
            env[var] = use
        unroll = p.get("unroll", 1)
        unroll = int(p["length"]) if unroll is True else max(1, int(unroll))
        return For(inputs=inputs, outputs=(carry, stacked), body=body, trips=int(p["length"]),
                   reverse=bool(p["reverse"]), source=call_site(eqn), unroll=unroll)

    def while_region(self, eqn: Any, env: dict[Any, Use], consts: dict[Any, Any], nodes: list[Any]) -> While:
        """`lax.while_loop` around fragment calls: its condition and body as graphs of (constants, carry)."""
        p = eqn.params
        ncc, nbc = p["cond_nconsts"], p["body_nconsts"]
        inputs = tuple(self.use(v, env, consts, nodes) for v in eqn.invars)
        cond_consts, body_consts, carry = inputs[:ncc], inputs[ncc:ncc + nbc], inputs[ncc + nbc:]
        body_jaxpr, cond_jaxpr = p["body_jaxpr"].jaxpr, p["cond_jaxpr"].jaxpr
        body_axes, cond_axes = self.declared_axes(body_jaxpr), self.declared_axes(cond_jaxpr)
        carry_leaves = []  # one type for both graphs' carry: the axis a fragment in either declares, else the operand's
        for u, b, c in zip(carry, body_jaxpr.invars[nbc:], cond_jaxpr.invars[ncc:]):
            declared = {b: body_axes[b]} if b in body_axes else ({b: cond_axes[c]} if c in cond_axes else {})
            carry_leaves.append(_leaf(b, declared, u, False))
        carry_leaves = tuple(carry_leaves)
        graphs = []
        for closed, own, n in ((p["cond_jaxpr"], cond_consts, ncc), (p["body_jaxpr"], body_consts, nbc)):
            inner = self.declared_axes(closed.jaxpr)
            leaves = tuple(_leaf(w, inner, u, False) for u, w in zip(own, closed.jaxpr.invars[:n]))
            params = (Value(self.names.fresh("consts"), _structured_type(own, leaves)),
                      Value(self.names.fresh("carry"), _structured_type(carry, carry_leaves)))
            out_tree = jax.tree.structure(tuple(closed.jaxpr.outvars))
            graphs.append(self.graph(closed.jaxpr, dict(zip(closed.jaxpr.constvars, closed.consts)), params,
                                     [u for v in params for u in v.uses()], out_tree))
        out = Value(self.names.fresh("carry"), graphs[1].inputs[1].type)
        for var, use in zip(eqn.outvars, out.uses()):
            env[var] = use
        return While(inputs=inputs, outputs=(out,), cond=graphs[0], body=graphs[1], source=call_site(eqn))

    def if_region(self, eqn: Any, env: dict[Any, Use], consts: dict[Any, Any], nodes: list[Any]) -> If:
        inputs = tuple(self.use(v, env, consts, nodes) for v in eqn.invars)
        branches = []
        for closed in eqn.params["branches"]:
            inner_axes = self.declared_axes(closed.jaxpr)
            leaves = tuple(_leaf(w, inner_axes, u, False) for u, w in zip(inputs[1:], closed.jaxpr.invars))
            ops = Value(self.names.fresh("ops"), _structured_type(inputs[1:], leaves))
            out_tree = jax.tree.structure(tuple(closed.jaxpr.outvars))
            branches.append(self.graph(closed.jaxpr, dict(zip(closed.jaxpr.constvars, closed.consts)), (ops,),
                                       ops.uses(), out_tree))
        axes = [(next((b.outputs[k].type.axis for b in branches if b.outputs[k].type.axis is not None), None),
                 next((b.outputs[k].type.agent for b in branches if b.outputs[k].type.agent is not None), None))
                for k in range(len(eqn.outvars))]
        leaves = tuple(LeafType.of(v.aval, *a) for v, a in zip(eqn.outvars, axes))
        out = Value(self.names.fresh("branch"), _flat_type(leaves))
        for var, use in zip(eqn.outvars, out.uses()):
            env[var] = use
        return If(inputs=inputs, outputs=(out,), branches=tuple(branches), source=call_site(eqn))


def _operands_of(eqn: Any, sub: jex.Jaxpr) -> list[Any]:
    """The equation's operands that `sub`'s invars stand for (a cond's branches skip the index; a while's condition
    and body take their own constants and the carry)."""
    if eqn.primitive.name == "cond":
        return list(eqn.invars[1:])
    if eqn.primitive.name == "while":
        ncc, nbc = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        carry = list(eqn.invars[ncc + nbc:])
        if sub is eqn.params["cond_jaxpr"].jaxpr:
            return list(eqn.invars[:ncc]) + carry
        return list(eqn.invars[ncc:ncc + nbc]) + carry
    return list(eqn.invars)


def _outer_axis(eqn: Any, sub: jex.Jaxpr, w: Any, axes: Axes) -> Axes:
    """The axes of a scan's operand whose per-trip slice has axes `axes` (others keep theirs)."""
    if eqn.primitive.name == "scan" and sub.invars.index(w) >= sum(scan_counts(eqn)):
        return tuple(None if a is None else a + 1 for a in axes)
    return axes


def _leaf(var: Any, inner_axes: dict[Any, Axes], outer: Use, sliced: bool) -> LeafType:
    """A region parameter's type: its aval, the batch and agent axes a fragment inside declares (else the
    operand's, less the scanned axis), on the operand's group."""
    if var in inner_axes:
        return LeafType.of(var.aval, *inner_axes[var])
    less = lambda a: None if a is None or (sliced and a == 0) else a - 1 if sliced else a  # noqa: E731
    return LeafType.of(var.aval, less(outer.type.axis), less(outer.type.agent))


def _with_axes(leaf: LeafType, axes: Axes) -> LeafType:
    return leaf.replace(axis=axes[0], agent=axes[1])


def _structured_type(uses: tuple[Use, ...], leaves: tuple[LeafType, ...]) -> TreeType:
    """A region parameter's type: the pytree structure of what its operands name (one subtree of a value, or a
    tuple of the subtrees that cover them in order), with these leaves; so that `%carry.params` reads as the
    user's `learner.params` inside the region."""
    trees = [_subtree_structure(value, idx) for value, idx in _runs(uses)]
    if not trees:
        return _flat_type(leaves)
    if len(trees) == 1:
        return TreeType(trees[0], tuple(leaves))
    placeholders = tuple(jax.tree.unflatten(t, [0] * t.num_leaves) for t in trees)
    return TreeType(jax.tree.structure(placeholders), tuple(leaves))


def _runs(uses: tuple[Use, ...]) -> list[tuple[Value, list[int]]]:
    """Consecutive leaves of one value, split where a run is not one subtree into the subtrees covering it."""
    runs: list[tuple[Value, list[int]]] = []
    for u in uses:
        if runs and runs[-1][0] is u.value and runs[-1][1][-1] + 1 == u.index:
            runs[-1][1].append(u.index)
        else:
            runs.append((u.value, [u.index]))
    out = []
    for value, idx in runs:
        out += [(value, part) for part in _covering_subtrees(value, idx)]
    return out


def _covering_subtrees(value: Value, idx: list[int]) -> list[list[int]]:
    """`idx` (consecutive leaves of `value`) as the fewest whole subtrees, in order."""
    parts = value.type.path_parts
    out, start = [], 0
    while start < len(idx):
        end = len(idx)
        while end > start + 1 and not _is_subtree(parts, idx[start:end]):
            end -= 1
        out.append(idx[start:end])
        start = end
    return out


def _common_prefix(paths: list[tuple[str, ...]]) -> tuple[str, ...]:
    prefix = paths[0]
    for p in paths[1:]:
        n = 0
        while n < min(len(prefix), len(p)) and prefix[n] == p[n]:
            n += 1
        prefix = prefix[:n]
    return prefix


def _is_subtree(parts: tuple[tuple[str, ...], ...], idx: list[int]) -> bool:
    prefix = _common_prefix([parts[i] for i in idx])
    return [i for i, p in enumerate(parts) if p[:len(prefix)] == prefix] == list(idx)


def _subtree_structure(value: Value, idx: list[int]) -> Any:
    """The treedef of the subtree of `value` whose leaves are `idx` (one leaf: a bare leaf)."""
    if len(idx) == 1:
        return jax.tree.structure(0)
    if len(idx) == len(value.type.leaves):
        return value.type.treedef
    tree = jax.tree.unflatten(value.type.treedef, list(range(len(value.type.leaves))))
    keys = jax.tree_util.tree_flatten_with_path(tree)[0][idx[0]][0]
    depth = len(_common_prefix([value.type.path_parts[i] for i in idx]))
    for key in keys[:depth]:
        tree = _child(tree, key)
    return jax.tree.structure(tree)


def _child(tree: Any, key: Any) -> Any:
    """One step down a pytree along a key path entry."""
    if isinstance(key, jax.tree_util.GetAttrKey):
        return getattr(tree, key.name)
    if isinstance(key, jax.tree_util.DictKey):
        return tree[key.key]
    if isinstance(key, jax.tree_util.SequenceKey):
        return tree[key.idx]
    children = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)[0]
    return next(child for path, child in children if path and path[0] == key)


def _flat_type(leaves: tuple[LeafType, ...]) -> TreeType:
    """A flat tuple of these leaves."""
    return TreeType.of(tuple(t.struct() for t in leaves)).with_leaves(tuple(leaves))


def glue_debug_info(n_in: int, n_out: int) -> jex.DebugInfo:
    """What JAX wants to know about a jaxpr built by hand."""
    return jex.DebugInfo("glue", "fragc", tuple(f"in{i}" for i in range(n_in)),
                         tuple(f"out{i}" for i in range(n_out)))


def _struct(v: Any) -> Any:
    return LeafType.of(v.aval).struct()
