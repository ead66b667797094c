"""The module of the fragmented dataflow IR: fragment definitions, device groups, the schedule, the module.

A `Module` is rebuilt by passes, never edited in place. Its graph (values, the
closed set of node kinds and the walkers over them) is graph.py's, whose names
this module also offers; what a module adds are the fragments its runs call,
where they are placed, and how the iteration executes (`Schedule`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
from jax.extend import core as jex

from .errors import FragcError, FragmentError
from .graph import (  # noqa: F401  (the graph's names, offered here too)
    HOST, NODE_KINDS, REGION_KINDS, Carry, Delay, For, Glue, Graph, GraphPath, HostLoop, If, Node, RegionNode, Run,
    Stage, Transfer, Use, Value, While, crosses_to_the_host, fragments_run_in, graph_at, leaf_set, map_regions,
    subgraph, walk, walk_counted, walk_graphs,
)
from .printer import format_module
from .types import LeafType, TreeType, leaf_key_paths

REPLICA = "replica"
"""The axis name of fragment replicas; `fragc.pmean`/`psum` reduce over it."""


@dataclasses.dataclass(frozen=True, eq=False)
class Placement:
    """Where and how a fragment runs (set by the `place` pass)."""

    group: str
    replicas: int
    lowering: str  # "shard_map" (replica-parallel) or "jit" (GSPMD shardings)
    env_groups: int = 0
    """For a fragment that steps host environments: 0 runs the host step inside the compiled program;
    G >= 1 runs its time loop from the host (a host loop, src/fragc/runtime/host_loop.py) with each replica's
    environments in G groups, inference of one overlapping the host stepping of another."""
    env_workers: int = 0
    """For a fragment that steps host environments: the workers of each of its pools (EnvPool's threads);
    0 leaves the backend's default."""
    env_fleet: str = ""
    """For a fragment that steps host environments: the remote environment workers they step on (`ray:2x4`,
    `ir.host.EnvFleet`; src/fragc/algos/ray_envs.py), "" for this process's pools."""
    split: str = "env"
    """The declared axes the replicas split: `env` (in_axes/out_axes) or `agent` (agent_axes: each replica a
    share of the agents, whose learners are independent; printed `split=agent`)."""

    def where(self) -> str:
        """The printed placement (`on @actors shard_map replicas=4 host_loop(groups=2) env_workers=2
        env_fleet=ray:2x4`, or `... replicas=3 split=agent`)."""
        split = " split=agent" if self.split == "agent" else ""
        loop = f" host_loop(groups={self.env_groups})" if self.env_groups else ""
        workers = f" env_workers={self.env_workers}" if self.env_workers else ""
        fleet = f" env_fleet={self.env_fleet}" if self.env_fleet else ""
        return f"on @{self.group} {self.lowering} replicas={self.replicas}{split}{loop}{workers}{fleet}"


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

    def agent_count(self) -> int | None:
        """The length of every declared agent axis (`None` if none is declared)."""
        for leaf in self.in_leaf_types + self.out_leaf_types:
            if leaf.agent is not None:
                return leaf.shape[leaf.agent]
        return None

    def body_for(self, replicas: int, agents: bool = False) -> jex.ClosedJaxpr:
        """The body at per-replica shapes, with `REPLICA` of size `replicas` (for a host loop's part: the body
        one of `replicas` environment groups runs, which `lower_host_loops` cut for its own group count). With
        `agents`, the replicas split the agent axes: the body at 1/`replicas` of the agents, `REPLICA` of size 1."""
        if replicas == 1:
            return self.body
        if agents:
            if ("agents", replicas) not in self._bodies:
                self._bodies["agents", replicas] = _trace_per_replica(self, replicas, agents=True)
            return self._bodies["agents", replicas]
        if self.part_of:
            cut = dict(self.group_bodies)
            if replicas not in cut:
                raise FragcError(f"fragment '{self.name}' is a part of @{self.part_of}'s host loop, cut for "
                                 f"{sorted(cut) or [1]} environment groups, not {replicas}")
            return cut[replicas]
        if replicas not in self._bodies:
            self._bodies[replicas] = _trace_per_replica(self, replicas)
        return self._bodies[replicas]


def _trace_per_replica(fdef: FragmentDef, replicas: int, agents: bool = False) -> jex.ClosedJaxpr:
    """Trace `fdef.fn` at the shapes one of `replicas` replicas sees; check its results' shapes.

    A body that takes a batch size from the config instead of its arguments, or axes declared
    on the wrong dimension, trace fine with one replica and fail here: the error says so.
    """
    structs = [local_struct(leaf, replicas, agents) for leaf in fdef.in_leaf_types]
    try:
        body = jax.make_jaxpr(fdef.fn, axis_env=[(REPLICA, 1 if agents else replicas)])(*structs)
    except FragcError:
        raise
    except Exception as err:  # JAX's shape errors come as TypeError, ValueError, IndexError, ...
        text = " ".join(str(err).split()) or type(err).__name__  # JAX's details are on later lines: one line
        text = text if len(text) <= 400 else text[:397] + "..."
        raise FragmentError(_per_replica_message(fdef, replicas, f"its body fails: {text}")) from err
    out_names = [f"result {i}{'.' + p if p else ''}" for i, t in enumerate(fdef.out_types) for p in t.paths]
    for name, leaf, got in zip(out_names, fdef.out_leaf_types, body.out_avals):
        want = local_struct(leaf, replicas, agents)
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


def local_struct(leaf: LeafType, replicas: int, agents: bool = False) -> jax.ShapeDtypeStruct:
    """The shape one replica sees of a (global) leaf (with `agents`: replicas split the agent axis)."""
    shape = list(leaf.shape)
    axis = leaf.agent if agents else leaf.axis
    if axis is not None:
        shape[axis] //= replicas
    return jax.ShapeDtypeStruct(tuple(shape), leaf.dtype, weak_type=leaf.weak_type)


@dataclasses.dataclass(frozen=True, eq=False)
class Mesh:
    """A named device group: a slice of the devices, as indices into `jax.devices()`."""

    name: str
    devices: tuple[int, ...]



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
    hyperparameters: for a population that varies config fields (src/fragc/ir/sweep.py), per
      field each member's value (set by `place`).
    member_loop: a population's members run one after another on each device (each
      bit for bit its single run), not vectorised.
    pbt: population-based training's settings (src/fragc/runtime/pbt.py `PBT`), or None.
    carrier: how transfers move values (one of `CARRIERS`; set by
      `insert_transfers`, from when on every operand lives where it is read).
    schedule: how the iteration executes: its stages (set by `fuse`), the executor and the iterations a
      dispatch (set by `loop`).
    init: `seed -> state`, the function `trace` took the state's type from (`frontend.seeded_init`), which
      `Program.init` jits so that `init` is traced once; not printed (None in a parsed module).
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
    init: Callable[[Any], Any] | None = dataclasses.field(default=None, repr=False)

    def replace(self, **changes: Any) -> "Module":
        return dataclasses.replace(self, **changes)

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The iteration graph's stages (the schedule's at path ())."""
        return self.schedule.stages_of(()) if self.schedule is not None else ()

    def metric_names(self) -> list[str]:
        """The iteration's metric leaves by their dotted paths (`loss`, `episode.return`), in order."""
        tree = self.graph.out_tree.children()[1]
        return [jax.tree_util.keystr(p, simple=True, separator=".") for p in leaf_key_paths(tree)]

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
        return format_module(self)
