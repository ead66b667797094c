"""The fragmented dataflow graph: fragment definitions, nodes, values, module.

Nodes and values are immutable (`replace()` derives new ones); a `Module` is
rebuilt by passes, never edited in place. Node kinds form a closed set:

- `Run`: one call of a fragment;
- `Glue`: small JAX equations between fragments (a `ClosedJaxpr`);
- `Transfer`: a value moves between device groups;
- `Delay`: the value of an input from the previous iteration (pipelining);
- `For`, `While`, `If`: structured control flow around fragment calls
  (`lax.scan`, `lax.while_loop`, `lax.cond`), each holding graphs (regions);
- `HostLoop`: a fragment whose time loop runs from the host (set by
  `lower_host_loops`): its region holds one time step, with the host step as
  a run on `@host` between transfers.

Edges are leaf-level (`Use(value, index)`), values are pytrees, so printed IR
can name `%state.train.params` while passes reason about single arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
from jax.extend import core as jex

from .errors import FragcError, FragmentError
from .types import LeafType, TreeType

REPLICA = "replica"
"""The axis name of fragment replicas; `fragc.pmean`/`psum` reduce over it."""

HOST = "host"
"""The group of host fragments (a host environment's step in a loop region): the host CPU, not a mesh."""


@dataclasses.dataclass(frozen=True, eq=False)
class Value:
    """An SSA value of the graph: a named pytree of arrays."""

    name: str
    type: TreeType

    def replace(self, **changes: Any) -> "Value":
        return dataclasses.replace(self, **changes)

    def uses(self) -> tuple["Use", ...]:
        return tuple(Use(self, i) for i in range(len(self.type.leaves)))


class Use(NamedTuple):
    """One leaf of a value, as consumed by a node or returned by the graph."""

    value: Value
    index: int

    @property
    def type(self) -> LeafType:
        return self.value.type.leaves[self.index]


@dataclasses.dataclass(frozen=True, eq=False)
class Placement:
    """Where and how a fragment runs (set by the `place` pass)."""

    group: str
    replicas: int
    lowering: str  # "shard_map" (replica-parallel) or "jit" (GSPMD shardings)
    env_groups: int = 0
    """For a fragment that steps host environments: 0 runs the host step inside the compiled program;
    G >= 1 runs its time loop from the host (a host loop, runtime/host_loop.py) with each replica's
    environments in G groups, inference of one overlapping the host stepping of another."""
    env_workers: int = 0
    """For a fragment that steps host environments: the workers of each of its pools (EnvPool's threads);
    0 leaves the backend's default."""

    def where(self) -> str:
        """The printed placement (`on @actors shard_map replicas=4 host_loop(groups=2) env_workers=2`)."""
        loop = f" host_loop(groups={self.env_groups})" if self.env_groups else ""
        workers = f" env_workers={self.env_workers}" if self.env_workers else ""
        return f"on @{self.group} {self.lowering} replicas={self.replicas}{loop}{workers}"


@dataclasses.dataclass(frozen=True, eq=False)
class FragmentDef:
    """A device-free fragment: role, axis declarations, body.

    `in_axes`/`out_axes` are flat, one entry per leaf of the arguments and
    results. `body` is the jaxpr traced at global shapes with one replica;
    `body_for(R)` retraces `fn` at per-replica shapes for `R` replicas.
    """

    name: str
    role: str
    fn: Callable[..., Any]  # flat leaves -> flat leaves
    arg_names: tuple[str, ...]
    in_tree: Any  # treedef of the argument tuple
    out_tree: Any  # treedef of the result tuple
    in_axes: tuple[int | None, ...]
    out_axes: tuple[int | None, ...]
    in_types: tuple[TreeType, ...]  # one per argument, global
    out_types: tuple[TreeType, ...]  # one per result, global
    body: jex.ClosedJaxpr
    source: str
    placement: Placement | None = None
    host_steps: tuple = ()  # `ir.host.HostStep`s: host calls in the body (a host environment's step)
    part_of: str = ""
    """For a part of a host loop's time step (`lower_host_loops`: `rollout.infer`, `rollout.env_step`,
    `rollout.absorb`): the fragment it was cut from. A part's types are one replica's (the region's), its
    `body` is one replica's and `group_bodies` hold what one of G environment groups runs (the part cut from the
    fragment traced for R*G replicas); it runs only in its loop's region."""
    group_bodies: tuple[tuple[int, jex.ClosedJaxpr], ...] = ()
    """A part's bodies for one of G environment groups, per G (data: `body_for(G)` cannot retrace a part)."""
    _bodies: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)
    """`body_for`'s cache of per-replica traces of `fn`: each definition its own (`replace` starts a new one)."""

    def replace(self, **changes: Any) -> "FragmentDef":
        return dataclasses.replace(self, **changes)

    @property
    def in_leaf_types(self) -> tuple[LeafType, ...]:
        return tuple(leaf for t in self.in_types for leaf in t.leaves)

    @property
    def out_leaf_types(self) -> tuple[LeafType, ...]:
        return tuple(leaf for t in self.out_types for leaf in t.leaves)

    def batch_length(self) -> int | None:
        """The common length of every declared input axis (`None` if none is declared)."""
        for leaf in self.in_leaf_types:
            if leaf.axis is not None:
                return leaf.shape[leaf.axis]
        return None

    def body_for(self, replicas: int) -> jex.ClosedJaxpr:
        """The body at per-replica shapes, with `REPLICA` of size `replicas` (for a host loop's part: the body
        one of `replicas` environment groups runs, which `lower_host_loops` cut for its own group count)."""
        if replicas == 1:
            return self.body
        if self.part_of:
            cut = dict(self.group_bodies)
            if replicas not in cut:
                raise FragcError(f"fragment '{self.name}' is a part of @{self.part_of}'s host loop, cut for "
                                 f"{sorted(cut) or [1]} environment groups, not {replicas}")
            return cut[replicas]
        if replicas not in self._bodies:
            self._bodies[replicas] = _trace_per_replica(self, replicas)
        return self._bodies[replicas]


