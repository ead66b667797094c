"""fuse: neighbouring runs and glue on the same device group become one compiled stage.

Transfers and delays stay between stages: the runtime performs them. The
stages are recorded as `attrs["stages"]`: (name, group, node indices).
"""

from __future__ import annotations

import dataclasses

from fragc.ir.module import Delay, Glue, Module, Run, Transfer

from .pipeline import Pass


@dataclasses.dataclass(frozen=True)
class Fuse(Pass):
    name = "fuse"

    def run(self, module: Module) -> Module:
        stages: list[tuple[str, str, list[int]]] = []
        counts: dict[str, int] = {}
        for i, node in enumerate(module.graph.nodes):
            if isinstance(node, (Transfer, Delay)):
                stages.append(("", "", []))  # a break between stages
                continue
            group = _group(module, node)
            if stages and stages[-1][1] == group:
                stages[-1][2].append(i)
            else:
                n = counts.get(group, 0)
                counts[group] = n + 1
                stages.append((f"{group}{n}" if n else group, group, [i]))
        kept = tuple((name, group, tuple(idx)) for name, group, idx in stages if idx)
        return module.replace(attrs={**module.attrs, "stages": kept})


def _group(module: Module, node) -> str:
    if isinstance(node, Run):
        return module.fragments[node.fragment].placement.group
    assert isinstance(node, Glue)
    leaves = node.outputs[0].type.leaves
    return leaves[0].group if leaves else module.meshes[0].name
