"""place{policy}: a device group, replica count and lowering for every fragment.

Values get the group of their producer; a state leaf the group of the node
that produces its next value (else of its first consumer); glue the group of
its first operand (or of its first consumer).
"""

from __future__ import annotations

import dataclasses

from fragc.ir.module import Glue, Mesh, Module, Placement, Run, Value
from fragc.ir.replicas import check_divides

from .pipeline import Pass
from .policy import Policy, check_roles


@dataclasses.dataclass(frozen=True)
class Place(Pass):
    policy: Policy = dataclasses.field(repr=False)
    name = "place"

    def label(self) -> str:
        return f"place{{policy={self.policy.name}}}"

    def run(self, module: Module) -> Module:
        policy = self.policy
        check_roles(policy, {f.role for f in module.fragments.values()})
        fragments = {}
        for name, fdef in module.fragments.items():
            role = policy.placement(fdef.role)
            replicas = policy.replicas(fdef.role)
            check_divides(name, fdef.arg_names, fdef.in_types, replicas)
            fragments[name] = fdef.replace(placement=Placement(role.group, replicas, role.lowering))
        meshes = tuple(Mesh(g, tuple(d)) for g, d in policy.groups.items())
        module = module.replace(fragments=fragments, meshes=meshes)
        return module.replace(graph=_place_values(module))


def _place_values(module: Module):
    graph = module.graph
    groups: dict[Value, str] = {}
    first_consumer: dict[Value, str] = {}
    first_leaf_consumer: dict[tuple[Value, int], str] = {}
    default = module.meshes[0].name
    for node in graph.nodes:
        if isinstance(node, Run):
            group = module.fragments[node.fragment].placement.group
            for u in node.inputs:
                first_consumer.setdefault(u.value, group)
                first_leaf_consumer.setdefault((u.value, u.index), group)
    for node in graph.nodes:
        if isinstance(node, Run):
            group = module.fragments[node.fragment].placement.group
        elif isinstance(node, Glue) and node.inputs:
            group = groups.get(node.inputs[0].value) or first_consumer.get(node.inputs[0].value, default)
        else:
            group = first_consumer.get(node.outputs[0], default)
        for v in node.outputs:
            groups[v] = group
    renamed: dict[Value, Value] = {}

    def placed(value: Value, group: str) -> Value:
        leaves = tuple(t.replace(group=group) for t in value.type.leaves)
        return renamed.setdefault(value, value.replace(type=value.type.with_leaves(leaves)))

    state = graph.inputs[0]
    returned = _returned_state_groups(graph, groups)
    state_leaves = tuple(
        t.replace(group=returned.get(i) or first_leaf_consumer.get((state, i), default))
        for i, t in enumerate(state.type.leaves))
    renamed[state] = state.replace(type=state.type.with_leaves(state_leaves))
    for v, g in groups.items():
        placed(v, g)
    return _substitute(graph, renamed)


def _returned_state_groups(graph, groups: dict[Value, str]) -> dict[int, str]:
    """State leaf i lives where the iteration produces its next value, so the loop carries it in place."""
    n_state = graph.out_tree.children()[0].num_leaves
    return {i: groups[u.value] for i, u in enumerate(graph.outputs[:n_state]) if u.value in groups}


def _substitute(graph, renamed: dict[Value, Value]):
    """The graph with every value replaced by its placed version."""
    def fix(uses):
        return tuple(u._replace(value=renamed.get(u.value, u.value)) for u in uses)

    nodes = []
    for node in graph.nodes:
        changes = {"inputs": fix(node.inputs), "outputs": tuple(renamed.get(v, v) for v in node.outputs)}
        if hasattr(node, "initial"):
            changes["initial"] = fix(node.initial)
        nodes.append(node.replace(**changes))
    return graph.replace(inputs=tuple(renamed.get(v, v) for v in graph.inputs), nodes=tuple(nodes),
                         outputs=fix(graph.outputs))