def _trace_per_replica(fdef: FragmentDef, replicas: int) -> jex.ClosedJaxpr:
    """Trace `fdef.fn` at the shapes one of `replicas` replicas sees; check its results' shapes.

    A body that takes a batch size from the config instead of its arguments, or axes declared
    on the wrong dimension, trace fine with one replica and fail here: the error says so.
    """
    structs = [local_struct(leaf, replicas) for leaf in fdef.in_leaf_types]
    try:
        body = jax.make_jaxpr(fdef.fn, axis_env=[(REPLICA, replicas)])(*structs)
    except FragcError:
        raise
    except Exception as err:  # JAX's shape errors come as TypeError, ValueError, IndexError, ...
        text = " ".join(str(err).split()) or type(err).__name__  # JAX's details are on later lines: one line
        text = text if len(text) <= 400 else text[:397] + "..."
        raise FragmentError(_per_replica_message(fdef, replicas, f"its body fails: {text}")) from err
    out_names = [f"result {i}{'.' + p if p else ''}" for i, t in enumerate(fdef.out_types) for p in t.paths]
    for name, leaf, got in zip(out_names, fdef.out_leaf_types, body.out_avals):
        want = local_struct(leaf, replicas)
        if (tuple(got.shape), got.dtype) != (want.shape, want.dtype):
            axis = "replicated (out_axes None)" if leaf.axis is None else f"out_axes {leaf.axis}"
            raise FragmentError(_per_replica_message(
                fdef, replicas, f"it returns {name} as {LeafType.of(got)}, but {leaf} declared {axis} "
                f"makes it {LeafType.of(want)} per replica"))
    return body


