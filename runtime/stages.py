"""Compiled stages: the nodes `fuse` grouped on one device group, as one XLA program each."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax

from fragc.ir.interpreter import eval_nodes
from fragc.ir.module import Module, Use, Value

from .lower import leaf_sharding


@dataclasses.dataclass
class Stage:
    name: str
    group: str
    nodes: tuple[int, ...]
    inputs: list[Use]  # leaves read from outside the stage
    outputs: list[Use]  # leaves the stage makes that others read
    lowered: Any = None
    compiled: Any = None


def plan_stages(module: Module) -> list[Stage]:
    graph = module.graph
    stages = []
    for name, group, idx in module.attrs["stages"]:
        made = {v for i in idx for v in graph.nodes[i].outputs}
        inputs = list(dict.fromkeys(u for i in idx for u in _reads(graph.nodes[i]) if u.value not in made))
        later = [u for j, node in enumerate(graph.nodes) if j not in idx for u in _reads(node)]
        outputs = list(dict.fromkeys(u for u in later + list(graph.outputs) if u.value in made))
        stages.append(Stage(name, group, tuple(idx), inputs, outputs))
    return stages


def _reads(node: Any) -> tuple[Use, ...]:
    return tuple(node.inputs) + tuple(getattr(node, "initial", ()))


def compile_stage(stage: Stage, module: Module, devices: Sequence[jax.Device], lowered_frags: dict) -> Stage:
    def fn(*leaves: Any) -> list[Any]:
        env: dict[Value, list[Any]] = {}
        for u, x in zip(stage.inputs, leaves):
            env.setdefault(u.value, [None] * len(u.value.type.leaves))[u.index] = x
        eval_nodes(module, stage.nodes, env, lambda node, fdef, ins: lowered_frags[fdef.name](*ins))
        return [env[u.value][u.index] for u in stage.outputs]

    structs = [jax.ShapeDtypeStruct(u.type.shape, u.type.dtype, sharding=leaf_sharding(u.type, module, devices))
               for u in stage.inputs]
    out_shardings = [leaf_sharding(u.type, module, devices) for u in stage.outputs]
    stage.lowered = jax.jit(fn, out_shardings=out_shardings).lower(*structs)
    stage.compiled = stage.lowered.compile()
    return stage
