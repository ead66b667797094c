"""The `fused` schedule: the iteration is one stage; one XLA program loops over k iterations a dispatch.

On the CPU the loop runs n <= k iterations, n given at run time, so one
compilation serves any run length. On a GPU (or TPU) the loop's trip count is
k, fixed when it compiles: XLA runs a loop whose trip count it cannot see by
copying its condition to the host and waiting for it after every iteration,
which costs a latency-bound program (SAC's small gradient steps) several per
cent. A run whose length k does not divide ends with a second program, the
run-time-n loop, compiled when first needed. A population (the
module's seed offsets) vmaps the loop over a leading axis of the state,
sharded over the devices when they divide it; its fragments then run with one
replica and no mesh, so that the iteration can be vmapped.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax.extend import core as jex

from fragc.ir.collectives import without_unit_reductions
from fragc.ir.module import REPLICA, Module

from fragc.ir.errors import FragcError

from . import pbt
from .lower import LoweringInterpreter, leaf_sharding, lower_fragments, population_fragment
from .cpu_lowering import cpu_lowerings
from .stages import whole_iteration


class FusedProgram:
    """A module whose schedule is `fused`, k iterations a dispatch."""

    donates = True

    def __init__(self, module: Module, devices: Sequence[jax.Device]):
        self.module, self.devices = module, devices
        self.k = module.schedule.iterations_per_dispatch
        population = module.population
        if population and module.member_loop:  # the single run's bodies, under `_member_loop`'s replica axis
            frags = {name: _replica_body(f) for name, f in module.callable_fragments().items()}
        elif population:
            frags = {name: population_fragment(f) for name, f in module.callable_fragments().items()}
        else:
            frags = lower_fragments(module, devices)
        self.body = LoweringInterpreter(module, frags)
        self.state_shardings = self._state_shardings()
        self.static_trips = static_trip_count(devices)
        self.executables = [whole_iteration(module, self._lower(static=self.static_trips), self.k)]
        self._remainder: Any = None  # the run-time-n program of a static-trip executor, once a run needs it

    def leaf_sharding(self, leaf: Any) -> Any:
        return leaf_sharding(leaf, self.module, self.devices)

    def __call__(self, state: list[Any], delays: dict | None, n: int, start: int = 0,
                 frame: Any = None) -> tuple[list, dict, list]:
        program = self.executables[0].compiled if n == self.k or not self.static_trips else self._remainder_program()
        if self.module.pbt is not None:  # the step's draws and whether it is due depend on the iteration
            state, metrics = program(state, np.int32(n), np.int32(start))
        else:
            state, metrics = program(state, np.int32(n))
        return state, {}, metrics

    def _remainder_program(self) -> Any:
        """The loop of n < k iterations, n given at run time (a static-trip executor's last dispatch)."""
        if self._remainder is None:
            self._remainder = self._lower(static=False).compile()
        return self._remainder

    def _state_shardings(self) -> list[NamedSharding]:
        leaves = self.module.graph.inputs[0].type.leaves
        if not self.module.population:
            return [self.leaf_sharding(t) for t in leaves]
        return [NamedSharding(self.population_mesh, P("population")) for _ in leaves]

    @property
    def population_mesh(self) -> Mesh:
        """The devices a population's members are spread over: as many of the program's devices as divide
        the member count (all of them when they do), members in equal contiguous blocks."""
        devices = self.devices[:population_devices(len(self.module.population), len(self.devices))]
        if self.module.member_loop:  # and a replica axis of one, as the single run's shard_map has
            return Mesh(np.array(devices).reshape(len(devices), 1), ("population", REPLICA))
        return Mesh(np.array(devices), ("population",))

    def _iteration(self, leaves: list[Any]) -> tuple[list[Any], list[Any]]:
        outs, _ = self.body.iteration(leaves)
        return outs[:len(leaves)], outs[len(leaves):]

    def _lower(self, static: bool) -> Any:
        """The dispatch program: k iterations (`static`), or n <= k with n an argument."""
        k = self.k
        structs = [t.struct() for t in self.module.graph.inputs[0].type.leaves]
        metrics_shape = [u.type.struct() for u in self.module.graph.outputs[len(structs):]]  # the graph's types

        def chunk(leaves: list[Any], n: jax.Array) -> tuple[list[Any], Any]:
            # A loop of n <= k iterations (n known at run time) writing each iteration's metrics into
            # row i of a [k, ...] buffer: no `lax.cond` around the iteration, no stacked scan outputs.
            # Both made XLA's program slower than plain jit of the same iteration when the metrics
            # are large (PureJaxRL's per-step info dict: bench/lowering.py).
            def body(i: jax.Array, carry: tuple[list[Any], list[Any]]) -> tuple[list[Any], list[Any]]:
                leaves, rows = carry
                leaves, metrics = self._iteration(leaves)
                return leaves, [r.at[i].set(m) for r, m in zip(rows, metrics)]

            rows = [jnp.zeros((k,) + s.shape, s.dtype) for s in metrics_shape]
            if k == 1:  # the iteration's program itself, in no loop (on the CPU, a convolution's gradient in a loop
                return body(0, (leaves, rows))  # body runs many times slower: jax-ml/jax#12868)
            return jax.lax.fori_loop(0, k if static else n, body, (leaves, rows))

        if self.module.population and self.module.member_loop:
            chunk = self._member_loop(chunk)
            structs = [jax.ShapeDtypeStruct((len(self.module.population),) + s.shape, s.dtype) for s in structs]
        elif self.module.population:
            chunk = jax.vmap(chunk, in_axes=(0, None), out_axes=(0, 0))  # metrics [seeds, k]
            structs = [jax.ShapeDtypeStruct((len(self.module.population),) + s.shape, s.dtype) for s in structs]
        structs = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh) for s, sh in zip(structs, self.state_shardings)]
        scalar = jax.ShapeDtypeStruct((), jnp.int32)
        with cpu_lowerings():
            if self.module.pbt is not None:
                return jax.jit(self._with_pbt(chunk), donate_argnums=0,
                               out_shardings=(self.state_shardings, None)).lower(structs, scalar, scalar)
            return jax.jit(chunk, donate_argnums=0, out_shardings=(self.state_shardings, None)).lower(structs, scalar)

    def _with_pbt(self, chunk: Any) -> Any:
        """The population's dispatch, then population-based training's step when it is due (src/fragc/runtime/pbt.py),
        as a `cond` in the same program: the state never leaves the devices."""
        module, spec = self.module, self.module.pbt
        fields = sorted(f for f, _ in module.hyperparameters)
        count = len(module.graph.inputs[0].type.leaves)  # SweepState: the algorithm's leaves, hyper's, lineage
        hyper = {f: count - 1 - len(fields) + i for i, f in enumerate(fields)}
        choices = {f: jnp.asarray(sorted(set(v)), jnp.float32) for f, v in module.hyperparameters}
        metric = metric_index(module, spec.metric)

        def dispatch(leaves: list[Any], n: jax.Array, start: jax.Array) -> tuple[list[Any], list[Any]]:
            leaves, rows = chunk(leaves, n)
            scores = pbt.member_scores(rows[metric], n)
            step = lambda ls: pbt.exploit_explore(spec, ls, hyper, count - 1, choices, scores, start + n)  # noqa: E731
            return jax.lax.cond(pbt.due(spec, start, n), step, list, leaves), rows

        return dispatch

    def _member_loop(self, chunk: Any) -> Any:
        """Members one after another on each device (`lax.map` inside a `shard_map` over the member axis):
        each member runs the single run's own program, so it is that run bit for bit. Vectorised members
        (`vmap`) are faster but XLA reduces over a batched axis in another order: last-bit differences."""
        mesh = self.population_mesh

        def local(leaves: list[Any], n: jax.Array) -> tuple[list[Any], list[Any]]:
            return jax.lax.map(lambda member: chunk(member, n), leaves)

        return jax.shard_map(local, mesh=mesh, in_specs=(P("population"), P()), out_specs=P("population"),
                             check_vma=False)


