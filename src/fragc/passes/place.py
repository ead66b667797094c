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
from typing import Any

import jax
from jax.extend import core as jex

from fragc.ir.errors import FragcError, FragmentError
from fragc.ir.host import EnvFleet, env_fleet_error, env_workers_error
from fragc.ir.jax_compat import ordered_effects
from fragc.ir.module import FragmentDef, Glue, Graph, Mesh, Module, Placement, RegionNode, Run, Use, Value, walk
from fragc.ir.replicas import check_divides, replica_body, run_replicated, split_axes
from fragc.ir.time_loop import time_loop_error

from .pipeline import Pass
from .policy import EVALUATOR, Policy, check_roles


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
        in_regions = {n.fragment for n in walk(module.graph.nodes) if isinstance(n, Run)} - {
            n.fragment for n in module.graph.nodes if isinstance(n, Run)}
        for name, fdef in module.fragments.items():
            role = policy.placement(fdef.role)
            replicas = policy.replicas(fdef.role)
            _check_agent_split(policy, fdef, role, replicas)
            _check_ordered_effects(policy, fdef, role, replicas)
            check_divides(name, fdef.arg_names, fdef.in_types, replicas, agents=role.split == "agent",
                          source=fdef.source)
            workers = policy.env_workers if fdef.host_steps else 0
            if reason := env_workers_error(fdef, workers):
                raise FragcError(reason)
            groups = _env_groups(fdef, replicas, policy, name in in_regions)
            fleet = _env_fleet(fdef, policy, replicas * max(groups, 1)) if fdef.host_steps else ""
            fragments[name] = fdef.replace(placement=Placement(role.group, replicas, role.lowering, groups, workers,
                                                               fleet, role.split))
        meshes = tuple(Mesh(g, tuple(d)) for g, d in policy.groups.items())
        module = module.replace(fragments=fragments, meshes=meshes, population=tuple(policy.population),
                                hyperparameters=tuple(policy.hyperparameters),
                                member_loop=policy.member_loop, pbt=policy.pbt)
        return module.replace(graph=_place_values(module))


def _check_ordered_effects(policy: Policy, fdef: FragmentDef, role: Any, replicas: int) -> None:
    """An ordered callback in a fragment runs on one device and unvectorised (JAX's rule): refused where the policy
    places the fragment on more devices, or vectorises a population's members, rather than in XLA's lowering."""
    if not ordered_effects(fdef.body.effects):
        return
    devices = len(policy.groups[role.group])
    vectorised = bool(policy.population) and not policy.member_loop
    if devices == 1 and replicas == 1 and not vectorised:
        return
    where = (f"its {replicas} replicas on {devices} devices of group '{role.group}'" if not vectorised else
             "a population's vectorised members")
    raise FragcError(f"fragment '{fdef.name}' ({fdef.source}) makes an ordered callback (jax.debug.callback or "
                     f"io_callback with ordered=True), which JAX runs on one device and not vectorised, and policy "
                     f"'{policy.name}' runs it as {where}: drop ordered=True, or use policy 'single'")


