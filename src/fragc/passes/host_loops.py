"""`lower_host_loops`: a fragment whose time loop runs from the host becomes a `HostLoop` node with its step in a region.

`place` decides which fragments run their time loop from the host
(`Placement.env_groups` >= 1: a host loop) and `fuse` gives each a stage of
its own. This pass cuts the fragment's body around its host step
(`split_time_loop`, src/fragc/ir/time_loop.py) and replaces its run by a `HostLoop` node:

    %out... = loop @rollout(%params, %runner) steps=T groups=G {
      ^step(%rollout_consts, %rollout_carry, %rollout_x):
      %rollout_ops, %rollout_res = run @rollout.infer(...)             on the fragment's group
      %rollout_ops_to_host = transfer %rollout_ops @actors -> @host via device_get
      %rollout_env = run @rollout.env_step(%rollout_ops_to_host)         on @host
      %rollout_env_to_actors = transfer %rollout_env @host -> @actors via device_put
      %rollout_next, %rollout_y = run @rollout.absorb(%rollout_res, %rollout_env_to_actors)
      yield %rollout_next, %rollout_y
    }

The parts are fragments of the module (`FragmentDef.part_of`), the loop's
prefix and suffix jaxprs are the node's, and the runtime's host-loop executor
and the reference interpreter both run the region's nodes as they are, so a
later pass (or a hand edit) that changes the region changes what runs. It runs
last, after `loop`: what it adds is inside a stage the schedule already runs
from the host.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
from jax.extend import core as jex

from fragc.ir.module import HOST, FragmentDef, Graph, HostLoop, Module, Placement, Run, Transfer, Value, is_host_loop
from fragc.ir.time_loop import PARTS, split_time_loop
from fragc.ir.types import LeafType, TreeType

from .pipeline import Pass


@dataclasses.dataclass(frozen=True)
class LowerHostLoops(Pass):
    name = "lower_host_loops"

    def run(self, module: Module) -> Module:
        nodes, fragments = list(module.graph.nodes), dict(module.fragments)
        for i, node in enumerate(nodes):
            if is_host_loop(module, node) and not isinstance(node, HostLoop):
                nodes[i], parts = lower_host_loop(module.fragments[node.fragment], node)
                fragments.update(parts)
        return module.replace(fragments=fragments, graph=module.graph.replace(nodes=tuple(nodes)))


def lower_host_loop(fdef: FragmentDef, node: Run) -> tuple[HostLoop, dict[str, FragmentDef]]:
    """The `HostLoop` node of `fdef`'s run `node`, and its parts."""
    p = fdef.placement
    R, G = p.replicas, p.env_groups
    whole = split_time_loop(fdef, R, 1)  # one replica's step: the region's types and the reference's bodies
    per_group = split_time_loop(fdef, R, G) if G > 1 else whole  # what each group's programs run, and its axes
    name, nc, nk, n_ops = fdef.name, whole.num_consts, whole.num_carry, whole.num_operands
    per_step = lambda axes: tuple(None if a is None else a - 1 for a in axes)  # noqa: E731 - without time
    in_axes = per_group.group_axes[:nc + nk] + per_step(per_group.group_axes[nc + nk:])
    consts, carry, x = (_leaves(whole.infer.in_avals[a:b], in_axes[a:b], p.group)
                        for a, b in ((0, nc), (nc, nc + nk), (nc + nk, None)))
    n_infer = len(whole.infer.out_avals)
    infer_axes, result_axes = per_group.step_group_axes[:n_infer], per_group.step_group_axes[n_infer:]
    ops = _leaves(whole.infer.out_avals[:n_ops], infer_axes[:n_ops], p.group)
    residuals = _leaves(whole.infer.out_avals[n_ops:], infer_axes[n_ops:], p.group)
    results = _leaves(whole.call.out_avals, result_axes, p.group)
    next_carry = _leaves(whole.absorb.out_avals[:nk], in_axes[nc:nc + nk], p.group)
    y = _leaves(whole.absorb.out_avals[nk:], per_step(per_group.ys_group_axes), p.group)

    def part(suffix: str, role: str, arg_names: Sequence[str], ins: Sequence[TreeType], outs: Sequence[TreeType],
             whole_body: Any, group_body: Any, placement: Placement) -> FragmentDef:
        in_types = tuple(t.with_leaves(tuple(leaf.replace(group=None) for leaf in t.leaves)) for t in ins)
        out_types = tuple(t.with_leaves(tuple(leaf.replace(group=None) for leaf in t.leaves)) for t in outs)
        return FragmentDef(
            f"{name}.{suffix}", role, jex.jaxpr_as_fun(whole_body), tuple(arg_names), _structure(in_types),
            _structure(out_types), tuple(leaf.axis for t in in_types for leaf in t.leaves),
            tuple(leaf.axis for t in out_types for leaf in t.leaves),
            in_types, out_types, whole_body, fdef.source, placement, part_of=name,
            group_bodies=((G, group_body),) if G > 1 else ())

    device = Placement(p.group, R, p.lowering, G)
    host = Placement(HOST, R, "host", 0, p.env_workers, p.env_fleet)
    parts = {
        f"{name}.infer": part("infer", fdef.role, ("consts", "carry", "x"), (consts, carry, x), (ops, residuals),
                              whole.infer, per_group.infer, device),
        f"{name}.env_step": part("env_step", HOST, ("operands",), (ops,), (results,), whole.call, per_group.call, host),
        f"{name}.absorb": part("absorb", fdef.role, ("residuals", "results"), (residuals, results), (next_carry, y),
                               whole.absorb, per_group.absorb, device),
    }
    assert tuple(parts) == tuple(f"{name}.{s}" for s in PARTS)
    return HostLoop(node.fragment, node.inputs, node.outputs, _region(name, p.group, consts, carry, x, ops, residuals,
                                                                  results, next_carry, y),
                whole.length, G, whole.reverse, whole.prefix, whole.suffix), parts