def metric_index(module: Module, name: str) -> int:
    """The position of metric `name` among the iteration's metric leaves; an error listing them if absent."""
    names = module.metric_names()
    if name not in names:
        raise FragcError(f"pbt: the algorithm reports no metric '{name}' to rank members by; it reports "
                         f"{', '.join(names) or 'none'}")
    return names.index(name)


def static_trip_count(devices: Sequence[jax.Device]) -> bool:
    """Whether a dispatch loop on `devices` compiles with its trip count fixed: off the CPU, whose XLA tests a
    loop's condition in place (no cost there, and a run's last, shorter dispatch would need a second compile)."""
    return devices[0].platform != "cpu"


def _replica_body(fdef: Any) -> Any:
    """A fragment's one-replica body as the single run's shard_map runs it (its reductions over the replica axis
    of one dropped, as `lower_fragment` drops them), for `_member_loop`."""
    body = jex.jaxpr_as_fun(without_unit_reductions(fdef.body_for(1)))
    return lambda *xs: tuple(body(*xs))


def population_devices(members: int, devices: int) -> int:
    """The most devices, up to `devices`, that `members` members divide over evenly; fewer than `devices` is said
    in one warning line (5 members on 4 devices run on one)."""
    used = max(d for d in range(1, devices + 1) if members % d == 0)
    if used < devices:
        warnings.warn(f"a population of {members} members runs on {used} of the {devices} devices given: members are "
                      f"spread over devices in equal blocks, and {used} is the most devices {members} divide over",
                      stacklevel=2)
    return used
