"""The graph of the fragmented dataflow IR: values, the node kinds, graphs and the walkers over them.

Nodes and values are immutable (`replace()` derives new ones). Node kinds form a closed set:

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
can name `%state.train.params` while passes reason about single arrays. The
module around a graph (fragment definitions, device groups, schedule) is
module.py's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

from jax.extend import core as jex

from .errors import FragcError
from .types import LeafType, TreeType

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
    """A node whose one region, `body`, takes three values: the loop's constants, its carry, one step's inputs."""

    @property
    def regions(self) -> tuple[Graph, ...]:
        return (self.body,)

    def with_regions(self, regions: tuple[Graph, ...]) -> Any:
        (body,) = regions
        return self.replace(body=body)

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
    unroll: int = 1
    """Trips unrolled in each step of the scan it lowers to (`lax.scan`'s `unroll`: the same numbers; on XLA's
    CPU a convolution's gradient inside a loop body runs about 15x slower than unrolled, jax-ml/jax#12868)."""

    kind = "for"
    region_labels = ("trip",)

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


def crosses_to_the_host(node: Any) -> bool:
    """Whether `node` is a transfer of a host loop's step, to the host or back (not between device groups)."""
    return isinstance(node, Transfer) and HOST in (node.src, node.dst)
