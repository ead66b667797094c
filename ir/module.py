"""The fragmented dataflow graph: fragment definitions, nodes, values, module.

Nodes and values are immutable (`replace()` derives new ones); a `Module` is
rebuilt by passes, never edited in place. Node kinds form a closed set:

- `Run`: one call of a fragment;
- `Glue`: small JAX equations between fragments (a `ClosedJaxpr`);
- `Transfer`: a value moves between device groups;
- `Delay`: the value of an input from the previous iteration (pipelining);
- `Loop`: a run whose time loop runs from the host (a host loop, set by
  `lower_host_loops`): a region holds one time step, with the host step as a
  run on `@host` between transfers.

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
    `body` is one replica's and `body_for(G)` one of its G environment groups' (the part cut from the
    fragment traced for R*G replicas); it runs only in its loop's region."""
    _bodies: dict = dataclasses.field(default_factory=dict, repr=False)

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
        if self.part_of and replicas not in self._bodies:
            raise FragcError(f"fragment '{self.name}' is a part of @{self.part_of}'s host loop, cut for "
                             f"{sorted(self._bodies) or [1]} environment groups, not {replicas}")
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


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """Call fragment `fragment` on `inputs` (flat leaves of its arguments)."""

    fragment: str
    inputs: tuple[Use, ...]
    outputs: tuple[Value, ...]  # one value per fragment result

    kind = "run"

    @property
    def operands(self) -> tuple[Use, ...]:
        return self.inputs

    def replace(self, **changes: Any) -> "Run":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, eq=False)
class Glue:
    """Equations between fragments; one output value holding a tuple of leaves."""

    body: jex.ClosedJaxpr
    inputs: tuple[Use, ...]
    outputs: tuple[Value, ...]  # exactly one

    kind = "glue"

    @property
    def operands(self) -> tuple[Use, ...]:
        return self.inputs

    def replace(self, **changes: Any) -> "Glue":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, eq=False)
class Transfer:
    """Move leaves from device group `src` to `dst`; `nbytes` per iteration.

    `carrier` (one of `CARRIERS`) says how: set by `insert_transfers`."""

    inputs: tuple[Use, ...]
    outputs: tuple[Value, ...]  # exactly one
    src: str
    dst: str
    carrier: str = "device_put"

    kind = "transfer"

    @property
    def operands(self) -> tuple[Use, ...]:
        return self.inputs

    @property
    def nbytes(self) -> int:
        return self.outputs[0].type.nbytes

    def replace(self, **changes: Any) -> "Transfer":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, eq=False)
class Delay:
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

    def replace(self, **changes: Any) -> "Delay":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """`iteration(state) -> (state, metrics)` as a list of nodes in order."""

    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Use, ...]  # flat leaves of (state, metrics)
    out_tree: Any

    def replace(self, **changes: Any) -> "Graph":
        return dataclasses.replace(self, **changes)

    def producers(self) -> dict[Value, int]:
        """The index of the node that defines each value (graph inputs are absent)."""
        return {v: i for i, node in enumerate(self.nodes) for v in node.outputs}


class _StepBody:
    """A node whose `body` graph takes three values: the loop's constants, its carry, one step's inputs."""

    @property
    def num_consts(self) -> int:
        return len(self.body.inputs[0].type.leaves)

    @property
    def num_carry(self) -> int:
        return len(self.body.inputs[1].type.leaves)


@dataclasses.dataclass(frozen=True, eq=False)
class Loop(_StepBody, Run):
    """A run of `fragment` whose time loop runs from the host (set by `lower_host_loops`).

    `prefix` (the fragment's inputs -> the time loop's operands and what `suffix` reads) and `suffix` (what
    the prefix kept, the final carry and the stacked per-step outputs -> the fragment's results) run once a
    call, per replica. `body` is one time step, `steps` times, for each of `groups` environment groups in
    turn: its inputs are three values (the loop's constants, the carry, the step's slice of the scanned
    inputs), its outputs the next carry and the step's outputs, and its nodes the parts' runs with the host
    step on `HOST` between two transfers. Types in the region are one replica's: a leaf with an `@env` axis
    is split between the groups along it, the others are the same in every group.
    """

    body: Graph | None = None
    steps: int = 0
    groups: int = 1
    reverse: bool = False
    prefix: jex.ClosedJaxpr | None = None
    suffix: jex.ClosedJaxpr | None = None

    kind = "loop"


class _Region:
    """What `For` and `If` share: operands are the inputs (their graphs read nothing from outside), `replace`,
    and their graphs with each one's stages (empty until `fuse` finds the region spanning groups)."""

    @property
    def operands(self) -> tuple[Use, ...]:
        return self.inputs

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)

    def staged_regions(self) -> tuple[tuple[Graph, tuple["Stage", ...]], ...]:
        """Each graph of the region with its stages."""
        per_graph = (self.stages,) if isinstance(self, For) else (self.stages or ((),) * len(self.branches))
        return tuple(zip(self.regions, per_graph))


