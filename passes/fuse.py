"""fuse: neighbouring runs and glue on the same device group become one stage.

A stage is a subgraph compiled as one program (`fragc.ir.module.Stage`): its
nodes, the leaves it reads from outside and the leaves it makes that later
nodes or the return read. Transfers and delays stay between stages. A
fragment whose time loop runs from the host (`Placement.env_groups`) is a
stage of its own: the host loop is not one program.
"""

from __future__ import annotations

import dataclasses

from fragc.ir.module import Delay, Module, Transfer, is_host_loop, subgraph

from .pipeline import Pass


@dataclasses.dataclass(frozen=True)
class Fuse(Pass):
    name = "fuse"

    def run(self, module: Module) -> Module:
        runs: list[tuple[str, list[int]]] = []  # (group, node indices); an empty group breaks
        for i, node in enumerate(module.graph.nodes):
            if isinstance(node, (Transfer, Delay)):
                runs.append(("", []))
                continue
            group = module.group_of(node)
            if is_host_loop(module, node):  # run from the host, step by step: a stage of its own
                runs += [(group, [i]), ("", [])]
            elif runs and runs[-1][0] == group:
                runs[-1][1].append(i)
            else:
                runs.append((group, [i]))
        stages, counts = [], {}
        for group, idx in runs:
            if idx:
                n = counts.get(group, 0)
                counts[group] = n + 1
                stages.append(subgraph(module.graph, f"{group}{n}" if n else group, group, tuple(idx)))
        return module.replace(stages=tuple(stages))
