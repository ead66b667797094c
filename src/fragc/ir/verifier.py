"""Structural checks of a module, as rule tables: one table per node kind, one for the module.

A rule is a function `(site) -> message | None`, named for what it promises;
its docstring says why. `verify` runs the rules of every node's kind in graph
order, then the module's rules, and raises `VerifyError` naming the pass
label, the node and the rule at fault. Types are compared by shape, dtype and
batch axis, and by device group where both sides are placed.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from .errors import VerifyError
from .module import (
    CARRIERS, EXECUTORS, HOST, Delay, Glue, Graph, GraphPath, HostLoop, Module, RegionNode, Run, Transfer, Use, Value,
    crosses_to_the_host, graph_at, is_host_loop, subgraph, walk,
)
from .types import LeafType


@dataclasses.dataclass
class Site:
    """What a rule sees: the module, and for node rules the node, its index, the values defined before it and the
    region node whose graph holds it (None at the iteration's top level)."""

    module: Module
    index: int = -1
    node: object = None
    defined: frozenset = frozenset()
    parent: object = None


Rule = Callable[[Site], "str | None"]


def verify(module: Module) -> Module:
    """Raise `VerifyError` naming the pass label, node and rule; return the module unchanged."""
    defined = _verify_graph(module, module.graph, f"{module.label}: ")
    _apply(MODULE_RULES, Site(module, defined=frozenset(defined)), f"{module.label}")
    return module


def _verify_graph(module: Module, graph: Graph, where: str, parent: RegionNode | None = None) -> set[Value]:
    """The node rules over a graph and, the same way, over the graphs of its region nodes: one scoping rule for
    every region kind (a region's graph sees only its own inputs and nodes, and yields what it defines); the
    values it defines. Nodes in a host loop's step follow `STEP_RULES`."""
    defined: set[Value] = set(graph.inputs)
    table = STEP_RULES if isinstance(parent, HostLoop) else NODE_RULES
    for i, node in enumerate(graph.nodes):
        site = Site(module, i, node, frozenset(defined), parent)
        here = f"{where}node {i} ({describe(node)})"
        if node.kind not in table:
            raise VerifyError(f"{here}: a host loop's step holds runs, glue and transfers, not a {node.kind} "
                              "[rule step_holds_runs_glue_and_transfers]")
        _apply(table[node.kind], site, here)
        for k, region in enumerate(node.regions):
            name = region_name(node, k)
            inner = _verify_graph(module, region, f"{here}, {name} ", node)
            missing = _first(_undefined(u, frozenset(inner)) for u in region.outputs)
            if missing is not None:
                raise VerifyError(f"{here}: {name} yields a value it does not define: {missing} "
                                  "[rule region_yields_what_it_defines]")
        defined.update(node.outputs)
    return defined


def region_name(node: RegionNode, k: int) -> str:
    """How errors name a node's region k: `body`, `cond`, `then`/`else`, `case 2`, `step`."""
    label = node.region_labels[k]
    return {"trip": "body"}.get(label, label.replace("case", "case ") if label.startswith("case") else label)


def _apply(rules: Iterable[Rule], site: Site, where: str) -> None:
    for rule in rules:
        message = rule(site)
        if message is not None:
            raise VerifyError(f"{where}: {message} [rule {rule.__name__}]")


def describe(node: object) -> str:
    name = f" @{node.fragment}" if isinstance(node, (Run, HostLoop)) else ""
    outs = ", ".join(f"%{v.name}" for v in node.outputs)
    return f"{node.kind}{name} -> {outs}"


def same_type(a: LeafType, b: LeafType) -> bool:
    """Shape, dtype, batch and agent axes agree; groups too where both are placed."""
    groups_agree = a.group is None or b.group is None or a.group == b.group
    return ((tuple(a.shape), str(a.dtype), a.axis, a.agent) == (tuple(b.shape), str(b.dtype), b.axis, b.agent)
            and groups_agree)


def _first(messages: Iterable["str | None"]) -> str | None:
    return next((m for m in messages if m is not None), None)


# ---------------------------------------------------------------- rules every node obeys


def operands_defined_before_use(site: Site) -> str | None:
    """SSA: a node reads only the graph's inputs and values of nodes before it."""
    return _first(_undefined(u, site.defined) for u in site.node.operands)


def _undefined(use: Use, defined: frozenset) -> str | None:
    if use.value not in defined:
        return f"uses %{use.value.name} before it is defined"
    if not 0 <= use.index < len(use.value.type.leaves):
        return f"leaf {use.index} of %{use.value.name} does not exist"
    return None


def results_defined_once(site: Site) -> str | None:
    """SSA: every value has one definition."""
    return _first(f"value %{v.name} is defined twice" for v in site.node.outputs if v in site.defined)


COMMON: tuple[Rule, ...] = (operands_defined_before_use, results_defined_once)


# ---------------------------------------------------------------- run


def fragment_is_defined(site: Site) -> str | None:
    """A run calls a fragment of the module."""
    if site.node.fragment not in site.module.fragments:
        return f"fragment @{site.node.fragment} is not defined"
    return None


def operands_match_the_arguments(site: Site) -> str | None:
    """Leaf k of the operands has the type of leaf k of the fragment's arguments (batch axis included)."""
    fdef = site.module.fragments[site.node.fragment]
    expected = fdef.in_leaf_types
    if len(site.node.inputs) != len(expected):
        return f"{len(site.node.inputs)} operands, but @{fdef.name} takes {len(expected)} leaves"
    return _first(f"operand {k} is {u.type}, but @{fdef.name} expects {t}"
                  for k, (u, t) in enumerate(zip(site.node.inputs, expected)) if not same_type(u.type, t))


def results_match_the_fragment(site: Site) -> str | None:
    """One value per fragment result, of the result's type."""
    fdef = site.module.fragments[site.node.fragment]
    if len(site.node.outputs) != len(fdef.out_types):
        return f"{len(site.node.outputs)} results, but @{fdef.name} returns {len(fdef.out_types)}"
    for v, t in zip(site.node.outputs, fdef.out_types):
        if len(v.type.leaves) != len(t.leaves) or not all(map(same_type, v.type.leaves, t.leaves)):
            return f"result %{v.name} is not of @{fdef.name}'s result type"
    return None


def placed_on_a_mesh(site: Site) -> str | None:
    """A placed fragment runs on a device group the module defines."""
    p = site.module.fragments[site.node.fragment].placement
    if p is not None and p.group not in {m.name for m in site.module.meshes}:
        return f"@{site.node.fragment} runs on @{p.group}, which the module does not define"
    return None


def replicas_fill_the_group(site: Site) -> str | None:
    """shard_map runs one replica per device of the group; jit runs single-device maths (one replica)."""
    fdef = site.module.fragments[site.node.fragment]
    p = fdef.placement
    if p is None:
        return None
    size = next(len(m.devices) for m in site.module.meshes if m.name == p.group)
    expected = size if p.lowering == "shard_map" else 1
    if p.replicas != expected:
        return f"@{fdef.name} has {p.replicas} replicas, but {p.lowering} on @{p.group} ({size} devices) runs {expected}"
    return None


def batch_axes_divide_by_replicas(site: Site) -> str | None:
    """A declared axis splits into equal parts, one per replica."""
    fdef = site.module.fragments[site.node.fragment]
    n = fdef.batch_length()
    if fdef.placement and fdef.placement.split == "env" and n is not None and n % fdef.placement.replicas:
        return f"batch axis of length {n} does not divide by {fdef.placement.replicas} replicas"
    return None


def agent_split_splits_agent_axes(site: Site) -> str | None:
    """A fragment whose replicas split the agents (`split=agent`) declares agent axes, which divide by its replicas,
    runs under shard_map (GSPMD runs one replica), and steps no host environments."""
    fdef = site.module.fragments[site.node.fragment]
    p = fdef.placement
    if p is None or p.split == "env":
        return None
    n = fdef.agent_count()
    if p.split != "agent":
        return f"@{fdef.name} splits '{p.split}'; replicas split the env or the agent axes"
    if n is None:
        return f"@{fdef.name} is placed split=agent but declares no agent axis (agent_axes)"
    if p.lowering != "shard_map" or fdef.host_steps:
        return f"@{fdef.name} is placed split=agent under {p.lowering}; agents split under shard_map, on the device"
    if n % p.replicas:
        return f"agent axis of length {n} does not divide by {p.replicas} replicas"
    return None


def host_loop_splits_the_environments(site: Site) -> str | None:
    """A host loop (`env_groups` > 0) runs a fragment that steps host environments, and each replica's
    environments split into `env_groups` equal groups."""
    fdef = site.module.fragments[site.node.fragment]
    p = fdef.placement
    if p is None or not p.env_groups:
        return None
    if not fdef.host_steps:
        return f"@{fdef.name} runs as a host loop (env_groups={p.env_groups}) but steps no host environments"
    n = fdef.batch_length()
    if n is not None and n % (p.replicas * p.env_groups):
        return (f"batch axis of length {n} does not divide into {p.env_groups} environment groups on each of "
                f"{p.replicas} replicas")
    return None


def env_workers_only_for_host_environments(site: Site) -> str | None:
    """A worker count (`env_workers`) is placed only on a fragment that steps host environments."""
    fdef = site.module.fragments[site.node.fragment]
    p = fdef.placement
    if p is not None and p.env_workers and not fdef.host_steps:
        return f"@{fdef.name} has env_workers={p.env_workers} but steps no host environments"
    if p is not None and p.env_fleet and not fdef.host_steps and not fdef.part_of:
        return f"@{fdef.name} has env_fleet={p.env_fleet} but steps no host environments"
    return None


def operands_live_on_the_fragments_group(site: Site) -> str | None:
    """Once transfers are inserted, a fragment reads only values on its own group."""
    p = site.module.fragments[site.node.fragment].placement
    if site.module.carrier is None or p is None:
        return None
    return _first(f"operand {k} lives on @{u.type.group}, but @{site.node.fragment} runs on @{p.group}"
                  for k, u in enumerate(site.node.inputs) if u.type.group not in (None, p.group))


# ---------------------------------------------------------------- glue


def operands_match_the_glue_body(site: Site) -> str | None:
    """The body's inputs are the operands, in order and type."""
    invars = site.node.body.jaxpr.invars
    if len(invars) != len(site.node.inputs):
        return f"{len(site.node.inputs)} operands for a body of {len(invars)} inputs"
    return _first(f"operand {k} is {u.type}, but the glue body expects {LeafType.of(var.aval)}"
                  for k, (u, var) in enumerate(zip(site.node.inputs, invars))
                  if (tuple(u.type.shape), str(u.type.dtype)) != (tuple(var.aval.shape), str(var.aval.dtype)))


def glue_defines_one_value_of_its_body_outputs(site: Site) -> str | None:
    """Glue defines one value whose leaves are the body's outputs."""
    outvars = site.node.body.jaxpr.outvars
    if len(site.node.outputs) != 1 or len(site.node.outputs[0].type.leaves) != len(outvars):
        return "glue must define one value with one leaf per body output"
    leaves = site.node.outputs[0].type.leaves
    return _first(f"result leaf {k} is {t}, but the glue body makes {LeafType.of(var.aval)}"
                  for k, (t, var) in enumerate(zip(leaves, outvars))
                  if (tuple(t.shape), str(t.dtype)) != (tuple(var.aval.shape), str(var.aval.dtype)))


def glue_reads_and_writes_one_group(site: Site) -> str | None:
    """Once transfers are inserted, glue runs beside one group: its operands and results live there."""
    if site.module.carrier is None:
        return None
    results = site.node.outputs[0].type.leaves if site.node.outputs else ()
    groups = [("operand", k, u.type.group) for k, u in enumerate(site.node.inputs)] + \
             [("result leaf", k, t.group) for k, t in enumerate(results)]
    placed = [g for g in groups if g[2] is not None]
    return _first(f"{what} {k} lives on @{g}, but {placed[0][0]} {placed[0][1]} on @{placed[0][2]}"
                  for what, k, g in placed if g != placed[0][2])


# ---------------------------------------------------------------- transfer


def transfer_moves_between_two_groups(site: Site) -> str | None:
    """Both ends are device groups of the module, and they differ."""
    node, meshes = site.node, {m.name for m in site.module.meshes}
    unknown = [g for g in (node.src, node.dst) if g not in meshes]
    if unknown:
        return f"@{unknown[0]} is not a device group of the module"
    if node.src == node.dst:
        return f"moves from @{node.src} to itself"
    if node.carrier not in CARRIERS:
        return f"carrier '{node.carrier}' is not one of {', '.join(CARRIERS)}"
    return None


def transfer_source_is_the_operands_group(site: Site) -> str | None:
    """What is moved lives on the source group."""
    node = site.node
    return _first(f"operand {k} lives on @{u.type.group}, not on the source @{node.src}"
                  for k, u in enumerate(node.inputs) if u.type.group != node.src)


def transfer_destination_is_the_results_group(site: Site) -> str | None:
    """The result has the operands' types, on the destination group."""
    node = site.node
    if len(node.outputs) != 1 or len(node.outputs[0].type.leaves) != len(node.inputs):
        return "a transfer defines one value with one leaf per operand"
    for k, (u, t) in enumerate(zip(node.inputs, node.outputs[0].type.leaves)):
        if t.group != node.dst:
            return f"result leaf {k} lives on @{t.group}, not on the destination @{node.dst}"
        if not same_type(u.type.replace(group=None), t):
            return f"result leaf {k} is {t}, but operand {k} is {u.type}"
    return None


# ---------------------------------------------------------------- loop (a host loop) and its step

STEP_ENDS = {"device_get": (None, HOST), "device_put": (HOST, None)}
"""Where a step's transfers move leaves: `device_get` to the host, `device_put` back to the loop's group (None)."""


def loop_runs_a_host_loop(site: Site) -> str | None:
    """A loop node runs a fragment placed as a host loop, with as many environment groups, for a step or more."""
    p = site.module.fragments[site.node.fragment].placement
    if p is None or p.env_groups != site.node.groups:
        return (f"a loop of {site.node.groups} groups runs @{site.node.fragment}, which is not placed as a host "
                f"loop of as many (env_groups={p.env_groups if p else 0})")
    if site.node.steps < 1:
        return f"a loop of {site.node.steps} steps"
    return None


def step_takes_what_the_prefix_makes(site: Site) -> str | None:
    """The step takes three values (constants, carry, one step's inputs) of the types the prefix makes (a step's
    inputs less their leading time axis), yields its carry's types first, and the suffix takes the per-step
    outputs stacked over the steps."""
    node = site.node
    step = node.body
    if len(step.inputs) != 3:
        return f"the step has {len(step.inputs)} inputs, not 3 (constants, carry, the step's inputs)"
    carry = step.inputs[1].type.leaves
    yielded = [u.type for u in step.outputs[:len(carry)]]
    if len(step.outputs) < len(carry) or not all(_leaf_agrees(a, b, False) for a, b in zip(carry, yielded)):
        return "the step does not yield its carry's types"
    if node.prefix is None or node.suffix is None:
        return None  # read back without bodies: nothing to compare with
    params = [t for v in step.inputs for t in v.type.leaves]
    made = list(node.prefix.out_avals)[:len(params)]
    nk = len(carry)
    want = [(tuple(a.shape) if k < node.num_consts + nk else tuple(a.shape)[1:], str(a.dtype))
            for k, a in enumerate(made)]
    if len(made) < len(params) or [(tuple(t.shape), str(t.dtype)) for t in params] != want:
        return "the step's inputs are not the constants, carry and one step of the inputs its prefix makes"
    ys = [(node.steps,) + tuple(u.type.shape) for u in step.outputs[nk:]]
    taken = [tuple(a.shape) for a in node.suffix.in_avals][len(node.suffix.in_avals) - len(ys):]
    if ys != taken:
        return f"the step's outputs stacked over {node.steps} steps are not what its suffix takes"
    return None


def step_crosses_to_the_host(site: Site) -> str | None:
    """A host loop's step steps host environments: it runs something on the host."""
    runs = [n for n in site.node.body.nodes if isinstance(n, Run)]
    if not any(_runs_on(site.module, n) == HOST for n in runs):
        return "the step runs nothing on the host"
    return None


def _runs_on(module: Module, node: Run) -> str | None:
    p = module.fragments[node.fragment].placement
    return p.group if p is not None else None


def _loop_group(site: Site) -> str:
    return site.module.fragments[site.parent.fragment].placement.group


def part_of_the_loop(site: Site) -> str | None:
    """A run in a host loop's step calls a part of the loop's fragment (`lower_host_loops` cut them, each with the
    bodies its environment groups run), on the loop's group or the host, reading values where it runs."""
    fdef, loop = site.module.fragments[site.node.fragment], site.parent
    if fdef.part_of != loop.fragment:
        return f"@{fdef.name} is not a part of @{loop.fragment}"
    on = _runs_on(site.module, site.node)
    if on not in (HOST, _loop_group(site)):
        return f"@{fdef.name} runs on @{on}, not on the loop's group @{_loop_group(site)} or the host"
    return _first(f"operand {j} lives on @{u.type.group}, but @{fdef.name} runs on @{on}"
                  for j, u in enumerate(site.node.inputs) if u.type.group != on)


def step_transfer_crosses_to_the_host(site: Site) -> str | None:
    """A step's transfers move leaves between the loop's group and the host: `device_get` there, `device_put`
    back."""
    node, group = site.node, _loop_group(site)
    ends = STEP_ENDS.get(node.carrier)
    expected = ends and tuple(group if e is None else e for e in ends)
    if (node.src, node.dst) != expected:
        return (f"moves @{node.src} -> @{node.dst} via {node.carrier}; a step moves @{group} -> @{HOST} via "
                f"device_get and @{HOST} -> @{group} via device_put")
    return None


def step_glue_on_the_loops_group(site: Site) -> str | None:
    """Glue in a step runs on the loop's group: it reads and makes values there (the host runs only host steps)."""
    group = _loop_group(site)
    leaves = [u.type for u in site.node.inputs] + list(site.node.outputs[0].type.leaves)
    return _first(f"a leaf lives on @{t.group}, but glue in a step runs on @{group}" for t in leaves
                  if t.group not in (None, group))


def part_runs_only_in_its_loop(site: Site) -> str | None:
    """A host loop's part (`rollout.infer`, ...) runs only inside its loop node's step."""
    fdef = site.module.fragments[site.node.fragment]
    if fdef.part_of:
        return f"@{fdef.name} is a part of @{fdef.part_of}'s host loop; it runs only in that loop's step"
    return None


# ---------------------------------------------------------------- delay


def delay_types_agree(site: Site) -> str | None:
    """The delayed leaves, the initial leaves and the result have one type, leaf by leaf; once transfers
    are inserted, on one group (before, the delay's operands may still live where they are made)."""
    node = site.node
    out = node.outputs[0].type.leaves if len(node.outputs) == 1 else ()
    if not len(node.inputs) == len(node.initial) == len(out):
        return f"{len(node.inputs)} delayed leaves, {len(node.initial)} initial leaves and {len(out)} result leaves"
    placed = site.module.carrier is not None
    for k, (a, b, t) in enumerate(zip(node.inputs, node.initial, out)):
        types = [a.type, b.type, t] if placed else [x.replace(group=None) for x in (a.type, b.type, t)]
        if not (same_type(types[0], types[2]) and same_type(types[1], types[2])):
            return f"leaf {k}: delayed {a.type}, initial {b.type}, result {t}"
    return None


# ---------------------------------------------------------------- for and if (control flow regions)


def _leaf_agrees(a: LeafType, b: LeafType, placed: bool) -> bool:
    """Shape and dtype agree, and the group where transfers are inserted (batch axes may differ across a region's
    boundary: a fragment inside declares its own)."""
    same = (tuple(a.shape), str(a.dtype)) == (tuple(b.shape), str(b.dtype))
    return same and (not placed or a.group is None or b.group is None or a.group == b.group)


def for_operands_match_the_body(site: Site) -> str | None:
    """A `for` body takes three values (constants, carry, one trip's slice of the scanned leaves) whose leaves are
    the operands' (a scanned leaf less its leading axis of length `trips`), on the same groups once transfers
    are inserted; it yields the carry's types, then the trip's outputs."""
    node, placed = site.node, site.module.carrier is not None
    if len(node.body.inputs) != 3:
        return f"the body has {len(node.body.inputs)} inputs, not 3 (constants, carry, the trip's slices)"
    if node.trips < 0:
        return f"a loop of {node.trips} trips"
    params = [t for v in node.body.inputs for t in v.type.leaves]
    if len(params) != len(node.inputs):
        return f"{len(node.inputs)} operands for a body of {len(params)} input leaves"
    sliced = len(node.body.inputs[0].type.leaves) + len(node.body.inputs[1].type.leaves)
    for k, (u, t) in enumerate(zip(node.inputs, params)):
        want = t if k < sliced else t.stacked(node.trips)
        if not _leaf_agrees(u.type, want, placed):
            return f"operand {k} is {u.type}, but the body reads {t}" + (" a trip" if k >= sliced else "")
    carry = node.body.inputs[1].type.leaves
    yielded = [u.type for u in node.body.outputs]
    if len(yielded) < len(carry) or not all(_leaf_agrees(a, b, placed) for a, b in zip(carry, yielded)):
        return "the body does not yield its carry's types"
    return None


def for_results_are_the_carry_and_the_stacked_outputs(site: Site) -> str | None:
    """A `for` defines two values: the final carry (the carry's types) and the trips' outputs stacked along a
    new leading axis."""
    node = site.node
    if len(node.outputs) != 2:
        return f"a for defines 2 values (carry, stacked outputs), not {len(node.outputs)}"
    carry, ys = node.outputs[0].type.leaves, node.outputs[1].type.leaves
    params = node.body.inputs[1].type.leaves
    if len(carry) != len(params) or not all(_leaf_agrees(a, b, False) for a, b in zip(carry, params)):
        return f"%{node.outputs[0].name} is not of the carry's types"
    per_trip = [u.type for u in node.body.outputs[len(params):]]
    stacked = [t.stacked(node.trips) for t in per_trip]
    if len(ys) != len(stacked) or not all(_leaf_agrees(a, b, False) for a, b in zip(ys, stacked)):
        return f"%{node.outputs[1].name} is not the body's outputs stacked over {node.trips} trips"
    return None


def if_branches_take_the_operands_and_yield_the_results(site: Site) -> str | None:
    """An `if` reads an int32 scalar index, then the operands; every branch takes one value of the operands'
    leaves and yields the result's leaves (shape, dtype, and group once transfers are inserted)."""
    node, placed = site.node, site.module.carrier is not None
    index = node.inputs[0].type if node.inputs else None
    if index is None or index.shape != () or str(index.dtype) != "int32":
        return f"the branch index is {index}, not an i32[] scalar"
    if len(node.outputs) != 1 or not node.branches:
        return "an if defines one value and holds at least one branch"
    results = node.outputs[0].type.leaves
    for k, branch in enumerate(node.branches):
        name = region_name(node, k)
        params = [t for v in branch.inputs for t in v.type.leaves]
        if len(branch.inputs) != 1 or len(params) != len(node.inputs) - 1:
            return f"the {name} branch does not take one value of the {len(node.inputs) - 1} operands"
        bad = next((j for j, (u, t) in enumerate(zip(node.inputs[1:], params)) if not _leaf_agrees(u.type, t, placed)),
                   None)
        if bad is not None:
            return f"the {name} branch reads operand {bad} as {params[bad]}, but it is {node.inputs[1 + bad].type}"
        yielded = [u.type for u in branch.outputs]
        if len(yielded) != len(results) or not all(_leaf_agrees(a, b, placed) for a, b in zip(yielded, results)):
            return f"the {name} branch does not yield the types of %{node.outputs[0].name}"
    return None


def while_operands_match_the_graphs(site: Site) -> str | None:
    """A `while`'s condition takes (its constants, the carry) and yields one boolean scalar; its body takes (its
    constants, the carry) and yields the carry's types; the operands are those constants and the carry's initial
    leaves, of those types (on the same groups once transfers are inserted); its result is the carry."""
    node, placed = site.node, site.module.carrier is not None
    for name, g in (("condition", node.cond), ("body", node.body)):
        if len(g.inputs) != 2:
            return f"the {name} has {len(g.inputs)} inputs, not 2 (constants, carry)"
    if [t for t in node.cond.inputs[1].type.leaves] and not all(
            _leaf_agrees(a, b, False) for a, b in zip(node.cond.inputs[1].type.leaves, node.body.inputs[1].type.leaves)):
        return "the condition and the body read different carries"
    for name, positions, g in zip(("condition", "body"), node.entry_positions(), node.regions):
        params = list(g.input_leaves)
        if len(params) != len(positions):
            return f"the {name} reads {len(params)} leaves, but {len(positions)} operands enter it"
        for k, p in zip(positions, params):
            if k >= len(node.inputs) or not _leaf_agrees(node.inputs[k].type, p.type, placed):
                got = node.inputs[k].type if k < len(node.inputs) else "nothing"
                return f"operand {k} is {got}, but the {name} reads {p.type}"
    pred = [u.type for u in node.cond.outputs]
    if len(pred) != 1 or pred[0].shape != () or str(pred[0].dtype) != "bool":
        return f"the condition yields {', '.join(map(str, pred)) or 'nothing'}, not one bool[] scalar"
    carry = node.body.inputs[1].type.leaves
    yielded = [u.type for u in node.body.outputs]
    if len(yielded) != len(carry) or not all(_leaf_agrees(a, b, placed) for a, b in zip(carry, yielded)):
        return "the body does not yield its carry's types"
    out = node.outputs[0].type.leaves if len(node.outputs) == 1 else ()
    if len(out) != len(carry) or not all(_leaf_agrees(a, b, False) for a, b in zip(out, carry)):
        return "a while defines one value, of the carry's types"
    return None


def region_holds_no_delay_or_host_loop(site: Site) -> str | None:
    """Delays carry values between iterations and host loops run from the host: neither sits in a region."""
    for g in site.node.regions:
        for n in walk(g.nodes):
            if isinstance(n, (Delay, HostLoop)):
                return f"a region holds a {n.kind} ({describe(n)}), which runs only at the iteration's top level"
    return None


RUN_RULES = (fragment_is_defined, operands_match_the_arguments, results_match_the_fragment, placed_on_a_mesh,
             replicas_fill_the_group, batch_axes_divide_by_replicas, agent_split_splits_agent_axes,
             host_loop_splits_the_environments,
             env_workers_only_for_host_environments, operands_live_on_the_fragments_group)
"""What a run of a fragment, and a host loop of one, promise about the fragment they run."""

NODE_RULES: dict[str, tuple[Rule, ...]] = {
    "for": COMMON + (for_operands_match_the_body, for_results_are_the_carry_and_the_stacked_outputs,
                     region_holds_no_delay_or_host_loop),
    "while": COMMON + (while_operands_match_the_graphs, region_holds_no_delay_or_host_loop),
    "if": COMMON + (if_branches_take_the_operands_and_yield_the_results, region_holds_no_delay_or_host_loop),
    "run": COMMON + RUN_RULES[:1] + (part_runs_only_in_its_loop,) + RUN_RULES[1:],
    "loop": COMMON + RUN_RULES + (loop_runs_a_host_loop, step_takes_what_the_prefix_makes, step_crosses_to_the_host),
    "glue": COMMON + (operands_match_the_glue_body, glue_defines_one_value_of_its_body_outputs,
                      glue_reads_and_writes_one_group),
    "transfer": COMMON + (transfer_moves_between_two_groups, transfer_source_is_the_operands_group,
                          transfer_destination_is_the_results_group),
    "delay": COMMON + (delay_types_agree,),
}
"""The rules of each node kind, checked in order (a rule may assume the ones before it hold)."""

STEP_RULES: dict[str, tuple[Rule, ...]] = {
    "run": COMMON + (fragment_is_defined, part_of_the_loop, operands_match_the_arguments, results_match_the_fragment),
    "glue": COMMON + (operands_match_the_glue_body, glue_defines_one_value_of_its_body_outputs,
                      step_glue_on_the_loops_group),
    "transfer": COMMON + (step_transfer_crosses_to_the_host, transfer_source_is_the_operands_group,
                          transfer_destination_is_the_results_group),
}
"""The rules of the nodes of a host loop's step: one replica's device work on the loop's group and the host
step, with transfers between the two (what the runtime's host-loop executor runs, as it finds them)."""


# ---------------------------------------------------------------- the module


def returned_leaves_are_defined(site: Site) -> str | None:
    """The return reads defined values."""
    return _first(_undefined(u, site.defined) for u in site.module.graph.outputs)


def returned_state_has_the_input_state_type(site: Site) -> str | None:
    """The loop carries the state: what the iteration returns is what the next one reads."""
    graph = site.module.graph
    state_in = graph.inputs[0].type.leaves
    state_out = [u.type for u in graph.outputs[: graph.out_tree.children()[0].num_leaves]]
    if len(state_in) != len(state_out) or not all(map(same_type, state_in, state_out)):
        return "return: the returned state's types differ from the input state's"
    return None


def stages_close_over_the_graph(site: Site) -> str | None:
    """In every graph the schedule splits into stages (`Schedule.stages`), every run, glue and region on one group
    lies in one stage of consecutive nodes on the stage's group (a host loop in a stage alone), a region spanning
    groups lies between stages with each of its graphs staged alike (one with nothing to stage, a branch that only
    passes its operands through, has none), and a stage's inputs are exactly the leaves it reads from outside and its
    outputs exactly the leaves read after it; only such graphs have stages."""
    module = site.module
    if module.schedule is None or not module.schedule.stages:
        return None
    staged = dict(module.schedule.stages)
    if () not in staged:
        return "the schedule has stages, but none for the iteration"
    for path in staged:
        try:
            graph = graph_at(module.graph, path)
        except (IndexError, AttributeError):
            return f"the schedule has stages for a graph at {list(path)}, which the module lacks"
        if message := _stages_close(module, graph, path, staged):
            return message
    return None


def _stages_close(module: Module, graph: Graph, path: GraphPath, staged: dict) -> str | None:
    where = f"graph at {list(path)}: " if path else ""
    seen: set[int] = set()
    for stage in staged.get(path, ()):
        if list(stage.nodes) != list(range(stage.nodes[0], stage.nodes[-1] + 1)):
            return f"{where}stage @{stage.name}: nodes {list(stage.nodes)} are not consecutive"
        for i in stage.nodes:
            node = graph.nodes[i]
            if isinstance(node, (Transfer, Delay)) or i in seen:
                return f"{where}stage @{stage.name}: node {i} ({describe(node)}) is not a run or glue of this stage alone"
            if module.group_of(node) != stage.group:
                return f"{where}stage @{stage.name} on @{stage.group} holds node {i} ({describe(node)}) of another group"
            if is_host_loop(module, node) and len(stage.nodes) > 1:
                return f"{where}stage @{stage.name}: node {i} ({describe(node)}) is a host loop, which is a stage alone"
            seen.add(i)
        closed = subgraph(graph, stage.name, stage.group, stage.nodes)
        if set(closed.inputs) != set(stage.inputs):
            return f"{where}stage @{stage.name}: inputs are not the leaves it reads from outside"
        if set(closed.outputs) != set(stage.outputs):
            return f"{where}stage @{stage.name}: outputs are not the leaves read after it"
    spanning = {i for i, n in enumerate(graph.nodes)
                if isinstance(n, RegionNode) and not is_host_loop(module, n) and module.group_of(n) is None}
    missing = [i for i, n in enumerate(graph.nodes)
               if not isinstance(n, (Transfer, Delay)) and i not in seen and i not in spanning]
    if missing:
        return f"{where}node {missing[0]} ({describe(graph.nodes[missing[0]])}) lies in no stage"
    for i in sorted(spanning):  # a graph of it with nothing to stage (a branch that only passes its operands
        node = graph.nodes[i]    # through, moving them) has no stages; its nested regions are checked alike
        for k, region in enumerate(node.regions):
            if path + (i, k) not in staged and (message := _stages_close(module, region, path + (i, k), staged)):
                return message
    return None


def schedule_fits_the_graph(site: Site) -> str | None:
    """`fused` needs one stage and nothing between stages; `spmd` needs collective transfers."""
    module, schedule = site.module, site.module.schedule
    if schedule is None or schedule.executor is None:
        return None
    if schedule.executor not in EXECUTORS:
        return f"schedule '{schedule.executor}' is not one of {', '.join(EXECUTORS)}"
    if schedule.iterations_per_dispatch < 1:
        return f"schedule: {schedule.iterations_per_dispatch} iterations per dispatch"
    between = [n for n in walk(module.graph.nodes) if isinstance(n, Delay)
               or (isinstance(n, Transfer) and not crosses_to_the_host(n))]  # a step's own cross to the host
    if schedule.executor == "fused" and (len(module.stages) > 1 or between):
        return (f"schedule fused, but the iteration has {len(module.stages)} stages and {len(between)} transfers "
                "and delays")
    if schedule.executor != "staged" and any(is_host_loop(module, n) for n in module.graph.nodes):
        return f"schedule {schedule.executor}, but a host loop runs only in a staged schedule"
    if schedule.executor != "fused" and module.population:
        return f"schedule {schedule.executor} cannot vectorise a population"
    carriers = {n.carrier for n in between if isinstance(n, Transfer)}
    if schedule.executor == "spmd" and carriers - {"collective"}:
        return "schedule spmd, but some transfers are carried by device_put"
    if schedule.executor == "staged" and "collective" in carriers:
        return "schedule staged, but some transfers are collectives"
    return None


def agent_axes_agree(site: Site) -> str | None:
    """Every agent axis the fragments declare has one length: the environment's agent count."""
    lengths = {}
    for fdef in site.module.fragments.values():
        n = fdef.agent_count()
        if n is not None:
            lengths.setdefault(n, fdef.name)
    if len(lengths) > 1:
        return "agent axes differ in length: " + ", ".join(f"{n} in @{name}" for n, name in sorted(lengths.items()))
    return None


def one_split_per_group(site: Site) -> str | None:
    """The fragments of one device group split the same axes (a value there is sharded one way)."""
    split: dict[str, tuple[str, str]] = {}
    for fdef in site.module.fragments.values():
        p = fdef.placement
        if p is not None and split.setdefault(p.group, (p.split, fdef.name))[0] != p.split:
            return (f"@{p.group} runs @{split[p.group][1]} split={split[p.group][0]} and @{fdef.name} "
                    f"split={p.split}; a group splits one kind of axis")
    return None


MODULE_RULES: tuple[Rule, ...] = (returned_leaves_are_defined, returned_state_has_the_input_state_type,
                                  stages_close_over_the_graph, schedule_fits_the_graph, agent_axes_agree,
                                  one_split_per_group)
"""The rules of the module as a whole, checked after every node's."""