@dataclasses.dataclass(frozen=True, eq=False)
class For(_StepBody, _Region):
    """`lax.scan` (or `fori_loop` with a static trip count) around fragment calls: `body` runs `trips` times.

    `inputs` are the loop's constants, the carry's initial leaves and the scanned leaves, in that order; the
    body's inputs are three values (constants, carry, one trip's slice of the scanned leaves) and it yields the
    next carry, then the trip's outputs. `outputs` are two values: the final carry and the trip outputs stacked
    along a new leading axis of length `trips`. `stages` (set by `fuse` when the body's nodes lie on several
    device groups) are the body's stages: the loop then runs from the schedule, trip by trip.
    """

    inputs: tuple[Use, ...]
    outputs: tuple[Value, ...]  # (carry, stacked outputs)
    body: Graph
    trips: int
    reverse: bool = False
    source: str = "?"
    stages: tuple["Stage", ...] = ()

    kind = "for"

    @property
    def regions(self) -> tuple[Graph, ...]:
        return (self.body,)


@dataclasses.dataclass(frozen=True, eq=False)
class If(_Region):
    """`lax.cond` / `lax.switch` around fragment calls: branch `inputs[0]` (an int32 index, clamped as
    `lax.switch` clamps it) of `branches` runs on `inputs[1:]`. Each branch's input is one value (the
    operands) and it yields the leaves of the node's one output value. `lax.cond(p, t, f)` is branch 1 (`t`)
    when p is true, branch 0 (`f`) otherwise. `stages` (set by `fuse` when the branches span device groups)
    are each branch's stages: the branch is then chosen by the schedule."""

    inputs: tuple[Use, ...]  # the index, then the operands
    outputs: tuple[Value, ...]  # exactly one
    branches: tuple[Graph, ...]
    source: str = "?"
    stages: tuple[tuple["Stage", ...], ...] = ()

    kind = "if"

    @property
    def regions(self) -> tuple[Graph, ...]:
        return self.branches


Node = Run | Glue | Transfer | Delay | Loop | For | If
NODE_KINDS = (Run, Glue, Transfer, Delay, Loop, For, If)
REGION_KINDS = (For, If)
"""Structured control flow around fragment calls: nodes that hold graphs of their own."""


def walk(nodes: tuple, regions: bool = True):
    """Every node of `nodes` and, with `regions`, of the graphs of their `For`/`If` regions, depth first."""
    for node in nodes:
        yield node
        if regions and isinstance(node, REGION_KINDS):
            for g in node.regions:
                yield from walk(g.nodes)


def walk_counted(nodes: tuple, times: int = 1):
    """(node, how often it runs when `nodes` run `times` times) for every node, regions' too, depth first: a
    loop's body `trips` times more; each branch of an `if` as if taken (an upper bound)."""
    for node in nodes:
        yield node, times
        if isinstance(node, For):
            yield from walk_counted(node.body.nodes, times * node.trips)
        elif isinstance(node, If):
            for g in node.branches:
                yield from walk_counted(g.nodes, times)


def fragments_run_in(nodes: tuple) -> list[str]:
    """The fragments that `nodes` run, regions (and host loops' steps) included, in order of first run."""
    names: dict[str, None] = {}
    for n in walk(nodes):
        if isinstance(n, Run):
            names[n.fragment] = None
        if isinstance(n, Loop):
            names.update((r.fragment, None) for r in n.body.nodes if isinstance(r, Run))
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
    """Whether `node` runs a fragment whose time loop runs from the host (a stage of its own)."""
    if not isinstance(node, Run):
        return False
    p = module.fragments[node.fragment].placement
    return p is not None and p.env_groups > 0


SHAPES = ("fused", "staged", "spmd")
"""How a program dispatches iterations (`Schedule.shape`):

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


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the runtime runs the iteration (set by the `loop` pass)."""

    shape: str
    iterations_per_dispatch: int


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
    stages: the compiled subgraphs (set by `fuse`).
    schedule: how iterations are dispatched (set by `loop`).
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
    stages: tuple[Stage, ...] = ()
    schedule: Schedule | None = None

    def replace(self, **changes: Any) -> "Module":
        return dataclasses.replace(self, **changes)

    def callable_fragments(self) -> dict[str, FragmentDef]:
        """The fragments a top-level run may call: all but the parts of host loops (`FragmentDef.part_of`),
        which run only inside their loop node's region."""
        return {name: f for name, f in self.fragments.items() if not f.part_of}

    def group_of(self, node: Node) -> str | None:
        """The device group a run, glue or region executes on (`None` before `place`, and for a region whose
        nodes lie on several groups: see `region_groups`)."""
        if isinstance(node, REGION_KINDS):
            groups = self.region_groups(node)
            return groups[0] if len(groups) == 1 else None
        if isinstance(node, Run):
            p = self.fragments[node.fragment].placement
            return p.group if p else None
        leaves = node.outputs[0].type.leaves if node.outputs else ()
        return leaves[0].group if leaves else (self.meshes[0].name if self.meshes else None)

    def region_groups(self, node: Node) -> list[str]:
        """The device groups a region's nodes (nested regions' too) run on or move between, in order."""
        groups: dict[str, None] = {}
        for g in node.regions:
            for n in walk(g.nodes):
                if isinstance(n, Transfer):
                    groups.update({n.src: None, n.dst: None})
                elif not isinstance(n, REGION_KINDS) and (where := self.group_of(n)) is not None:
                    groups[where] = None
        return list(groups)

    def __str__(self) -> str:
        from .printer import format_module

        return format_module(self)
