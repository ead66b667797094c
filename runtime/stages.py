"""The `staged` schedule: one compiled program per stage, transfers by `device_put` between them.

Each stage of the module (a subgraph made by `fuse`) is compiled as one XLA
program on its device group. An iteration executes the module's plan in
order: stages call their programs, transfers `device_put` onto the
destination group, delays yield the previous iteration's value; a dispatch
queues k iterations. Dispatch is
asynchronous, so stages on disjoint groups that do not depend on each other
(rollout k+1 and learn k under staleness 1) overlap without threads. A
fragment whose time loop runs from the host is a stage of its own, run by
its `HostLoop` (runtime/host_loop.py).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from fragc.ir.interpreter import Interpreter
from fragc.ir.errors import FragcError
from fragc.ir.module import Loop, Module, Run, Stage, Transfer, is_host_loop
from fragc.ir.time_loop import time_loop_of

from .executable import Executable
from .host_loop import HostLoop
from .lower import Lowered, group_mesh, leaf_sharding, lower_fragments
from .multihost import move_within_processes


def stage_fragments(module: Module, nodes: Sequence[int]) -> tuple[str, ...]:
    graph = module.graph
    return tuple(graph.nodes[i].fragment for i in nodes if isinstance(graph.nodes[i], Run))


class StagedProgram(Interpreter):
    """A module whose schedule is `staged`: one executable per stage, k iterations queued a dispatch."""

    donates = False

    def __init__(self, module: Module, devices: Sequence[jax.Device]):
        super().__init__(module)
        self.devices = devices
        body = Lowered(module, lower_fragments(module, devices))
        self.executables, self._programs, self._host_loops = [], {}, {}
        for s in module.stages:
            first = module.graph.nodes[s.nodes[0]]
            if is_host_loop(module, first):  # a stage of its own, driven step by step from the host
                if not isinstance(first, Loop):
                    raise FragcError(f"stage @{s.name} runs @{first.fragment} as a host loop, but its run is not "
                                     "a loop node: run the lower_host_loops pass last")
                loop = HostLoop(time_loop_of(module, first), module.fragments[first.fragment],
                                group_mesh(module, s.group, devices), s.name)
                self._host_loops[first.fragment] = loop
                self.executables += loop.executables
            else:
                self.executables.append(compile_stage(s, body, devices))
                self._programs[s.name] = self.executables[-1].compiled
        self.state_shardings = [self.leaf_sharding(t) for t in module.graph.inputs[0].type.leaves]

    def leaf_sharding(self, leaf: Any) -> Any:
        return leaf_sharding(leaf, self.module, self.devices)

    def __call__(self, state: list[Any], delays: dict | None, n: int) -> tuple[list, dict, list]:
        """`n` iterations, queued without waiting; metrics stacked, one row per iteration."""
        n_state, metrics = len(state), []
        for _ in range(n):
            outs, delays = self.iteration(state, delays)
            state = outs[:n_state]
            metrics.append(outs[n_state:])
        return state, delays, [jnp.stack(rows) for rows in zip(*metrics)]

    def stage(self, stage: Stage, leaves: list[Any]) -> list[Any]:
        if stage.name not in self._programs:  # a host loop: its node, run by `loop`
            return super().stage(stage, leaves)
        return self._programs[stage.name](*leaves)

    def loop(self, i: int, node: Loop, leaves: list[Any]) -> list[Any]:
        return self._host_loops[node.fragment](*leaves)

    def host_loop(self, fragment: str) -> HostLoop:
        """The `HostLoop` that runs `fragment`'s loop node."""
        return self._host_loops[fragment]

    def transfer(self, i: int, node: Transfer, leaves: list[Any]) -> list[Any]:
        """`device_put` onto the destination group; across processes each process moves its own shards (the
        host environments' Sebulba layout, `halves_by_process`)."""
        what = f"transfer %{node.outputs[0].name} (@{node.src} -> @{node.dst})"
        return [move_within_processes(x, self.leaf_sharding(t), what)
                for x, t in zip(leaves, node.outputs[0].type.leaves)]


def whole_iteration(module: Module, lowered: Any, iterations: int) -> Executable:
    """The one executable of a `fused` or `spmd` schedule: every stage, `iterations` a call."""
    return Executable("iteration", tuple(s.name for s in module.stages),
                      stage_fragments(module, range(len(module.graph.nodes))), lowered, lowered.compile(), iterations)


def compile_stage(stage: Stage, body: Lowered, devices: Sequence[jax.Device]) -> Executable:
    module = body.module
    structs = [jax.ShapeDtypeStruct(u.type.shape, u.type.dtype, sharding=leaf_sharding(u.type, module, devices))
               for u in stage.inputs]
    out_shardings = [leaf_sharding(u.type, module, devices) for u in stage.outputs]
    lowered = jax.jit(lambda *leaves: body.stage(stage, list(leaves)), out_shardings=out_shardings).lower(*structs)
    return Executable(stage.name, (stage.name,), stage_fragments(module, stage.nodes), lowered, lowered.compile())