def _per_replica_message(fdef: FragmentDef, replicas: int, what: str) -> str:
    declared = [(f"{arg}.{path}" if path else arg, leaf) for arg, t in zip(fdef.arg_names, fdef.in_types)
                for path, leaf in zip(t.paths, t.leaves) if leaf.axis is not None]
    shapes = ", ".join(f"{name} {leaf} -> {LeafType.of(local_struct(leaf, replicas))}" for name, leaf in declared[:4])
    more = f", and {len(declared) - 4} more" if len(declared) > 4 else ""
    shapes = shapes or "it declares none"
    return (f"fragment '{fdef.name}' traced with {replicas} replicas, as a policy on several devices runs it "
            f"(fragc.compile checks 2 under every policy), each seeing 1/{replicas} of every declared axis "
            f"({shapes}{more}): {what}. "
            "Inside a fragment take batch sizes from the arguments' shapes (x.shape[axis]), not from the config, "
            "and check that in_axes/out_axes name each value's environment axis")


def local_struct(leaf: LeafType, replicas: int) -> jax.ShapeDtypeStruct:
    """The shape one replica sees of a (global) leaf."""
    shape = list(leaf.shape)
    if leaf.axis is not None:
        shape[leaf.axis] //= replicas
    return jax.ShapeDtypeStruct(tuple(shape), leaf.dtype)


# ---------------------------------------------------------------- nodes
#
# Every node answers the same questions, as an MLIR operation does: its `operands` (the leaves it reads), its
# `outputs` (the values it defines), its `regions` (the graphs it holds: none for run, glue, transfer and delay)
# and `with_regions` (the node rebuilt around new graphs). `walk` and `map_regions` below are the one walker and
# the one rewriter every pass, the printer, the parser and the verifier use. What a region kind means for the
# dataflow across its boundary (`RegionNode.entries`, `carries`, `exits`, `times`) is said beside the kind, here;
# its verifier rules, printed form and execution beside those of the other kinds, in their tables.


class _Node:
    """What every node kind shares: no regions unless it is a region kind, and `replace`."""

    regions: tuple["Graph", ...] = ()

    def with_regions(self, regions: tuple["Graph", ...]) -> Any:
        """The node around `regions` (a node without regions takes none)."""
        if tuple(regions) != self.regions:
            raise FragcError(f"a {self.kind} node holds no regions")
        return self

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)

    @property
    def operands(self) -> tuple[Use, ...]:
        """Every leaf the node reads."""
        return self.inputs


@dataclasses.dataclass(frozen=True, eq=False)
class Run(_Node):
    """Call fragment `fragment` on `inputs` (flat leaves of its arguments)."""

    fragment: str
    inputs: tuple[Use, ...]
    outputs: tuple[Value, ...]  # one value per fragment result

    kind = "run"


@dataclasses.dataclass(frozen=True, eq=False)
class Glue(_Node):
    """Equations between fragments; one output value holding a tuple of leaves."""

    body: jex.ClosedJaxpr
    inputs: tuple[Use, ...]
    outputs: tuple[Value, ...]  # exactly one

    kind = "glue"


@dataclasses.dataclass(frozen=True, eq=False)
class Transfer(_Node):
    """Move leaves from device group `src` to `dst`; `nbytes` per iteration.

    `carrier` (one of `CARRIERS`, or in a host loop's region `device_get`/`device_put`) says how: set by
    `insert_transfers`."""

    inputs: tuple[Use, ...]
    outputs: tuple[Value, ...]  # exactly one
    src: str
    dst: str
    carrier: str = "device_put"

    kind = "transfer"

    @property
    def nbytes(self) -> int:
        return self.outputs[0].type.nbytes


