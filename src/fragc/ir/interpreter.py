"""The executor of a module (`Interpreter`, one method per node kind) and the reference interpreter.

The reference interpreter runs each fragment with its replica count as
`vmap(axis_name=REPLICA)` over equal splits of its declared axes, on one
device. Compiled programs are tested against it; they execute the module
through subclasses of the same `Interpreter` (runtime/).

An executor keeps no run state: what one run carries between its steps (the
delay values it reads, buffers it hands back to itself) is a `Frame` passed to
every step, so one executor can run the same module from two threads at once.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex

from .errors import FragcError
from .host import start_host_call
from .module import (
    HOST, REPLICA, Delay, For, FragmentDef, Glue, Graph, HostLoop, If, Module, RegionNode, Run, Stage, Transfer, Use,
    While, is_host_loop, walk_graphs,
)
from .replicas import (check_divides, merge_axis, replica_body, replicated_output_differs, run_replicated, split_axes,
                       split_axis, splits_agents)
from .types import as_arrays

_COMPILED: "weakref.WeakKeyDictionary[FragmentDef, dict[int, Any]]" = weakref.WeakKeyDictionary()


def replica_counts(module: Module, replicas: int | Mapping[str, int]) -> dict[str, int]:
    """Per fragment name, how many replicas it runs with: one count for all, or per role (`"*"`: every role not
    named; without it every role must be named)."""
    if isinstance(replicas, int):
        counts = {name: replicas for name in module.fragments}
    else:
        roles = {f.role for f in module.fragments.values()}
        unknown = set(replicas) - roles - {"*"}
        if unknown:
            raise FragcError(f"replicas names roles {sorted(unknown)} that the module lacks (it has {sorted(roles)})")
        unnamed = roles - set(replicas)
        if unnamed and "*" not in replicas:
            raise FragcError(f"replicas names no count for roles {sorted(unnamed)}: name every role, or give the rest "
                             "one count with '*' (e.g. {'learner': 4, '*': 1})")
        counts = {name: replicas.get(f.role, replicas.get("*")) for name, f in module.fragments.items()}
    for name, r in counts.items():
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            raise FragcError(f"replica count for fragment '{name}' must be a positive int, got {r!r}")
        fdef = module.fragments[name]
        if not fdef.part_of:  # a host loop's parts are one replica's, cut for their loop's count
            check_divides(name, fdef.arg_names, fdef.in_types, r, agents=splits_agents(fdef))
    return counts


def fragment_runner(fdef: FragmentDef, replicas: int) -> Any:
    """A jitted `leaves -> leaves` for `fdef` with `replicas` replicas (cached)."""
    per_def = _COMPILED.setdefault(fdef, {})
    if replicas not in per_def:
        in_axes, out_axes = split_axes(fdef)
        fn = functools.partial(
            run_replicated, jex.jaxpr_as_fun(replica_body(fdef, replicas)), in_axes=in_axes, out_axes=out_axes,
            replicas=replicas, name=fdef.name,
        )
        per_def[replicas] = jax.jit(lambda *leaves: fn(leaves))
    return per_def[replicas]


@dataclasses.dataclass
class Frame:
    """What one run of the iteration carries between its steps, handed to each step (never kept by the executor).

    delayed: what each delay node (by index) yields this iteration; its initial operands where absent.
    spare: buffers a host loop (by node index) hands back to itself from an earlier run, as its executor's contract
      says (src/fragc/runtime/host_loop.py): nothing else reads them any more.
    made: what host loops make this run that an executor hands back as `spare` next time.
    row: inside an SPMD program, the traced index of this device's group row (src/fragc/runtime/spmd.py).
    """

    delayed: Mapping[int, list[Any]] = dataclasses.field(default_factory=dict)
    spare: dict[int, list[Any]] = dataclasses.field(default_factory=dict)
    made: dict[int, list[Any]] = dataclasses.field(default_factory=dict)
    row: Any = None


class Interpreter:
    """One iteration of a module, node by node, with one method per node kind.

    As torch.fx's `Interpreter.run_node`: `run`, `glue`, `transfer`, `delay` and the region kinds' `for_loop`,
    `while_loop`, `if_branch` and `host_loop` each take the run's `Frame`, the node and its operands' leaves and
    return its results' leaves; a `Stage` (a subgraph made by `fuse`) is one more step, by default its nodes
    evaluated in order. The reference interpreter, the compiled stages, the staged runtime and the SPMD program
    are subclasses overriding the steps they execute differently. Values live leaf by leaf, keyed by `Use`.
    """

    def __init__(self, module: Module):
        self.module = module
        schedule = module.schedule
        self.plans: dict[int, list[Stage | int]] = {}  # id(graph) -> its steps: stages and the nodes between them
        self.stage_graph: dict[str, Graph] = {}  # the graph each stage's nodes index
        self.staged: set[int] = set()  # id(graph) of the regions' graphs the schedule runs (they span groups)
        for path, graph in walk_graphs(module.graph):
            stages = schedule.stages_of(path) if schedule is not None else ()
            self.plans[id(graph)] = _plan(graph, stages)
            self.stage_graph.update({s.name: graph for s in stages})
            if schedule is not None and schedule.stages:
                self.staged.update(id(g) for g in _spanning_graphs(module, graph))
        self.delay_nodes = [i for i, n in enumerate(module.graph.nodes) if isinstance(n, Delay)]

    def iteration(self, state: Sequence[Any], delayed: Mapping[int, list[Any]] | None = None,
                  frame: Frame | None = None) -> tuple[list[Any], dict[int, list[Any]]]:
        """One iteration -> (flat outputs, what each delay node yields next iteration).

        delayed[i]: what delay node i yields this iteration (its initial value when absent).
        frame: the run's frame, for an executor that hands itself buffers between iterations (a new one by default).
        """
        graph = self.module.graph
        frame = frame if frame is not None else Frame()
        frame.delayed = delayed or {}
        env = self.graph_env(frame, graph, state)
        next_delays = {i: [env[u] for u in graph.nodes[i].inputs] for i in self.delay_nodes}
        return [env[u] for u in graph.outputs], next_delays

    def graph_env(self, frame: Frame, graph: Graph, leaves: Sequence[Any]) -> dict[Use, Any]:
        """Every leaf a graph defines, from its inputs' leaves: its steps (stages, where `fuse` made some, and the
        nodes between them) in order."""
        env: dict[Use, Any] = dict(zip(graph.input_leaves, leaves))
        for step in self.plans.get(id(graph)) or range(len(graph.nodes)):
            if isinstance(step, Stage):
                env.update(zip(step.outputs, self.stage(frame, step, [env[u] for u in step.inputs])))
            else:
                self.run_node(frame, step, env, graph)
        return env

    def region(self, frame: Frame, graph: Graph, leaves: Sequence[Any]) -> list[Any]:
        """A region's graph (a loop's body, a branch) on its inputs' leaves -> the leaves it yields."""
        env = self.graph_env(frame, graph, leaves)
        return [env[u] for u in graph.outputs]

    def run_node(self, frame: Frame, i: int, env: dict[Use, Any], graph: Graph | None = None) -> None:
        """Node `i` of `graph` (the iteration's by default) on the leaves in `env`; its results into `env`."""
        node = (graph or self.module.graph).nodes[i]
        outs = getattr(self, _METHODS.get(node.kind, node.kind))(frame, i, node, [env[u] for u in node.operands])
        env.update(zip((u for v in node.outputs for u in v.uses()), outs))

    # ---------------------------------------------------------------- one method per step

    def stage(self, frame: Frame, stage: Stage, leaves: list[Any]) -> list[Any]:
        """A subgraph: its nodes in order, from its inputs to its outputs."""
        env: dict[Use, Any] = dict(zip(stage.inputs, leaves))
        graph = self.stage_graph.get(stage.name, self.module.graph)
        for i in stage.nodes:
            self.run_node(frame, i, env, graph)
        return [env[u] for u in stage.outputs]

    def for_loop(self, frame: Frame, i: int, node: For, leaves: list[Any]) -> list[Any]:
        """A `for` region inside a traced program: `lax.scan` over its body."""
        nc, nk = node.num_consts, node.num_carry
        consts, carry, xs = leaves[:nc], leaves[nc:nc + nk], leaves[nc + nk:]

        def trip(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
            outs = self.region(frame, node.body, consts + list(carry) + list(x))
            return outs[:nk], outs[nk:]

        carry, ys = jax.lax.scan(trip, carry, xs, length=node.trips, reverse=node.reverse, unroll=node.unroll)
        return list(carry) + list(ys)

    def while_loop(self, frame: Frame, i: int, node: While, leaves: list[Any]) -> list[Any]:
        """A `while` region inside a traced program: `lax.while_loop` of its condition and body."""
        cond_consts, body_consts, carry = node.split(leaves)
        return list(jax.lax.while_loop(lambda c: self.region(frame, node.cond, cond_consts + list(c))[0],
                                       lambda c: self.region(frame, node.body, body_consts + list(c)), carry))

    def if_branch(self, frame: Frame, i: int, node: If, leaves: list[Any]) -> list[Any]:
        """An `if`/`switch` region inside a traced program: `lax.switch` over its branches."""
        branches = [functools.partial(self.region, frame, g) for g in node.branches]
        return list(jax.lax.switch(leaves[0], branches, list(leaves[1:])))

    def host_loop(self, frame: Frame, i: int, node: HostLoop, leaves: list[Any]) -> list[Any]:
        """A fragment's time loop run from the host (its step region, step by step)."""
        raise NotImplementedError(f"{type(self).__name__} does not run host loops")

    def run(self, frame: Frame, i: int, node: Run, leaves: list[Any]) -> list[Any]:
        return list(self.fragment(self.module.fragments[node.fragment])(*leaves))

    def fragment(self, fdef: FragmentDef) -> Callable[..., Any]:
        """`leaves -> leaves` of one fragment under this interpreter's lowering."""
        raise NotImplementedError

    def glue(self, frame: Frame, i: int, node: Glue, leaves: list[Any]) -> list[Any]:
        return list(jex.jaxpr_as_fun(node.body)(*leaves))

    def transfer(self, frame: Frame, i: int, node: Transfer, leaves: list[Any]) -> list[Any]:
        return leaves

    def delay(self, frame: Frame, i: int, node: Delay, leaves: list[Any]) -> list[Any]:
        """The previous iteration's operands (`delayed`), or the initial ones in the first."""
        return list(frame.delayed[i]) if i in frame.delayed else leaves[len(node.inputs):]


_METHODS = {"for": "for_loop", "while": "while_loop", "if": "if_branch", "loop": "host_loop"}
"""The step method of each region kind (their names are Python keywords)."""


def _spanning_graphs(module: Module, graph: Graph) -> list[Graph]:
    """The graphs of `graph`'s regions that span device groups, which the schedule runs (`fuse` stages each; one with
    nothing to stage, such as a branch that only passes its operands through, has no stages but is run alike)."""
    return [g for n in graph.nodes
            if isinstance(n, RegionNode) and not is_host_loop(module, n) and module.group_of(n) is None
            for g in n.regions]


def _plan(graph: Graph, stages: Sequence[Stage]) -> list[Stage | int]:
    """A graph's steps: its stages, and the indices of the nodes between them, in order."""
    in_stage = {i: s for s in stages for i in s.nodes}
    plan: list[Stage | int] = []
    for i in range(len(graph.nodes)):
        if i not in in_stage:
            plan.append(i)
        elif in_stage[i].nodes[0] == i:
            plan.append(in_stage[i])
    return plan


class ReferenceInterpreter(Interpreter):
    """DESIGN.md's semantics: each fragment as `vmap(axis_name=REPLICA)` over its replicas, on one device;
    regions as Python runs them: a `for` trip by trip, a `while` while its condition holds, an `if` by the
    index's value, a host loop step by step as its step region says."""

    def __init__(self, module: Module, counts: Mapping[str, int]):
        super().__init__(module)
        self.counts = counts

    def fragment(self, fdef: FragmentDef) -> Callable[..., Any]:
        return fragment_runner(fdef, self.counts[fdef.name])

    def for_loop(self, frame: Frame, i: int, node: For, leaves: list[Any]) -> list[Any]:
        nc, nk = node.num_consts, node.num_carry
        consts, carry, xs = leaves[:nc], leaves[nc:nc + nk], leaves[nc + nk:]
        ys: list[list[Any]] = [[] for _ in range(node.trips)]
        for t in (range(node.trips - 1, -1, -1) if node.reverse else range(node.trips)):
            outs = self.region(frame, node.body, consts + carry + [x[t] for x in xs])
            carry, ys[t] = outs[:nk], outs[nk:]
        if not node.trips:
            return carry + [jnp.zeros(t.shape, t.dtype) for t in node.outputs[1].type.leaves]
        return carry + [jnp.stack(column) for column in zip(*ys)]

    def while_loop(self, frame: Frame, i: int, node: While, leaves: list[Any]) -> list[Any]:
        if any(isinstance(x, jax.core.Tracer) for x in leaves):  # traced (a vmapped population): as compiled
            return super().while_loop(frame, i, node, leaves)
        cond_consts, body_consts, carry = node.split(leaves)
        while bool(self.region(frame, node.cond, cond_consts + carry)[0]):
            carry = self.region(frame, node.body, body_consts + carry)
        return carry

    def if_branch(self, frame: Frame, i: int, node: If, leaves: list[Any]) -> list[Any]:
        if isinstance(leaves[0], jax.core.Tracer):  # traced (a vmapped population): as compiled programs run it
            return super().if_branch(frame, i, node, leaves)
        k = min(max(int(leaves[0]), 0), len(node.branches) - 1)  # clamped, as lax.switch
        return self.region(frame, node.branches[k], list(leaves[1:]))

    def host_loop(self, frame: Frame, i: int, node: HostLoop, leaves: list[Any]) -> list[Any]:
        """The loop node as its step region says, synchronously: the prefix, then every step, the region's nodes
        in order (device work as `vmap` over the replicas, every replica's environments in one group, a host step
        called directly with the replicas' operands stacked), then the suffix. Groups never exchange data, so this
        is what every group count computes."""
        fdef, step = self.module.fragments[node.fragment], node.body
        R = self.counts[node.fragment]
        if fdef.placement is None or R != fdef.placement.replicas:  # the step was cut for its placement's count
            return self.run(frame, i, Run(node.fragment, node.inputs, node.outputs), leaves)
        split = [x if a is None else split_axis(x, a, R) for x, a in zip(leaves, fdef.in_axes)]
        outs = _per_replica(node, node.prefix, R, in_axes=fdef.in_axes)(*split)
        nc, nk = node.num_consts, node.num_carry
        nx = len(step.inputs[2].type.leaves)
        consts, carry, xs, kept = outs[:nc], outs[nc:nc + nk], outs[nc + nk:nc + nk + nx], outs[nc + nk + nx:]
        ys: list[list[Any]] = [[] for _ in range(node.steps)]
        for t in (range(node.steps - 1, -1, -1) if node.reverse else range(node.steps)):
            env: dict[Use, Any] = dict(zip(step.input_leaves, consts + carry + [x[:, t] for x in xs]))
            for n in step.nodes:
                ins = [env[u] for u in n.operands]
                env.update(zip((u for v in n.outputs for u in v.uses()), self._step_node(n, ins, R)))
            yielded = [env[u] for u in step.outputs]
            carry, ys[t] = yielded[:nk], yielded[nk:]
        stacked = [jnp.stack(y, axis=1) for y in zip(*ys)]  # per replica, time first
        suffix = _per_replica(node, node.suffix, R, out_axes=fdef.out_axes, name=fdef.name)
        return suffix(*kept, *carry, *stacked)

    def _step_node(self, node: Any, leaves: list[Any], replicas: int) -> list[Any]:
        """A node of a host loop's step on every replica's leaves (stacked: a leading replica axis)."""
        if isinstance(node, Transfer):
            return [np.asarray(x) for x in leaves] if node.dst == HOST else [jnp.asarray(x) for x in leaves]
        if isinstance(node, Glue):
            return _per_replica(node, node.body, replicas)(*leaves)
        fdef = self.module.fragments[node.fragment]
        if fdef.placement is not None and fdef.placement.group == HOST:
            return start_host_call(host_callback(fdef), *leaves)()
        return _per_replica(fdef, fdef.body, replicas)(*leaves)


def host_callback(fdef: FragmentDef) -> Any:
    """The host step a host part (`rollout.env_step`) calls: its body's one host call."""
    return fdef.body.jaxpr.eqns[0].params["callback"]


_PER_REPLICA: "weakref.WeakKeyDictionary[Any, dict[tuple, Any]]" = weakref.WeakKeyDictionary()


def _per_replica(owner: Any, body: Any, replicas: int, in_axes: Sequence[int | None] | None = None,
                 out_axes: Sequence[int | None] | None = None, name: str = "fragment") -> Callable[..., list[Any]]:
    """`body` (one replica's jaxpr, held by `owner`: a loop node, a part or glue) as a jitted `vmap` over
    `replicas` replicas, cached while `owner` lives: inputs stacked (a leading replica axis) unless `in_axes` says
    where each global input was split (`split_axis`); outputs stacked unless `out_axes` says how to merge them
    into global values (as `run_replicated`: a `None` one must be equal on every replica)."""
    in_axes = tuple(in_axes) if in_axes is not None else (0,) * len(body.in_avals)
    key = (id(body), replicas, in_axes)
    per_owner = _PER_REPLICA.setdefault(owner, {})
    if key not in per_owner:
        mapped = jax.vmap(jex.jaxpr_as_fun(body), in_axes=list(in_axes), axis_name=REPLICA, axis_size=replicas)
        per_owner[key] = jax.jit(lambda *xs: list(mapped(*xs)))
    stacked = per_owner[key]
    if out_axes is None:
        return stacked
    return lambda *xs: [_merge_replicas(x, a, name) for x, a in zip(stacked(*xs), out_axes)]


def _merge_replicas(x: jax.Array, axis: int | None, name: str) -> jax.Array:
    """A per-replica stacked result as a global value: concatenated along its declared axis, or (undeclared)
    the one value every replica holds (a NaN equal to a NaN: a diverged metric is not a replica mismatch)."""
    if axis is not None:
        return merge_axis(jnp.moveaxis(x, 0, axis), axis)
    if not bool(jnp.all(same_values(x, x[:1]))):
        raise replicated_output_differs(name)
    return x[0]


def same_values(a: jax.Array, b: jax.Array) -> jax.Array:
    """Elementwise equality in which NaN equals NaN (keys compare by their data)."""
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        a, b = jax.random.key_data(a), jax.random.key_data(b)
    equal = a == b
    if jnp.issubdtype(a.dtype, jnp.inexact):
        equal = equal | (jnp.isnan(a) & jnp.isnan(b))
    return equal


def _check_state(module: Module, state: Any) -> list[Any]:
    leaves, tree = jax.tree.flatten(as_arrays(state))
    expected = module.graph.inputs[0].type
    if tree != expected.treedef or [tuple(x.shape) for x in leaves] != [t.shape for t in expected.leaves]:
        raise FragcError(f"interpret: the state does not have the module's state type {expected}")
    return jax.device_put(leaves, jax.devices()[0])  # the reference runs on one device


def run_iterations(module: Module, state: Any, iterations: int, replicas: int | Mapping[str, int] | None = None
                   ) -> tuple[Any, list[Any]]:
    """`iterations` iterations carrying delay values -> (state, [metrics per iteration]).

    replicas: as for `interpret`; `None` takes each fragment's placed count.
    """
    if replicas is None:
        counts = {n: (f.placement.replicas if f.placement else 1) for n, f in module.fragments.items()}
    else:
        counts = replica_counts(module, replicas)
    leaves, delayed, history = _check_state(module, state), None, []
    n_state = module.graph.out_tree.children()[0].num_leaves
    interpreter = ReferenceInterpreter(module, counts)
    for _ in range(iterations):
        outs, delayed = interpreter.iteration(leaves, delayed)
        leaves = outs[:n_state]
        history.append(jax.tree.unflatten(module.graph.out_tree, outs)[1])
    return jax.tree.unflatten(module.graph.out_tree.children()[0], leaves), history


def interpret(module: Module, state: Any, replicas: int | Mapping[str, int] = 1) -> tuple[Any, Any]:
    """One iteration of `module` from `state` -> `(state, metrics)`.

    replicas: one count for every fragment, or a mapping from role to count (`"*"`: every role not named;
      without it, every role must be named).
    """
    counts = replica_counts(module, replicas)
    leaves = _check_state(module, state)
    if any(isinstance(n, Delay) for n in module.graph.nodes):
        raise FragcError("interpret runs one iteration of a module without delays; use run_iterations for "
                         "a pipelined module")
    outs, _ = ReferenceInterpreter(module, counts).iteration(leaves)
    return jax.tree.unflatten(module.graph.out_tree, outs)
