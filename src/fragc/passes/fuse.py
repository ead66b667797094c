"""fuse: neighbouring runs and glue on the same device group become one stage.

A stage is a subgraph compiled as one program (`fragc.ir.module.Stage`): its
nodes, the leaves it reads from outside and the leaves it makes that later
nodes or the return read. Transfers and delays stay between stages. A
fragment whose time loop runs from the host (`Placement.env_groups`) is a
stage of its own: the host loop is not one program. A region on one group is
one node of that group's stage (lowered inside its program); a region spanning
groups lies between stages, and its graphs get stages of their own, run trip by
trip or branch by branch from the schedule. Stages are the schedule's
(`Schedule.stages`, keyed by the path of the graph they split), not the nodes'.
"""

from __future__ import annotations

import dataclasses

from fragc.ir.module import (
    Delay, Graph, GraphPath, Module, RegionNode, Schedule, Stage, Transfer, is_host_loop, subgraph,
)

from .pipeline import Pass


@dataclasses.dataclass(frozen=True)
class Fuse(Pass):
    name = "fuse"

    def run(self, module: Module) -> Module:
        stages: dict[GraphPath, tuple[Stage, ...]] = {}
        _fuse(module, module.graph, (), {}, stages)
        schedule = (module.schedule or Schedule()).replace(stages=tuple(stages.items()))
        return module.replace(schedule=schedule)


def _fuse(module: Module, graph: Graph, path: GraphPath, counts: dict[str, int],
          stages: dict[GraphPath, tuple[Stage, ...]]) -> None:
    """The stages of the graph at `path` into `stages`; a region whose nodes lie on one group joins that group's
    stage (it is lowered inside the program), one spanning groups is a step of its own whose graphs are staged
    alike (the schedule runs it)."""
    runs: list[tuple[str, list[int]]] = []  # (group, node indices); an empty group breaks
    for i, node in enumerate(graph.nodes):
        if isinstance(node, (Transfer, Delay)):
            runs.append(("", []))
            continue
        group = module.group_of(node)
        if is_host_loop(module, node):  # run from the host, step by step: a stage of its own
            runs += [(group, [i]), ("", [])]
        elif isinstance(node, RegionNode) and group is None:  # spans groups: run from the schedule
            for k, region in enumerate(node.regions):
                _fuse(module, region, path + (i, k), counts, stages)
            runs.append(("", []))
        elif runs and runs[-1][0] == group:
            runs[-1][1].append(i)
        else:
            runs.append((group, [i]))
    made = []
    for group, idx in runs:
        if idx:
            n = counts.get(group, 0)
            counts[group] = n + 1
            made.append(subgraph(graph, f"{group}{n}" if n else group, group, tuple(idx)))
    if made:
        stages[path] = tuple(made)
