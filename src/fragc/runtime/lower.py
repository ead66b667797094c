"""Lowering fragments to JAX over their device group's mesh.

- `shard_map`: R replicas on a group of R devices, declared axes split over
  the mesh axis `replica`. `check_vma=False` keeps `fragc.pmean` of a gradient
  a plain mean, so the program computes what the reference interpreter's
  `vmap` computes (JAX_NOTES.md, section 3).
- `shard_map` of a fragment placed `split=agent`: its agent axes split over the
  mesh instead, each device running the one-replica body on its agents.
- `jit`: one replica (single-device maths) with the declared axes sharded
  over the group; XLA's GSPMD partitioner inserts the collectives.
- populations: one replica, no mesh, so the iteration can be vmapped over seeds.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.extend import core as jex
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fragc.ir.collectives import without_unit_reductions
from fragc.ir.errors import FragcError
from fragc.ir.interpreter import Interpreter
from fragc.ir.module import REPLICA, FragmentDef, Module
from fragc.ir.replicas import replica_body, run_replicated, split_axes, splits_agents
from fragc.ir.types import LeafType


def spec(axis: int | None) -> P:
    """The partition spec of a leaf whose batch axis is `axis`."""
    return P() if axis is None else P(*([None] * axis), REPLICA)


def group_mesh(module: Module, group: str, devices: Sequence[jax.Device]) -> Mesh:
    for m in module.meshes:
        if m.name == group:
            return Mesh(np.array([devices[i] for i in m.devices]), (REPLICA,))
    raise FragcError(f"device group '{group}' is not defined by the module")


def leaf_sharding(leaf: LeafType, module: Module, devices: Sequence[jax.Device]) -> NamedSharding:
    """Where a placed leaf lives: its group's mesh, split along its batch axis (its agent axis on a group whose
    fragments split the agents)."""
    agents = any(splits_agents(f) and f.placement.group == leaf.group for f in module.fragments.values())
    return NamedSharding(group_mesh(module, leaf.group, devices), spec(leaf.agent if agents else leaf.axis))


def lower_fragment(fdef: FragmentDef, mesh: Mesh | None) -> Callable[..., Any]:
    """`leaves -> leaves` for `fdef` under its placement (`mesh=None`: no mesh, one replica)."""
    placement = fdef.placement
    if mesh is None:
        return _one_replica(fdef)
    if placement.lowering == "jit":
        return _gspmd(fdef, mesh)
    if placement.replicas != mesh.size:
        raise FragcError(
            f"fragment '{fdef.name}': {placement.replicas} replicas on a group of {mesh.size} devices; "
            "shard_map lowering runs one replica per device"
        )
    body = replica_body(fdef, placement.replicas)
    body = jex.jaxpr_as_fun(without_unit_reductions(body) if placement.replicas == 1 else body)
    in_axes, out_axes = split_axes(fdef)
    return jax.shard_map(
        lambda *xs: tuple(body(*xs)),
        mesh=mesh,
        in_specs=tuple(spec(a) for a in in_axes),
        out_specs=tuple(spec(a) for a in out_axes),
        check_vma=False,
    )


def _one_replica(fdef: FragmentDef) -> Callable[..., Any]:
    if fdef.placement is not None and fdef.placement.replicas != 1:
        raise FragcError(f"fragment '{fdef.name}' has {fdef.placement.replicas} replicas; populations need 1")
    body = jex.jaxpr_as_fun(fdef.body)
    return lambda *xs: run_replicated(body, xs, fdef.in_axes, fdef.out_axes, 1, fdef.name)


def population_fragment(fdef: FragmentDef) -> Callable[..., Any]:
    """A fragment of a vectorised population's iteration: its one-replica body with its reductions over the
    replica axis dropped, as the single run's `shard_map` runs it (`without_unit_reductions`), where nothing
    else in it names the replica axis; else the one-replica reference semantics (`run_replicated`, a `vmap`
    of one replica). Under the population's `vmap` that vmap's axis of one stayed in XLA's program: 37
    transposes (of the weights at every gradient step) against the 16 of PureJaxRL's `jit(vmap(train))`."""
    body = without_unit_reductions(fdef.body)
    if names_replica(body.jaxpr):
        return _one_replica(fdef)
    if fdef.placement is not None and fdef.placement.replicas != 1:
        raise FragcError(f"fragment '{fdef.name}' has {fdef.placement.replicas} replicas; populations need 1")
    run = jex.jaxpr_as_fun(body)
    return lambda *xs: list(run(*xs))


def names_replica(jaxpr: jex.Jaxpr) -> bool:
    """Whether an equation of `jaxpr` (or of a jaxpr inside one: a scan's body, a cond's branches) names the
    replica axis (`axis_index`, a collective)."""
    for eqn in jaxpr.eqns:
        for value in eqn.params.values():
            if _names_replica_param(value):
                return True
    return False


def _names_replica_param(value: Any) -> bool:
    if isinstance(value, jex.ClosedJaxpr):
        return names_replica(value.jaxpr)
    if isinstance(value, jex.Jaxpr):
        return names_replica(value)
    if isinstance(value, (tuple, list)):
        return any(_names_replica_param(v) for v in value)
    return value == REPLICA if isinstance(value, str) else False


def _gspmd(fdef: FragmentDef, mesh: Mesh) -> Callable[..., Any]:
    """The one-replica body with its batch axes sharded over `mesh`."""
    if fdef.placement.replicas != 1:
        raise FragcError(f"fragment '{fdef.name}': jit lowering runs single-device maths; replicas must be 1")
    run = _one_replica(fdef)

    def constrain(xs: Sequence[Any], axes: Sequence[int | None]) -> list[Any]:
        return [jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec(a))) for x, a in zip(xs, axes)]

    return lambda *xs: constrain(run(*constrain(xs, fdef.in_axes)), fdef.out_axes)


class LoweringInterpreter(Interpreter):
    """The module's nodes with each fragment under its lowering: what a compiled stage or program traces."""

    def __init__(self, module: Module, fragments: dict[str, Callable[..., Any]]):
        super().__init__(module)
        self.fragments = fragments

    def fragment(self, fdef: FragmentDef) -> Callable[..., Any]:
        return self.fragments[fdef.name]


def lower_fragments(module: Module, devices: Sequence[jax.Device]) -> dict[str, Callable[..., Any]]:
    """Every fragment lowered over its group's mesh (the parts of a loop node run only in its `HostLoop`)."""
    return {name: lower_fragment(f, group_mesh(module, f.placement.group, devices))
            for name, f in module.callable_fragments().items()}
