"""insert_transfers: a `transfer` wherever a value is read on another device group.

One transfer per (operand leaves, destination); the returned state must come
back to where the next iteration reads it. Each transfer knows its bytes and
its carrier: `device_put` between per-group programs, or `collective` inside
one program over the union of the groups (the only way across processes).
"""

from __future__ import annotations

import dataclasses

from fragc.ir.errors import FragcError
from fragc.ir.module import CARRIERS, Delay, Module, Run, Transfer, Use, Value
from fragc.ir.types import TreeType

from .pipeline import Pass


@dataclasses.dataclass(frozen=True)
class InsertTransfers(Pass):
    carrier: str = "device_put"
    name = "insert_transfers"

    def run(self, module: Module) -> Module:
        if self.carrier not in CARRIERS:
            raise FragcError(f"insert_transfers: carrier must be one of {', '.join(CARRIERS)}, got {self.carrier!r}")
        graph = module.graph
        nodes: list = []
        moved: dict[tuple, tuple[Use, ...]] = {}

        def to(group: str, uses: tuple[Use, ...]) -> tuple[Use, ...]:
            out = list(uses)
            foreign = [i for i, u in enumerate(uses) if u.type.group is not None and u.type.group != group]
            by_src: dict[str, list[int]] = {}
            for i in foreign:
                by_src.setdefault(uses[i].type.group, []).append(i)
            for src, idx in by_src.items():
                key = (tuple(uses[i] for i in idx), group)
                if key not in moved:
                    leaves = tuple(uses[i].type.replace(group=group) for i in idx)
                    value = Value(f"{_common_name(uses, idx)}_to_{group}",
                                  TreeType.of(tuple(t.struct() for t in leaves)).with_leaves(leaves))
                    nodes.append(Transfer(inputs=key[0], outputs=(value,), src=src, dst=group, carrier=self.carrier))
                    moved[key] = value.uses()
                for i, new in zip(idx, moved[key]):
                    out[i] = new
            return tuple(out)

        def per_argument(group: str, node) -> tuple[Use, ...]:
            """One transfer per fragment argument (or glue operand), so each names what it moves."""
            if isinstance(node, Run):
                sizes = [len(t.leaves) for t in module.fragments[node.fragment].in_types]
            elif isinstance(node, Delay):
                sizes = [len(node.inputs)]  # one value, moved once (its `initial` is usually the same leaves)
            else:
                sizes = [1] * len(node.inputs)
            out, offset = [], 0
            for n in sizes:
                out += to(group, node.inputs[offset : offset + n])
                offset += n
            return tuple(out)

        for node in graph.nodes:
            group = None if isinstance(node, Transfer) else module.group_of(node)
            if group is not None:
                changes = {"inputs": per_argument(group, node)}
                if isinstance(node, Delay):
                    changes["initial"] = to(group, node.initial)
                node = node.replace(**changes)
            nodes.append(node)
        state = graph.inputs[0]
        outputs = list(graph.outputs)
        for i, t in enumerate(state.type.leaves):
            outputs[i] = to(t.group, (outputs[i],))[0] if t.group else outputs[i]
        graph = graph.replace(nodes=tuple(nodes), outputs=tuple(outputs))
        return module.replace(graph=graph, carrier=self.carrier)


def _common_name(uses: tuple[Use, ...], idx: list[int]) -> str:
    from fragc.ir.printer import operand

    text = operand([uses[i] for i in idx])
    if text.startswith("["):
        return uses[idx[0]].value.name
    parts = text.lstrip("%").split(".")
    return parts[-1] if not parts[-1].isdigit() else f"{parts[0]}{parts[-1]}"