@dataclasses.dataclass(frozen=True, eq=False)
class Delay(_Node):
    """The previous iteration's value of `inputs`; `initial` in the first iteration.

    The delayed value is loop-carried: the module's state grows by it.
    """

    inputs: tuple[Use, ...]
    initial: tuple[Use, ...]
    outputs: tuple[Value, ...]  # exactly one

    kind = "delay"

    @property
    def operands(self) -> tuple[Use, ...]:
        """Every leaf the node reads: the delayed leaves, then the initial ones."""
        return self.inputs + self.initial


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """`iteration(state) -> (state, metrics)`, or a region: its input values, nodes in order and yielded leaves."""

    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Use, ...]  # flat leaves of (state, metrics); a region's yielded leaves
    out_tree: Any

    def replace(self, **changes: Any) -> "Graph":
        return dataclasses.replace(self, **changes)

    def producers(self) -> dict[Value, int]:
        """The index of the node that defines each value (graph inputs are absent)."""
        return {v: i for i, node in enumerate(self.nodes) for v in node.outputs}

    @property
    def input_leaves(self) -> tuple[Use, ...]:
        """The leaves of the graph's inputs, in order (what a region's entries bind)."""
        return tuple(u for v in self.inputs for u in v.uses())


Carry = tuple[int, int]
"""(region, leaf): the yielded leaf of one of a node's regions that gives a region input its value on later trips."""


class RegionNode(_Node):
    """A node that holds graphs (regions) of its own: `for`, `while`, `if` and a host time `loop`.

    Regions are isolated from above: a region's graph reads only its own inputs. How values cross its boundary
    is the kind's dataflow, which generic passes (place, insert_transfers) read instead of knowing the kind:

    - `entry_positions()`: per region, the positions of the operands (in `inputs`) its input leaves take on
      entry, leaf for leaf (None: the node makes them); `entries()` are those operands;
    - `carries()`: per region, per input leaf, the (region, yielded leaf) that gives it its value on the next
      trip, or None (a loop's carry; a `while`'s condition reads the carry its body yields);
    - `exits()`: per output leaf of the node, the (region, yielded leaf) pairs that may define it;
    - `times(k)`: how often region k runs per run of the node, for costs (an `if`'s branches as if taken, a
      `while` once: its trips are data).
    """

    source: str = "?"
    region_labels: tuple[str, ...] = ()

    def entry_positions(self) -> tuple[tuple[int, ...] | None, ...]:
        raise NotImplementedError

    def entries(self) -> tuple[tuple[Use, ...] | None, ...]:
        return tuple(None if p is None else tuple(self.inputs[i] for i in p) for p in self.entry_positions())

    def carries(self) -> tuple[tuple[Carry | None, ...], ...]:
        return tuple((None,) * len(g.input_leaves) for g in self.regions)

    def exits(self) -> tuple[tuple[Carry, ...], ...]:
        raise NotImplementedError

    def times(self, k: int) -> int:
        return 1

    def control(self) -> tuple[int, ...]:
        """The positions of the operands no region's inputs take (an `if`'s branch index): what the node itself
        reads."""
        bound = {i for p in self.entry_positions() if p is not None for i in p}
        return tuple(i for i in range(len(self.inputs)) if i not in bound)


class _StepBody:
    """A node whose `body` graph takes three values: the loop's constants, its carry, one step's inputs."""

    @property
    def num_consts(self) -> int:
        return len(self.body.inputs[0].type.leaves)

    @property
    def num_carry(self) -> int:
        return len(self.body.inputs[1].type.leaves)

    def carries(self) -> tuple[tuple[Carry | None, ...], ...]:
        nc, nk = self.num_consts, self.num_carry
        rest = len(self.body.input_leaves) - nc - nk
        return ((None,) * nc + tuple((0, j) for j in range(nk)) + (None,) * rest,)


