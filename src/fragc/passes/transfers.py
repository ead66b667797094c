"""insert_transfers: a `transfer` wherever a value is read on another device group.

One transfer per (operand leaves, destination); the returned state must come
back to where the next iteration reads it. Each transfer knows its bytes and
its carrier: `device_put` between per-group programs, or `collective` inside
one program over the union of the groups (the only way across processes).
"""

from __future__ import annotations

import dataclasses

from fragc.ir.errors import FragcError
from fragc.ir.graph_builder import FreshNames
from fragc.ir.printer import operand
from fragc.ir.module import CARRIERS, Delay, Glue, Graph, Module, RegionNode, Run, Transfer, Use, Value, walk
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
        back = [t.group for t in graph.inputs[0].type.leaves]  # the returned state comes back where it is read
        back += [None] * (len(graph.outputs) - len(back))
        taken = {v.name for v in graph.inputs} | {v.name for n in walk(graph.nodes) for v in n.outputs}
        taken |= {v.name for n in walk(graph.nodes) for g in n.regions for v in g.inputs}
        return module.replace(graph=_with_transfers(module, graph, back, self.carrier, taken), carrier=self.carrier)


def _with_transfers(module: Module, graph: Graph, out_groups: list[str | None], carrier: str, taken: set[str]
                    ) -> Graph:
    """`graph` with a transfer before each node that reads a leaf of another group, and before the yield or
    return of a leaf that must live elsewhere (`out_groups`); regions' graphs likewise, so a transfer in a
    loop's body moves every trip, and what the body reads unchanged is moved once, before the loop."""
    mover = _Mover(carrier, taken)
    for node in graph.nodes:
        before = len(mover.nodes)
        if isinstance(node, RegionNode):
            node = _region_with_transfers(module, node, mover, taken)
        elif not isinstance(node, Transfer) and (group := module.group_of(node)) is not None:
            changes = {"inputs": mover.per_argument(module, group, node)}
            if isinstance(node, Delay):
                changes["initial"] = mover.to(group, node.initial)
            node = node.replace(**changes)
        _before_constants(mover.nodes, before)
        mover.nodes.append(node)
    outputs = list(graph.outputs)
    for i, group in enumerate(out_groups):
        if group is not None:
            outputs[i] = mover.to(group, (outputs[i],))[0]
    return graph.replace(nodes=tuple(mover.nodes), outputs=tuple(outputs))


def _before_constants(nodes: list, added: int) -> None:
    """Move the transfers added from index `added` on before the constants (glue with no inputs) just before
    them, which their reader's stage then holds: a constant alone between two transfers would be a program of
    its own (in a loop's body, one more dispatch every trip)."""
    start = added
    while start > 0 and isinstance(nodes[start - 1], Glue) and not nodes[start - 1].inputs:
        start -= 1
    constants = {v for n in nodes[start:added] for v in n.outputs}
    moved = nodes[added:]
    if start == added or any(u.value in constants for n in moved for u in n.inputs):
        return
    nodes[start:] = moved + nodes[start:added]


def _region_with_transfers(module: Module, node: RegionNode, mover: "_Mover", taken: set[str]) -> RegionNode:
    """A region node's operands moved to where its graphs read them (by the kind's dataflow: an operand goes where
    the graph inputs it enters live; an operand no graph takes, such as an `if`'s index, to the node's group when
    it has one), and its graphs' own transfers, each yielding its leaves where what they flow into lives: the
    input they are carried into, else the node's result."""
    destination: dict[int, str | None] = {}
    for g, positions in zip(node.regions, node.entry_positions()):
        for param, k in zip(g.input_leaves, positions or ()):
            destination.setdefault(k, param.type.group)
    group = module.group_of(node)
    groups = [destination.get(k, group) for k in range(len(node.inputs))]
    inputs = mover.to_each(groups, node.inputs)
    results = [t for v in node.outputs for t in v.type.leaves]
    yields: list[list[str | None]] = [[None] * len(g.outputs) for g in node.regions]
    for leaf, exits in zip(results, node.exits()):
        for k, m in exits:
            yields[k][m] = leaf.group
    for k, (g, carries) in enumerate(zip(node.regions, node.carries())):
        for param, source in zip(g.input_leaves, carries):
            if source is not None:
                yields[source[0]][source[1]] = param.type.group
    graphs = tuple(_with_transfers(module, g, yields[k], mover.carrier, taken) for k, g in enumerate(node.regions))
    return node.with_regions(graphs).replace(inputs=inputs)


class _Mover:
    """The transfers of one graph: one per (operand leaves, destination), appended to `nodes` as needed."""

    def __init__(self, carrier: str, taken: set[str]):
        self.carrier, self.names = carrier, FreshNames()
        self.names.taken = taken  # shared by every graph's mover: names stay unique in the module
        self.nodes: list = []
        self.moved: dict[tuple, tuple[Use, ...]] = {}

    def to(self, group: str, uses: tuple[Use, ...]) -> tuple[Use, ...]:
        out = list(uses)
        foreign = [i for i, u in enumerate(uses) if u.type.group is not None and u.type.group != group]
        by_src: dict[str, list[int]] = {}
        for i in foreign:
            by_src.setdefault(uses[i].type.group, []).append(i)
        for src, idx in by_src.items():
            key = (tuple(uses[i] for i in idx), group)
            if key not in self.moved:
                leaves = tuple(uses[i].type.replace(group=group) for i in idx)
                value = Value(self.names.fresh(f"{_common_name(uses, idx)}_to_{group}"),
                              TreeType.of(tuple(t.struct() for t in leaves)).with_leaves(leaves))
                self.nodes.append(Transfer(inputs=key[0], outputs=(value,), src=src, dst=group, carrier=self.carrier))
                self.moved[key] = value.uses()
            for i, new in zip(idx, self.moved[key]):
                out[i] = new
        return tuple(out)

    def to_each(self, groups: list[str | None], uses: tuple[Use, ...]) -> tuple[Use, ...]:
        """Leaf k of `uses` to `groups[k]`, one transfer per destination."""
        out = list(uses)
        for group in dict.fromkeys(g for g in groups if g is not None):
            idx = [k for k, g in enumerate(groups) if g == group]
            for k, new in zip(idx, self.to(group, tuple(uses[k] for k in idx))):
                out[k] = new
        return tuple(out)

    def per_argument(self, module: Module, group: str, node) -> tuple[Use, ...]:
        """One transfer per fragment argument (or glue operand), so each names what it moves."""
        if isinstance(node, Run):
            sizes = [len(t.leaves) for t in module.fragments[node.fragment].in_types]
        elif isinstance(node, Delay):
            sizes = [len(node.inputs)]  # one value, moved once (its `initial` is usually the same leaves)
        else:
            sizes = [1] * len(node.inputs)
        out, offset = [], 0
        for n in sizes:
            out += self.to(group, node.inputs[offset : offset + n])
            offset += n
        return tuple(out)


def _common_name(uses: tuple[Use, ...], idx: list[int]) -> str:
    text = operand([uses[i] for i in idx])
    if text.startswith("["):
        return uses[idx[0]].value.name
    parts = text.lstrip("%").split("#")[0].split(".")  # a run of a flat value's leaves (`%state#0..30`): its value's
    return parts[-1] if not parts[-1].isdigit() else f"{parts[0]}{parts[-1]}"
