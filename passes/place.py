"""place{policy}: a device group, replica count and lowering for every fragment.

Groups are decided leaf by leaf: a fragment's results live on its group; a
state leaf where the iteration makes its next value (so the loop carries it
in place), else where a fragment first reads it; glue beside the leaves it
reads (the group holding most of them); glue that reads nothing placed goes
where its results are first read, else beside the node before it (so that it
joins that node's stage). Deciding by leaves, not by whole values, keeps glue
that reads one leaf of the state (the learner's key) beside that leaf.
"""

from __future__ import annotations

import collections
import dataclasses

from fragc.ir.errors import FragcError
from fragc.ir.host import env_workers_error
from fragc.ir.module import FragmentDef, Glue, Graph, Mesh, Module, Placement, Run, Use, Value
from fragc.ir.replicas import check_divides
from fragc.ir.time_loop import time_loop_error

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
            workers = policy.env_workers if fdef.host_steps else 0
            if reason := env_workers_error(fdef, workers):
                raise FragcError(reason)
            fragments[name] = fdef.replace(placement=Placement(role.group, replicas, role.lowering,
                                                               _env_groups(fdef, replicas, policy), workers))
        meshes = tuple(Mesh(g, tuple(d)) for g, d in policy.groups.items())
        module = module.replace(fragments=fragments, meshes=meshes, population=tuple(policy.population))
        return module.replace(graph=_place_values(module))


def _env_groups(fdef: FragmentDef, replicas: int, policy: Policy) -> int:
    """The policy's environment groups for a fragment that steps host environments (0 for any other),
    checked: the groups divide each replica's environments and the body splits into a host loop. With
    one group, a body that does not split (its host step nested in a jit, say) runs in-program (0), which
    is synchronous too; with more, that is refused in one line."""
    groups = policy.env_groups
    if not fdef.host_steps or not groups:
        return 0
    n = fdef.batch_length()
    if n is not None and n % (replicas * groups):
        raise FragcError(f"env_groups={groups}: fragment '{fdef.name}' steps {n} environments, which do not split "
                         f"into {groups} equal groups on each of {replicas} replica(s)")
    reason = time_loop_error(fdef, replicas, groups)
    if reason is None:
        return groups
    if groups == 1:  # synchronous either way: a rollout the host loop cannot cut steps its host calls in-program
        return 0
    raise FragcError(reason)


def _place_values(module: Module) -> Graph:
    graph = module.graph
    default = module.meshes[0].name
    state = graph.inputs[0]
    first_reader = _first_readers(module)
    node_group: dict[int, str] = {i: module.fragments[n.fragment].placement.group
                                  for i, n in enumerate(graph.nodes) if isinstance(n, Run)}
    producer = graph.producers()
    n_state = graph.out_tree.children()[0].num_leaves
    returned = dict(enumerate(graph.outputs[:n_state]))

    def state_group(k: int) -> str | None:
        """Where the next value of state leaf k is made (once known), else where a fragment first reads it."""
        made_by = producer.get(returned[k].value) if k in returned else None
        return node_group.get(made_by) or first_reader.get(Use(state, k))

    def group_of(use: Use) -> str | None:
        return state_group(use.index) if use.value is state else node_group.get(producer[use.value])

    def glue_group(i: int, node: Glue) -> str:
        """Beside the leaves it reads, else where its results are first read, else in the stage before it."""
        beside = _most_common(g for g in map(group_of, node.inputs) if g)
        read_on = next((first_reader[u] for v in node.outputs for u in v.uses() if u in first_reader), None)
        return beside or read_on or node_group.get(i - 1, default)

    for i, node in enumerate(graph.nodes):
        if i not in node_group:
            node_group[i] = glue_group(i, node)
    renamed = {state: _placed(state, [state_group(k) or default for k in range(len(state.type.leaves))])}
    for i, node in enumerate(graph.nodes):
        for v in node.outputs:
            renamed[v] = _placed(v, [node_group[i]] * len(v.type.leaves))
    return _substitute(graph, renamed)


def _first_readers(module: Module) -> dict[Use, str]:
    """For each leaf read by a fragment, the group of the first fragment that reads it."""
    readers: dict[Use, str] = {}
    for node in module.graph.nodes:
        if isinstance(node, Run):
            group = module.fragments[node.fragment].placement.group
            for u in node.inputs:
                readers.setdefault(u, group)
    return readers


def _most_common(groups) -> str | None:
    counts = collections.Counter(groups)
    return counts.most_common(1)[0][0] if counts else None


def _placed(value: Value, groups: list[str]) -> Value:
    leaves = tuple(t.replace(group=g) for t, g in zip(value.type.leaves, groups))
    return value.replace(type=value.type.with_leaves(leaves))


def _substitute(graph: Graph, renamed: dict[Value, Value]) -> Graph:
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
