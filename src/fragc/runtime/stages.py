"""The `staged` schedule: one compiled program per stage, transfers by `device_put` between them.

Each stage of the module (a subgraph made by `fuse`) is compiled as one XLA
program on its device group. An iteration executes the module's plan in
order: stages call their programs, transfers `device_put` onto the
destination group, delays yield the previous iteration's value; a dispatch
queues k iterations. Dispatch is
asynchronous, so stages on disjoint groups that do not depend on each other
(rollout k+1 and learn k under staleness 1) overlap without threads. A
fragment whose time loop runs from the host is a stage of its own, run by
its `HostLoopExecutor` (src/fragc/runtime/host_loop.py) from its step region.

The executor keeps no run state: each call carries a `Frame` from iteration to
iteration (the delay values, and the trajectory buffers a host loop made that
the graph reads no more, handed back to it for reuse).
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from fragc.ir.interpreter import Frame, Interpreter
from fragc.ir.errors import FragcError
from fragc.ir.module import (
    For, Graph, HostLoop, If, Module, Run, Stage, Transfer, While, is_host_loop, walk_counted,
)

from .executable import Executable
from .host_loop import HostLoopExecutor
from .lower import LoweringInterpreter, group_mesh, leaf_sharding, lower_fragments
from .multihost import move_within_processes
from .cpu_lowering import cpu_lowerings


def stage_fragments(graph: Graph, nodes: Sequence[int], times: int = 1) -> tuple[str, ...]:
    """The fragment runs of a graph's nodes in one call, a fragment once a run: `times` over for each trip of
    the loops around it (every branch of an `if` counted: an upper bound), so costs per run add up."""
    runs = walk_counted(tuple(graph.nodes[i] for i in nodes), times)
    return tuple(name for node, n in runs if isinstance(node, Run) for name in [node.fragment] * n)


def region_stages(module: Module) -> list[tuple[Stage, Graph, int]]:
    """The stages of the regions spanning groups (nested ones too), from the schedule: (stage, the graph its nodes
    index, how often it runs an iteration: the regions' `times` multiplied, an upper bound for branches)."""
    out = []
    for path, stages in (module.schedule.stages if module.schedule is not None else ()):
        if path:
            times, graph = 1, module.graph
            for i, k in zip(path[::2], path[1::2]):
                times *= graph.nodes[i].times(k)
                graph = graph.nodes[i].regions[k]
            out += [(s, graph, times) for s in stages]
    return out


class StagedProgram(Interpreter):
    """A module whose schedule is `staged`: one executable per stage, k iterations queued a dispatch."""

    donates = False

    def __init__(self, module: Module, devices: Sequence[jax.Device]):
        super().__init__(module)
        self.devices = devices
        body = LoweringInterpreter(module, lower_fragments(module, devices))
        self._programs, self._host_loops = {}, {}
        executables: list[Any] = []  # in stage order; a device stage's index into `device_stages` until compiled
        device_stages: list[tuple[Stage, Graph | None, int]] = []
        for s in module.stages:
            first = module.graph.nodes[s.nodes[0]]
            if is_host_loop(module, first):  # a stage of its own, driven step by step from the host
                if not isinstance(first, HostLoop):
                    raise FragcError(f"stage @{s.name} runs @{first.fragment} as a host loop, but its run is not "
                                     "a loop node: run the lower_host_loops pass last")
                loop = HostLoopExecutor(module, s.nodes[0], first, group_mesh(module, s.group, devices), s.name)
                self._host_loops[s.nodes[0]] = loop
                executables += loop.executables
            else:
                executables.append(len(device_stages))
                device_stages.append((s, None, 1))
        for region_stage in region_stages(module):  # the stages of loops and branches spanning groups
            executables.append(len(device_stages))
            device_stages.append(region_stage)
        compiled = compile_stages(device_stages, body, devices)
        self.executables = [compiled[e] if isinstance(e, int) else e for e in executables]
        self._programs = {e.name: e.compiled for e in compiled}
        self.state_shardings = [self.leaf_sharding(t) for t in module.graph.inputs[0].type.leaves]

    def leaf_sharding(self, leaf: Any) -> Any:
        return leaf_sharding(leaf, self.module, self.devices)

    def __call__(self, state: list[Any], delays: dict | None, n: int, start: int = 0,
                 frame: Frame | None = None) -> tuple[list, dict, list]:
        """`n` iterations, queued without waiting; metrics stacked, one row per iteration. `frame`: the run's
        frame, carried between its dispatches (what the host loops hand back to themselves)."""
        n_state, metrics = len(state), []
        frame = frame if frame is not None else Frame()
        for _ in range(n):
            frame.made = {}
            outs, delays = self.iteration(state, delays, frame)
            state = outs[:n_state]
            metrics.append(outs[n_state:])
            frame.spare = _read_no_more(frame.made, outs, delays)
        return state, delays, [jnp.stack(rows) for rows in zip(*metrics)]

    def stage(self, frame: Frame, stage: Stage, leaves: list[Any]) -> list[Any]:
        if stage.name not in self._programs:  # a host loop: its node, run by `host_loop`
            return super().stage(frame, stage, leaves)
        return self._programs[stage.name](*leaves)

    def host_loop(self, frame: Frame, i: int, node: HostLoop, leaves: list[Any]) -> list[Any]:
        return self._host_loops[i](frame, *leaves)

    def for_loop(self, frame: Frame, i: int, node: For, leaves: list[Any]) -> list[Any]:
        """A loop spanning groups, from the schedule: its body's stages and transfers queued trip by trip."""
        if id(node.body) not in self.staged:  # inside a compiled stage: traced as lax.scan
            return super().for_loop(frame, i, node, leaves)
        nc, nk = node.num_consts, node.num_carry
        consts, carry, xs = leaves[:nc], leaves[nc:nc + nk], leaves[nc + nk:]
        sliced = [self.leaf_sharding(t) for t in node.body.inputs[2].type.leaves]
        ys: list[list[Any]] = [[] for _ in range(node.trips)]
        for t in (range(node.trips - 1, -1, -1) if node.reverse else range(node.trips)):
            outs = self.region(frame, node.body, consts + carry + [jax.device_put(x[t], s) for x, s in zip(xs, sliced)])
            carry, ys[t] = outs[:nk], outs[nk:]
        stacked = node.outputs[1].type.leaves
        if not node.trips:
            return carry + [jax.device_put(jnp.zeros(t.shape, t.dtype), self.leaf_sharding(t)) for t in stacked]
        return carry + [jax.device_put(jnp.stack(column), self.leaf_sharding(t))
                        for column, t in zip(zip(*ys), stacked)]

    def while_loop(self, frame: Frame, i: int, node: While, leaves: list[Any]) -> list[Any]:
        """A `while` spanning groups, from the schedule: its condition read on the host each trip (the iteration
        waits for it), then the body's stages and transfers queued."""
        if id(node.body) not in self.staged and id(node.cond) not in self.staged:
            return super().while_loop(frame, i, node, leaves)
        cond_consts, body_consts, carry = node.split(leaves)
        while bool(jax.device_get(self.region(frame, node.cond, cond_consts + carry)[0])):
            carry = self.region(frame, node.body, body_consts + carry)
        return carry

    def if_branch(self, frame: Frame, i: int, node: If, leaves: list[Any]) -> list[Any]:
        """A branch spanning groups, chosen by the schedule: the index is read on the host (the iteration waits
        for it), then the branch's stages and transfers are queued."""
        if not any(id(b) in self.staged for b in node.branches):
            return super().if_branch(frame, i, node, leaves)
        k = min(max(int(jax.device_get(leaves[0])), 0), len(node.branches) - 1)  # clamped, as lax.switch
        return self.region(frame, node.branches[k], list(leaves[1:]))

    def host_loop_executor(self, fragment: str) -> HostLoopExecutor:
        """The executor of `fragment`'s host loop node."""
        return next(e for e in self._host_loops.values() if e.node.fragment == fragment)

    def transfer(self, frame: Frame, i: int, node: Transfer, leaves: list[Any]) -> list[Any]:
        """`device_put` onto the destination group; across processes each process moves its own shards (the
        host environments' Sebulba layout, `halves_by_process`)."""
        what = f"transfer %{node.outputs[0].name} (@{node.src} -> @{node.dst})"
        return [move_within_processes(x, self.leaf_sharding(t), what)
                for x, t in zip(leaves, node.outputs[0].type.leaves)]


def _read_no_more(made: dict[int, list[Any]], outs: list[Any], delays: dict[int, list[Any]]) -> dict[int, list[Any]]:
    """What the host loops made this iteration that the iteration does not hand on (as state, a metric or a delay
    value): nothing reads it after the iteration, so the next iteration's loop may write into it again."""
    kept = {id(x) for x in outs} | {id(x) for values in delays.values() for x in values}
    return {i: buffers for i, buffers in made.items() if not any(id(x) in kept for x in buffers)}


def whole_iteration(module: Module, lowered: Any, iterations: int) -> Executable:
    """The one executable of a `fused` or `spmd` schedule: every stage, `iterations` a call."""
    return Executable("iteration", tuple(s.name for s in module.stages),
                      stage_fragments(module.graph, range(len(module.graph.nodes))), lowered, lowered.compile(),
                      iterations)


def compile_stage(stage: Stage, body: LoweringInterpreter, devices: Sequence[jax.Device], graph: Graph | None = None,
                  times: int = 1) -> Executable:
    """One stage's program; `graph`: the graph its nodes index (a region's, run `times` an iteration)."""
    return compile_stages([(stage, graph, times)], body, devices)[0]


def compile_stages(stages: Sequence[tuple[Stage, Graph | None, int]], body: LoweringInterpreter,
                   devices: Sequence[jax.Device]) -> list[Executable]:
    """`compile_stage` of each (stage, graph, times): lowered one after another (tracing holds the GIL), then
    compiled at once, one thread each (XLA compiles without the GIL), where there are several."""
    module = body.module
    lowered = []
    for stage, _, _ in stages:
        structs = [jax.ShapeDtypeStruct(u.type.shape, u.type.dtype, sharding=leaf_sharding(u.type, module, devices))
                   for u in stage.inputs]
        out_shardings = [leaf_sharding(u.type, module, devices) for u in stage.outputs]
        with cpu_lowerings():
            lowered.append(jax.jit(lambda *leaves, stage=stage: body.stage(Frame(), stage, list(leaves)),
                                   out_shardings=out_shardings).lower(*structs))
    if len(lowered) > 1:
        with concurrent.futures.ThreadPoolExecutor(min(len(lowered), os.cpu_count() or 1),
                                                   thread_name_prefix="fragc-stage") as pool:
            compiled = list(pool.map(lambda low: low.compile(), lowered))
    else:
        compiled = [low.compile() for low in lowered]
    return [Executable(stage.name, (stage.name,), stage_fragments(graph or module.graph, stage.nodes, times), low, c)
            for (stage, graph, times), low, c in zip(stages, lowered, compiled)]