@dataclasses.dataclass(frozen=True, eq=False)
class For(_StepBody, RegionNode):
    """`lax.scan` (or `fori_loop` with a static trip count) around fragment calls: `body` runs `trips` times.

    `inputs` are the loop's constants, the carry's initial leaves and the scanned leaves, in that order; the
    body's inputs are three values (constants, carry, one trip's slice of the scanned leaves) and it yields the
    next carry, then the trip's outputs. `outputs` are two values: the final carry and the trip outputs stacked
    along a new leading axis of length `trips`.
    """

    inputs: tuple[Use, ...]
    outputs: tuple[Value, ...]  # (carry, stacked outputs)
    body: Graph
    trips: int
    reverse: bool = False
    source: str = "?"

    kind = "for"
    region_labels = ("trip",)

    @property
    def regions(self) -> tuple[Graph, ...]:
        return (self.body,)

    def with_regions(self, regions: tuple[Graph, ...]) -> "For":
        (body,) = regions
        return self.replace(body=body)

    def entry_positions(self) -> tuple[tuple[int, ...] | None, ...]:
        return (tuple(range(len(self.inputs))),)  # the scanned leaves enter one trip's slice at a time

    def exits(self) -> tuple[tuple[Carry, ...], ...]:
        return tuple(((0, j),) for j in range(len(self.body.outputs)))  # the carry, then the stacked outputs

    def times(self, k: int) -> int:
        return self.trips


@dataclasses.dataclass(frozen=True, eq=False)
class While(RegionNode):
    """`lax.while_loop` around fragment calls: while `cond` yields true, `body` makes the next carry.

    `inputs` are the condition's constants, the body's constants and the carry's initial leaves, in that order.
    Both graphs take two values, their constants and the carry; `cond` yields one boolean scalar, `body` the next
    carry. `outputs` is one value, the final carry. The trip count is data: the reference interpreter and a
    loop spanning device groups read the condition on the host each trip.
    """

    inputs: tuple[Use, ...]
    outputs: tuple[Value, ...]  # (carry,)
    cond: Graph
    body: Graph
    source: str = "?"

    kind = "while"
    region_labels = ("cond", "body")

    @property
    def regions(self) -> tuple[Graph, ...]:
        return (self.cond, self.body)

    def with_regions(self, regions: tuple[Graph, ...]) -> "While":
        cond, body = regions
        return self.replace(cond=cond, body=body)

    @property
    def num_cond_consts(self) -> int:
        return len(self.cond.inputs[0].type.leaves)

    @property
    def num_body_consts(self) -> int:
        return len(self.body.inputs[0].type.leaves)

    @property
    def num_carry(self) -> int:
        return len(self.body.inputs[1].type.leaves)

    def split(self, leaves: Any) -> tuple[list, list, list]:
        """Operand leaves (or their values) as (the condition's constants, the body's constants, the carry)."""
        a, b = self.num_cond_consts, self.num_cond_consts + self.num_body_consts
        return list(leaves[:a]), list(leaves[a:b]), list(leaves[b:])

    def entry_positions(self) -> tuple[tuple[int, ...] | None, ...]:
        cond_consts, body_consts, carry = self.split(range(len(self.inputs)))
        return tuple(cond_consts + carry), tuple(body_consts + carry)

    def carries(self) -> tuple[tuple[Carry | None, ...], ...]:
        carry = tuple((1, j) for j in range(self.num_carry))
        return (None,) * self.num_cond_consts + carry, (None,) * self.num_body_consts + carry

    def exits(self) -> tuple[tuple[Carry, ...], ...]:
        return tuple(((1, j),) for j in range(self.num_carry))


@dataclasses.dataclass(frozen=True, eq=False)
class If(RegionNode):
    """`lax.cond` / `lax.switch` around fragment calls: branch `inputs[0]` (an int32 index, clamped as
    `lax.switch` clamps it) of `branches` runs on `inputs[1:]`. Each branch's input is one value (the
    operands) and it yields the leaves of the node's one output value. `lax.cond(p, t, f)` is branch 1 (`t`)
    when p is true, branch 0 (`f`) otherwise."""

    inputs: tuple[Use, ...]  # the index, then the operands
    outputs: tuple[Value, ...]  # exactly one
    branches: tuple[Graph, ...]
    source: str = "?"

    kind = "if"

    @property
    def region_labels(self) -> tuple[str, ...]:
        return ("else", "then") if len(self.branches) == 2 else tuple(f"case{k}" for k in range(len(self.branches)))

    @property
    def regions(self) -> tuple[Graph, ...]:
        return self.branches

    def with_regions(self, regions: tuple[Graph, ...]) -> "If":
        return self.replace(branches=tuple(regions))

    def entry_positions(self) -> tuple[tuple[int, ...] | None, ...]:
        return (tuple(range(1, len(self.inputs))),) * len(self.branches)  # the index is the node's

    def exits(self) -> tuple[tuple[Carry, ...], ...]:
        n = len(self.outputs[0].type.leaves)
        return tuple(tuple((k, j) for k in range(len(self.branches))) for j in range(n))