def _check_agent_split(policy: Policy, fdef: FragmentDef, role: Any, replicas: int) -> None:
    """A role split over agents runs fragments that declare agent axes the replicas divide (agents with parameters
    of their own: their learners are independent); one line otherwise."""
    if role.split != "agent":
        return
    n = fdef.agent_count()
    if n is None:
        raise FragcError(f"policy '{policy.name}' splits role '{fdef.role}' over agents, but fragment '{fdef.name}' "
                         "declares no agent axis (agents that share parameters learn together: give them their own, "
                         "ippo/mappo shared_params=false, or place the role by environments)")
    if not any(leaf.agent is not None for leaf in fdef.out_leaf_types):  # before the count: the real cause
        raise FragcError(f"policy '{policy.name}' splits fragment '{fdef.name}' over agents, but none of its results "
                         "has an agent axis: the agents share what it returns (their parameters): give each agent its "
                         "own parameters (ippo/mappo shared_params=false), or place the role by environments")
    if n % replicas:
        raise FragcError(f"policy '{policy.name}' splits fragment '{fdef.name}' over {replicas} devices, and its "
                         f"{n} agents' parameters do not divide among them: give role '{fdef.role}' a group whose "
                         f"size divides {n} (agent_learners(learners=K))")
    placed = fdef.replace(placement=Placement(role.group, replicas, role.lowering, split="agent"))
    in_axes, out_axes = split_axes(placed)
    body = jex.jaxpr_as_fun(replica_body(placed, replicas))
    try:  # the semantics, abstractly: a result without an agent axis must not vary between the agents' replicas
        jax.eval_shape(lambda *xs: run_replicated(body, xs, in_axes, out_axes, replicas, fdef.name),
                       *(t.struct() for t in fdef.in_leaf_types))
    except FragmentError:
        raise FragcError(f"policy '{policy.name}' splits fragment '{fdef.name}' over agents, but a result it declares "
                         "without an agent axis differs between agents (parameters the agents share): give each agent "
                         "its own parameters (ippo/mappo shared_params=false), or place the role by environments") from None


def _env_groups(fdef: FragmentDef, replicas: int, policy: Policy, in_region: bool) -> int:
    """The policy's environment groups for a fragment that steps host environments (0 for any other),
    checked: the groups divide each replica's environments and the body splits into a host loop. With
    one group, a body that does not split (its host step nested in a jit, say), or one called only inside a
    `for`/`if` region (a host loop is a node of the iteration's top level), runs in-program (0), which is
    synchronous too; with more, that is refused in one line, but for evaluation episodes (`EVALUATOR`), which
    run in-program with any number."""
    groups = policy.env_groups
    if not fdef.host_steps or not groups:
        return 0
    if in_region:
        if groups == 1 or fdef.role == EVALUATOR:
            return 0
        raise FragcError(f"env_groups={groups}: fragment '{fdef.name}' steps host environments inside a for/while/if "
                         "region, where its host loop cannot run (a host loop is a node of the iteration's top "
                         "level); call it outside the region, or use env_groups 1 (host steps in-program)")
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


def _env_fleet(fdef: FragmentDef, policy: Policy, pools: int) -> str:
    """The policy's fleet of remote environment workers for a fragment that steps host environments, with its
    environments per worker (from the fragment's batch, split into `pools` pools of whole workers), checked."""
    if not policy.env_fleet:
        return ""
    fleet = EnvFleet.parse(policy.env_fleet)
    n = fdef.batch_length()
    if n is not None:
        fleet = fleet.resolved(n, pools)
    elif not fleet.envs_per_worker:
        raise FragcError(f"env fleet {fleet}: fragment '{fdef.name}' declares no batch axis to split among the "
                         f"workers; give the environments per worker: ray:{fleet.workers}xE")
    if reason := env_fleet_error(fdef, str(fleet)):
        raise FragcError(reason)
    return str(fleet)


def _place_values(module: Module) -> Graph:
    graph = module.graph
    n_state = graph.out_tree.children()[0].num_leaves
    state = graph.inputs[0]
    carried = {Use(state, k): graph.outputs[k] for k in range(n_state)}
    return _place_graph(module, graph, {}, carried, {})