def _region(name: str, group: str, consts: TreeType, carry: TreeType, x: TreeType, ops: TreeType,
            residuals: TreeType, results: TreeType, next_carry: TreeType, y: TreeType) -> Graph:
    """One time step: infer on `group`, the host step on `HOST` between two transfers, absorb on `group`."""
    on = lambda t, g: t.with_leaves(tuple(leaf.replace(group=g) for leaf in t.leaves))  # noqa: E731
    inputs = tuple(Value(f"{name}_{what}", t) for what, t in (("consts", consts), ("carry", carry), ("x", x)))
    v_ops, v_res = Value(f"{name}_ops", ops), Value(f"{name}_res", residuals)
    to_host = Value(f"{name}_ops_to_host", on(ops, HOST))
    env = Value(f"{name}_env", on(results, HOST))
    back = Value(f"{name}_env_to_{group}", on(results, group))
    v_next, v_y = Value(f"{name}_next", next_carry), Value(f"{name}_y", y)
    nodes = (
        Run(f"{name}.infer", tuple(u for v in inputs for u in v.uses()), (v_ops, v_res)),
        Transfer(v_ops.uses(), (to_host,), group, HOST, "device_get"),
        Run(f"{name}.env_step", to_host.uses(), (env,)),
        Transfer(env.uses(), (back,), HOST, group, "device_put"),
        Run(f"{name}.absorb", v_res.uses() + back.uses(), (v_next, v_y)),
    )
    out_tree = jax.tree.structure((tuple(range(len(next_carry.leaves))), tuple(range(len(y.leaves)))))
    return Graph(inputs, nodes, v_next.uses() + v_y.uses(), out_tree)


def _leaves(avals: Sequence[Any], axes: Sequence[int | None], group: str) -> TreeType:
    """A flat tuple of one replica's leaves on `group`, `@env` on the axis the environment groups split."""
    out = tuple(LeafType(tuple(a.shape), a.dtype, axis, group) for a, axis in zip(avals, axes, strict=True))
    return TreeType(jax.tree.structure(tuple(range(len(out)))), out)


def _structure(types: Sequence[TreeType]) -> Any:
    return jax.tree.structure(tuple(jax.tree.unflatten(t.treedef, [0] * len(t.leaves)) for t in types))