@dataclasses.dataclass(frozen=True, eq=False)
class HostLoop(_StepBody, RegionNode):
    """A run of `fragment` whose time loop runs from the host (a host loop, set by `lower_host_loops`).

    `prefix` (the fragment's inputs -> the time loop's operands and what `suffix` reads) and `suffix` (what
    the prefix kept, the final carry and the stacked per-step outputs -> the fragment's results) run once a
    call, per replica. `body` is one time step, `steps` times, for each of `groups` environment groups in
    turn: its inputs are three values (the loop's constants, the carry, the step's slice of the scanned
    inputs) and it yields the next carry, then the step's outputs. Its nodes are what the runtime runs, as
    passes left them: device work on the fragment's group, the host step as runs on `HOST` between transfers.
    Types in the region are one replica's: a leaf with an `@env` axis is split between the groups along it,
    the others are the same in every group.
    """

    fragment: str
    inputs: tuple[Use, ...]
    outputs: tuple[Value, ...]  # one value per fragment result
    body: Graph
    steps: int
    groups: int = 1
    reverse: bool = False
    prefix: jex.ClosedJaxpr | None = None
    suffix: jex.ClosedJaxpr | None = None

    kind = "loop"
    region_labels = ("step",)

    @property
    def regions(self) -> tuple[Graph, ...]:
        return (self.body,)

    def with_regions(self, regions: tuple[Graph, ...]) -> "HostLoop":
        (body,) = regions
        return self.replace(body=body)

    def entry_positions(self) -> tuple[tuple[int, ...] | None, ...]:
        return (None,)  # the prefix makes the step's inputs from the fragment's

    def exits(self) -> tuple[tuple[Carry, ...], ...]:
        return tuple(() for v in self.outputs for _ in v.type.leaves)  # the suffix makes the results

    def times(self, k: int) -> int:
        return self.steps


Node = Run | Glue | Transfer | Delay | For | While | If | HostLoop
NODE_KINDS = (Run, Glue, Transfer, Delay, For, While, If, HostLoop)
REGION_KINDS = (For, While, If, HostLoop)
"""Nodes that hold graphs of their own: structured control flow around fragment calls, and the host time loop."""

GraphPath = tuple[int, ...]
"""Where a graph lies in a module: () for the iteration, then (node index, region index) pairs down."""


def walk(nodes: tuple, regions: bool = True):
    """Every node of `nodes` and, with `regions`, of the graphs of their regions, depth first."""
    for node in nodes:
        yield node
        if regions:
            for g in node.regions:
                yield from walk(g.nodes)


def walk_graphs(graph: Graph, path: GraphPath = ()):
    """(path, graph) for `graph` and every region graph below it, depth first."""
    yield path, graph
    for i, node in enumerate(graph.nodes):
        for k, g in enumerate(node.regions):
            yield from walk_graphs(g, path + (i, k))


def graph_at(graph: Graph, path: GraphPath) -> Graph:
    """The graph at `path` below `graph`."""
    for i, k in zip(path[::2], path[1::2]):
        graph = graph.nodes[i].regions[k]
    return graph


def map_regions(node: Node, fn: Callable[[Graph], Graph]) -> Node:
    """`node` around `fn` of each of its graphs (a node without regions is returned as it is)."""
    if not node.regions:
        return node
    return node.with_regions(tuple(fn(g) for g in node.regions))