def _place_graph(module: Module, graph: Graph, fixed: dict[Use, str], carried: dict[Use, Use],
                 fallback: dict[Use, str]) -> Graph:
    """`graph` (the iteration, or a region's graph) with every value placed.

    fixed: input leaves whose groups are decided already (a region on one group, a branch's operands);
    carried: for an input leaf carried around a loop, the leaf that gives its next value (the returned state,
      a `for` body's yielded carry): it lives where that is made, so the loop carries it in place;
    fallback: where an input leaf lives when nothing in the graph makes or reads it (the region's operand).
    """
    default = module.meshes[0].name
    node_group: dict[int, str | None] = _node_groups(module, graph)
    first_reader = _first_readers(graph, node_group)
    producer = graph.producers()
    regions: dict[int, RegionNode] = {}  # placed regions, by index

    def made_on(use: Use) -> str | None:
        """The group of the node that makes a leaf (a placed region: the group of that leaf of its result)."""
        i = producer.get(use.value)
        if i in regions:
            return regions[i].outputs[graph.nodes[i].outputs.index(use.value)].type.leaves[use.index].group
        return node_group.get(i)

    def input_group(use: Use) -> str | None:
        """Where it is made for the next trip (once known), else where it is first read, else the operand's."""
        if use in fixed:
            return fixed[use]
        return (made_on(carried[use]) if use in carried else None) or first_reader.get(use) or fallback.get(use)

    def group_of(use: Use) -> str | None:
        return input_group(use) if use.value in graph.inputs else made_on(use)

    def glue_group(i: int, node: Glue) -> str:
        """Beside the leaves it reads, else where its results are first read, else in the stage before it."""
        beside = _most_common(g for g in map(group_of, node.inputs) if g)
        read_on = next((first_reader[u] for v in node.outputs for u in v.uses() if u in first_reader), None)
        return beside or read_on or node_group.get(i - 1) or default

    for i, node in enumerate(graph.nodes):
        if isinstance(node, Glue):
            node_group[i] = glue_group(i, node)
        elif isinstance(node, RegionNode):
            regions[i] = _place_region(module, node, node_group[i], [group_of(u) or default for u in node.inputs])
    renamed: dict[Value, Value] = {v: _placed(v, [input_group(u) or default for u in v.uses()]) for v in graph.inputs}
    for i, node in enumerate(graph.nodes):
        placed = regions[i].outputs if i in regions else [
            _placed(v, [node_group[i]] * len(v.type.leaves)) for v in node.outputs]
        renamed.update(zip(node.outputs, placed))

    def fix(uses: tuple[Use, ...]) -> tuple[Use, ...]:
        return tuple(u._replace(value=renamed.get(u.value, u.value)) for u in uses)

    nodes = []
    for i, node in enumerate(graph.nodes):
        changes = {"inputs": fix(node.inputs), "outputs": tuple(renamed[v] for v in node.outputs)}
        if hasattr(node, "initial"):
            changes["initial"] = fix(node.initial)
        nodes.append((regions.get(i) or node).replace(**changes))
    return graph.replace(inputs=tuple(renamed[v] for v in graph.inputs), nodes=tuple(nodes),
                         outputs=fix(graph.outputs))


def _place_region(module: Module, node: RegionNode, group: str | None, operand_groups: list[str]) -> RegionNode:
    """A region node with its graphs placed: on `group` entirely when its runs lie there; else each graph's values
    where `_place_graph`'s rules say, its inputs by the kind's dataflow (`RegionNode.entries`, `carries`): a
    carried input where the trip that yields it makes it, any other input where the graphs its operand enters
    first read it (the same place in each), else where the operand lives. Its results live where the input they
    are carried into lives, else where a graph that makes them makes them."""
    where_operand = dict(zip(node.inputs, operand_groups))
    entries, carries = node.entries(), node.carries()
    placed: dict[int, Graph] = {}
    if group is not None:
        for k, g in enumerate(node.regions):
            placed[k] = _place_graph(module, g, {u: group for u in g.input_leaves}, {}, {})
    else:
        read_first = _entries_read_first(module, node)
        for k in _carry_order(carries):
            g = node.regions[k]
            fixed, carried, fallback = {}, {}, {}
            for j, param in enumerate(g.input_leaves):
                source, entry = carries[k][j], entries[k][j] if entries[k] is not None else None
                if source is not None and source[0] == k:  # carried around this graph: where it is made
                    carried[param] = g.outputs[source[1]]
                    if entry is not None:
                        fallback[param] = where_operand.get(entry)
                elif source is not None:  # carried from a graph placed before this one
                    fixed[param] = _carried_group(placed[source[0]], carries[source[0]], source)
                elif entry is not None:
                    fixed[param] = read_first.get(entry) or where_operand.get(entry) or module.meshes[0].name
            placed[k] = _place_graph(module, g, fixed, carried, fallback)
    regions = tuple(placed[k] for k in range(len(node.regions)))
    placed_node = node.with_regions(regions)
    groups = [_exit_group(placed_node, exits, group) for exits in placed_node.exits()]
    outputs, offset = [], 0
    for v in node.outputs:
        outputs.append(_placed(v, groups[offset:offset + len(v.type.leaves)]))
        offset += len(v.type.leaves)
    return placed_node.replace(outputs=tuple(outputs))


