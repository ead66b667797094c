"""Lowering: fragments to `jax.shard_map` over their device group's mesh.

A fragment with R replicas on a group of R devices runs as `shard_map` with
its declared axes split over the mesh axis `REPLICA`. `check_vma=False` keeps
`fragc.pmean` of a gradient a plain mean, so the program computes what the
reference interpreter's `vmap` computes (JAX_NOTES.md, section 3).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.extend import core as jex
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fragc.ir.errors import FragcError
from fragc.ir.module import REPLICA, FragmentDef, Module


def spec(axis: int | None) -> P:
    """The partition spec of a leaf whose batch axis is `axis`."""
    return P() if axis is None else P(*([None] * axis), REPLICA)


def group_mesh(module: Module, group: str, devices: Sequence[jax.Device]) -> Mesh:
    for m in module.meshes:
        if m.name == group:
            return Mesh(np.array([devices[i] for i in m.devices]), (REPLICA,))
    raise FragcError(f"device group '{group}' is not defined by the module")


def lower_fragment(fdef: FragmentDef, mesh: Mesh) -> Callable[..., Any]:
    """`leaves -> leaves` running `fdef` replica-parallel over `mesh`."""
    replicas = fdef.placement.replicas
    if replicas != mesh.size:
        raise FragcError(
            f"fragment '{fdef.name}': {replicas} replicas on a group of {mesh.size} devices; "
            "shard_map lowering runs one replica per device"
        )
    body = jex.jaxpr_as_fun(fdef.body_for(replicas))
    return jax.shard_map(
        lambda *xs: tuple(body(*xs)),
        mesh=mesh,
        in_specs=tuple(spec(a) for a in fdef.in_axes),
        out_specs=tuple(spec(a) for a in fdef.out_axes),
        check_vma=False,
    )


def state_shardings(module: Module, devices: Sequence[jax.Device]) -> list[NamedSharding]:
    """Where each state leaf lives: its group's mesh, split along its batch axis."""
    out = []
    for leaf in module.graph.inputs[0].type.leaves:
        mesh = group_mesh(module, leaf.group, devices)
        out.append(NamedSharding(mesh, spec(leaf.axis)))
    return out
