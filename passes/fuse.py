"""fuse: neighbouring runs and glue on the same device group become one stage.

A stage is a subgraph compiled as one program (`fragc.ir.module.Stage`): its
nodes, the leaves it reads from outside and the leaves it makes that later
nodes or the return read. Transfers and delays stay between stages. A
fragment whose time loop runs from the host (`Placement.env_groups`) is a
stage of its own: the host loop is not one program. A `for`/`if` region on
one group is one node of that group's stage (lowered inside its program as
`lax.scan`/`lax.switch`); a region spanning groups lies between stages, and
its graphs get stages of their own (`For.stages`, `If.stages`), run trip by
trip or branch by branch from the schedule.
"""

from __future__ import annotations

import dataclasses

from fragc.ir.module import REGION_KINDS, Delay, For, Graph, If, Module, Stage, Transfer, is_host_loop, subgraph

from .pipeline import Pass


@dataclasses.dataclass(frozen=True)
class Fuse(Pass):
    name = "fuse"

    def run(self, module: Module) -> Module:
        counts: dict[str, int] = {}
        graph, stages = _fuse(module, module.graph, counts)
        return module.replace(graph=graph, stages=stages)


def _fuse(module: Module, graph: Graph, counts: dict[str, int]) -> tuple[Graph, tuple[Stage, ...]]:
    """The graph's stages; a region whose nodes lie on one group joins that group's stage (it is lowered inside
    the program), one spanning groups is a step of its own with its graphs' stages (the schedule runs it)."""
    runs: list[tuple[str, list[int]]] = []  # (group, node indices); an empty group breaks
    nodes = list(graph.nodes)
    for i, node in enumerate(nodes):
        if isinstance(node, (Transfer, Delay)):
            runs.append(("", []))
            continue
        group = module.group_of(node)
        if isinstance(node, REGION_KINDS) and group is None:  # spans groups: run from the schedule
            nodes[i] = _fuse_region(module, node, counts)
            runs.append(("", []))
        elif is_host_loop(module, node):  # run from the host, step by step: a stage of its own
            runs += [(group, [i]), ("", [])]
        elif runs and runs[-1][0] == group:
            runs[-1][1].append(i)
        else:
            runs.append((group, [i]))
    graph = graph.replace(nodes=tuple(nodes))
    stages = []
    for group, idx in runs:
        if idx:
            n = counts.get(group, 0)
            counts[group] = n + 1
            stages.append(subgraph(graph, f"{group}{n}" if n else group, group, tuple(idx)))
    return graph, tuple(stages)


def _fuse_region(module: Module, node: For | If, counts: dict[str, int]) -> For | If:
    if isinstance(node, For):
        body, stages = _fuse(module, node.body, counts)
        return node.replace(body=body, stages=stages)
    fused = [_fuse(module, b, counts) for b in node.branches]
    return node.replace(branches=tuple(b for b, _ in fused), stages=tuple(s for _, s in fused))