def _entries_read_first(module: Module, node: RegionNode) -> dict[Use, str]:
    """For each operand leaf that enters the node's graphs, the group that first reads it there (graphs in order)."""
    found: dict[Use, str] = {}
    for g, entry in zip(node.regions, node.entries()):
        if entry is None:
            continue
        first = _first_readers(g, _node_groups(module, g))
        for param, u in zip(g.input_leaves, entry):
            if param in first:
                found.setdefault(u, first[param])
    return found


def _carry_order(carries: tuple) -> list[int]:
    """The graphs of a region node in an order that places each graph after those it takes carries from."""
    order: list[int] = []

    def visit(k: int) -> None:
        if k not in order:
            for src in {c[0] for c in carries[k] if c is not None and c[0] != k}:
                visit(src)
            order.append(k)

    for k in range(len(carries)):
        visit(k)
    return order


def _carried_group(graph: Graph, carries: tuple, source: tuple[int, int]) -> str | None:
    """Where a yielded leaf of a placed graph lives as a carry: the group of that graph's input it is carried
    into, else where it is yielded."""
    for param, c in zip(graph.input_leaves, carries):
        if c == source:
            return param.type.group
    return graph.outputs[source[1]].type.group


def _exit_group(node: RegionNode, exits: tuple[tuple[int, int], ...], group: str | None) -> str | None:
    """Where a result leaf of a placed region node lives (`RegionNode.exits`): where the input it is carried into
    lives, else where the first graph that makes it (rather than passing an input through) makes it."""
    carries = node.carries()
    for k, m in exits:
        if (k, m) in carries[k]:
            return _carried_group(node.regions[k], carries[k], (k, m))
    yielded = [node.regions[k].outputs[m] for k, m in exits]
    made = [u for u, (k, _) in zip(yielded, exits) if u.value not in node.regions[k].inputs]
    return (made or yielded)[0].type.group if yielded else group


def _run_groups(module: Module, node: RegionNode) -> list[str]:
    """The groups of the fragments a region runs (nested regions' too), in order."""
    return list(dict.fromkeys(module.fragments[n.fragment].placement.group
                              for g in node.regions for n in walk(g.nodes) if isinstance(n, Run)))


def _node_groups(module: Module, graph: Graph) -> dict[int, str | None]:
    """The group of each run, and of each region (`None` where it spans groups), by index."""
    groups: dict[int, str | None] = {}
    for i, n in enumerate(graph.nodes):
        if isinstance(n, Run):
            groups[i] = module.fragments[n.fragment].placement.group
        elif isinstance(n, RegionNode):
            runs = _run_groups(module, n)
            groups[i] = runs[0] if len(runs) == 1 else None
    return groups


def _first_readers(graph: Graph, node_group: dict[int, str | None]) -> dict[Use, str]:
    """For each leaf read by a fragment (or a region on one group), the group of the first that reads it."""
    readers: dict[Use, str] = {}
    for i, node in enumerate(graph.nodes):
        if node_group.get(i) is not None:
            for u in node.inputs:
                readers.setdefault(u, node_group[i])
    return readers


def _most_common(groups) -> str | None:
    counts = collections.Counter(groups)
    return counts.most_common(1)[0][0] if counts else None


def _placed(value: Value, groups: list[str]) -> Value:
    leaves = tuple(t.replace(group=g) for t, g in zip(value.type.leaves, groups))
    return value.replace(type=value.type.with_leaves(leaves))
