"""loop{k}: how the runtime dispatches iterations (`Schedule.executor` and `iterations_per_dispatch`).

- one stage and nothing between stages: `fused`, k iterations a dispatch;
- stages with transfers carried by collectives: `spmd`, one program over the
  union of the groups, k iterations a dispatch;
- stages with `device_put` transfers, or a host loop (a fragment whose time
  loop runs from the host): `staged`, k iterations a dispatch, each a
  sequence of per-stage programs, transfers and delays queued from Python.

In every shape a dispatch is k iterations: metrics come back, callbacks run
and checkpoints may be written between dispatches.

A population (seeds vectorised over one program) needs the `fused` shape.
Fragments that step host environments (src/fragc/ir/host.py) are checked here against
where the policy put them: one replica on one device, no population, no spmd.
"""

from __future__ import annotations

import dataclasses

from fragc.ir.errors import FragcError
from fragc.ir.host import check_host_placement
from fragc.ir.module import Delay, Glue, Module, RegionNode, Schedule, Transfer, is_host_loop, walk

from .pipeline import Pass


@dataclasses.dataclass(frozen=True)
class DispatchLoop(Pass):
    """The pass that decides how iterations are dispatched, k a dispatch (printed `loop{k=...}`)."""

    k: int = 16
    name = "loop"

    def run(self, module: Module) -> Module:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise FragcError(f"loop: iterations per dispatch must be a positive int, got {self.k!r}")
        check_host_placement(module, None)  # before the shape's own refusals: they say less
        schedule = (module.schedule or Schedule()).replace(executor=self._executor(module), iterations_per_dispatch=self.k)
        module = module.replace(schedule=schedule)
        check_host_placement(module, schedule.executor)
        return module

    def _executor(self, module: Module) -> str:
        between = [n for n in walk(module.graph.nodes) if isinstance(n, (Transfer, Delay))]
        between += [n for n in module.graph.nodes if isinstance(n, RegionNode) and module.group_of(n) is None]
        host_loop = any(is_host_loop(module, n) for n in module.graph.nodes)
        if len(module.stages) <= 1 and not between and not host_loop:
            return "fused"
        if module.population:
            raise FragcError(f"population runs need a policy whose iteration is one stage; this one has "
                             f"{len(module.stages)} stages and {len(between)} transfers and delays")
        if any(isinstance(n, Transfer) and n.carrier == "collective" for n in between):
            reason = spmd_unsupported(module)
            if reason is not None:
                raise FragcError(f"cannot run with transfers='collective': {reason} "
                                 "(collective transfers run the iteration as one SPMD program over the groups)")
            return "spmd"
        return "staged"


def spmd_unsupported(module: Module) -> str | None:
    """Why `module` cannot run as one SPMD program over its groups (None when it can)."""
    sizes = {len(m.devices) for m in module.meshes}
    if len(sizes) > 1:
        return "its device groups differ in size (" + ", ".join(
            f"{m.name}: {len(m.devices)}" for m in module.meshes) + ")"
    ids = [i for m in module.meshes for i in m.devices]
    if len(set(ids)) != len(ids):
        return "its device groups overlap"
    for fdef in module.fragments.values():
        p = fdef.placement
        if p is not None and (p.lowering != "shard_map" or p.replicas != len(module.meshes[0].devices)):
            return f"fragment '{fdef.name}' is not one shard_map replica per device of its group"
        if p is not None and p.split == "agent":  # the program's specs split environment axes only
            return f"fragment '{fdef.name}' splits agents (split=agent); use transfers='device_put'"
    for node in walk(module.graph.nodes):
        if isinstance(node, Glue) and any(u.type.axis is not None for u in node.inputs):
            return "glue between fragments reads a value split over devices"
    return None