def walk_counted(nodes: tuple, times: int = 1):
    """(node, how often it runs when `nodes` run `times` times) for every node, regions' too, depth first: a
    region's graph `RegionNode.times` more (each branch of an `if` as if taken, an upper bound; a `while`'s
    body once, a lower bound)."""
    for node in nodes:
        yield node, times
        for k, g in enumerate(node.regions):
            yield from walk_counted(g.nodes, times * node.times(k))


def fragments_run_in(nodes: tuple) -> list[str]:
    """The fragments that `nodes` run (a host loop its own and its step's), regions included, in order."""
    names: dict[str, None] = {}
    for n in walk(nodes):
        if isinstance(n, (Run, HostLoop)):
            names[n.fragment] = None
    return list(names)


@dataclasses.dataclass(frozen=True, eq=False)
class Mesh:
    """A named device group: a slice of the devices, as indices into `jax.devices()`."""

    name: str
    devices: tuple[int, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Stage:
    """A subgraph compiled as one program on one device group (set by `fuse`).

    As torch.fx `split_module`'s `Partition`: `nodes` are indices into the
    graph's nodes (consecutive runs and glue of one group), `inputs` the
    leaves it reads from outside, `outputs` the leaves it makes that later
    nodes or the return read. Transfers and delays lie between stages.
    """

    name: str
    group: str
    nodes: tuple[int, ...]
    inputs: tuple[Use, ...]
    outputs: tuple[Use, ...]

    def replace(self, **changes: Any) -> "Stage":
        return dataclasses.replace(self, **changes)


def subgraph(graph: Graph, name: str, group: str, idx: tuple[int, ...]) -> Stage:
    """The stage of nodes `idx`, with the leaves crossing its boundary as inputs and outputs."""
    inside = set(idx)
    made = {v for i in idx for v in graph.nodes[i].outputs}
    inputs = [u for i in idx for u in graph.nodes[i].operands if u.value not in made]
    later = [u for j, node in enumerate(graph.nodes) if j not in inside for u in node.operands]
    outputs = [u for u in later + list(graph.outputs) if u.value in made]
    return Stage(name, group, tuple(idx), leaf_set(inputs), leaf_set(outputs))


def leaf_set(uses: list[Use]) -> tuple[Use, ...]:
    """Each leaf once: values in order of first use, each value's leaves in order (as printed)."""
    by_value: dict[Value, set[int]] = {}
    for u in uses:
        by_value.setdefault(u.value, set()).add(u.index)
    return tuple(Use(v, i) for v, idx in by_value.items() for i in sorted(idx))


def is_host_loop(module: "Module", node: Any) -> bool:
    """Whether `node` runs a fragment's time loop from the host: a host loop node, or before `lower_host_loops`
    a run of a fragment placed as one (each a stage of its own)."""
    if isinstance(node, HostLoop):
        return True
    if not isinstance(node, Run):
        return False
    p = module.fragments[node.fragment].placement
    return p is not None and p.env_groups > 0


EXECUTORS = ("fused", "staged", "spmd")
"""How a program dispatches iterations (`Schedule.executor`):

- `fused`: the iteration is one stage; one XLA program scans k iterations a dispatch;
- `staged`: one program per stage, transfers by `device_put` and delays between
  them, each iteration's programs queued in order, k iterations a dispatch (a
  host loop's stage is its programs driven step by step from the host);
- `spmd`: every stage, transfer (a collective) and delay of the iteration in one
  SPMD program over the union of the device groups, k iterations a dispatch.
"""

CARRIERS = ("device_put", "collective")
"""How a transfer moves its leaves: `device_put` between per-group programs, or a
collective (`ppermute`) inside one program over the union of the groups."""

def crosses_to_the_host(node: Any) -> bool:
    """Whether `node` is a transfer of a host loop's step, to the host or back (not between device groups)."""
    return isinstance(node, Transfer) and HOST in (node.src, node.dst)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the runtime runs the iteration: facts about execution, kept apart from the graph's nodes.

    stages: the compiled subgraphs (set by `fuse`), per graph they split, keyed by the graph's path
      (`GraphPath`: () is the iteration; a region spanning device groups has stages of its own, run from
      the schedule trip by trip or branch by branch; a region on one group has none, it lies inside its
      group's stage).
    executor: one of `EXECUTORS`, and iterations_per_dispatch: k (set by the `loop` pass).
    """

    executor: str | None = None
    iterations_per_dispatch: int = 0
    stages: tuple[tuple[GraphPath, tuple[Stage, ...]], ...] = ()

    def replace(self, **changes: Any) -> "Schedule":
        return dataclasses.replace(self, **changes)

    def stages_of(self, path: GraphPath = ()) -> tuple[Stage, ...]:
        """The stages of the graph at `path` (none: it is not split into stages)."""
        return dict(self.stages).get(tuple(path), ())


@dataclasses.dataclass(frozen=True, eq=False)
class Module:
    """Fragment definitions plus the iteration graph; `str()` prints it.

    label: the pass after which this module was made (`003_place{policy=single}`).
    meshes: the device groups (set by `place`).
    population: seed offsets of independent runs vectorised over a leading axis
      of the state (empty: one run; set by `place`).
    hyperparameters: for a population that varies config fields (ir/sweep.py), per
      field each member's value (set by `place`).
    member_loop: a population's members run one after another on each device (each
      bit for bit its single run), not vectorised.
    pbt: population-based training's settings (runtime/pbt.py `PBT`), or None.
    carrier: how transfers move values (one of `CARRIERS`; set by
      `insert_transfers`, from when on every operand lives where it is read).
    schedule: how the iteration executes: its stages (set by `fuse`), the executor and the iterations a
      dispatch (set by `loop`).
    """

    name: str
    fragments: dict[str, FragmentDef]
    graph: Graph
    label: str = "001_trace"
    meshes: tuple[Mesh, ...] = ()
    population: tuple[int, ...] = ()
    carrier: str | None = None
    hyperparameters: tuple[tuple[str, tuple], ...] = ()
    member_loop: bool = False
    pbt: Any = None
    schedule: Schedule | None = None

    def replace(self, **changes: Any) -> "Module":
        return dataclasses.replace(self, **changes)

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The iteration graph's stages (the schedule's at path ())."""
        return self.schedule.stages_of(()) if self.schedule is not None else ()

    def callable_fragments(self) -> dict[str, FragmentDef]:
        """The fragments a top-level run may call: all but the parts of host loops (`FragmentDef.part_of`),
        which run only inside their loop node's region."""
        return {name: f for name, f in self.fragments.items() if not f.part_of}

    def group_of(self, node: Node) -> str | None:
        """The device group a run, glue or region executes on (`None` before `place`, and for a region whose
        nodes lie on several groups: see `region_groups`)."""
        if isinstance(node, (Run, HostLoop)):
            p = self.fragments[node.fragment].placement
            return p.group if p else None
        if isinstance(node, RegionNode):
            groups = self.region_groups(node)
            return groups[0] if len(groups) == 1 else None
        leaves = node.outputs[0].type.leaves if node.outputs else ()
        return leaves[0].group if leaves else (self.meshes[0].name if self.meshes else None)

    def region_groups(self, node: Node) -> list[str]:
        """The device groups a region's nodes (nested regions' too) run on or move between, in order."""
        groups: dict[str, None] = {}
        for g in node.regions:
            for n in walk(g.nodes):
                if isinstance(n, Transfer):
                    groups.update({n.src: None, n.dst: None})
                elif not isinstance(n, RegionNode) and (where := self.group_of(n)) is not None:
                    groups[where] = None
        return list(groups)

    def __str__(self) -> str:
        from .printer import format_module

        return format_module(self)
