"""A staged iteration as one SPMD program over the union of its device groups.

Each device group of the module is one row of a mesh `("group", "replica")`;
the program is one `shard_map` over that mesh, so every device runs it and
values cross groups (and processes) inside it. This is how a policy whose
groups lie on different processes runs: JAX cannot `device_put` between
processes on the CPU backend, but collectives inside one program over the
union mesh work (JAX_NOTES.md, section 5).

Inside the program the module is executed by the same `Interpreter` as
everywhere, with its own `run` and `transfer` steps:

- every leaf is held by every row (replicated over `group`, split over
  `replica` along its batch axis), and only its own group's row is current;
- a fragment of group g runs under `lax.cond` on row g; the other rows take
  the branch that returns zeros, so each device computes only its group's
  fragments;
- a transfer from group s to group d is `lax.ppermute` over `group`: device
  (s, r) sends its block to (d, r), the same split on both sides;
- a delay is loop-carried, as in the reference interpreter;
- after the dispatch's last iteration every state, delay and metric leaf is
  gathered from its group's row, so all rows hold it again.

It needs groups of equal size (a mesh is rectangular) that do not overlap,
fragments lowered with `shard_map`, and glue only on unsplit values; the
`loop` pass checks this when it gives a module with collective transfers the
`spmd` schedule (`fragc.passes.loop.spmd_unsupported`).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fragc.ir.interpreter import Frame, Interpreter
from fragc.ir.module import REPLICA, If, Module, Run, Transfer, While
from fragc.ir.types import LeafType

from .lower import spec
from .cpu_lowering import cpu_lowerings
from .stages import whole_iteration

GROUP = "group"


def union_mesh(module: Module, devices: Sequence[jax.Device]) -> Mesh:
    return Mesh(np.array([[devices[i] for i in m.devices] for m in module.meshes]), (GROUP, REPLICA))


def _spec(leaf: LeafType, extra_leading: int = 0) -> P:
    return spec(None if leaf.axis is None else leaf.axis + extra_leading)


class SpmdProgram(Interpreter):
    """A module whose schedule is `spmd`: k iterations a dispatch as one jitted shard_map over the union mesh."""

    donates = True

    def __init__(self, module: Module, devices: Sequence[jax.Device]):
        super().__init__(module)
        self.k = module.schedule.iterations_per_dispatch
        self.mesh = union_mesh(module, devices)
        self.row = {m.name: i for i, m in enumerate(module.meshes)}
        graph = module.graph
        self.state_types = list(graph.inputs[0].type.leaves)
        self.delay_types = [list(graph.nodes[i].outputs[0].type.leaves) for i in self.delay_nodes]
        n_state = len(self.state_types)
        self.metric_types = [u.type for u in graph.outputs][n_state:]
        self.state_shardings = [self.leaf_sharding(t) for t in self.state_types]
        self.delay_shardings = [[self.leaf_sharding(t) for t in ts] for ts in self.delay_types]
        lowered = self._lower()
        self.executables = [whole_iteration(module, lowered, self.k)]

    def leaf_sharding(self, leaf: LeafType) -> NamedSharding:
        """Where a leaf lives between dispatches: on every row, split over `replica` along its batch axis."""
        return NamedSharding(self.mesh, _spec(leaf))

    def __call__(self, state: list[Any], delays: dict[int, list[Any]], n: int, start: int = 0,
                 frame: Frame | None = None) -> tuple[list, dict, Any]:
        flat = [x for i in self.delay_nodes for x in delays[i]]
        state, flat, metrics = self.executables[0].compiled(state, flat, np.int32(n))
        return state, self._unflatten_delays(flat), metrics

    # ------------------------------------------------------------ the executor's steps inside the program

    def run(self, frame: Frame, i: int, node: Run, leaves: list[Any]) -> list[Any]:
        """Only the fragment's own group's row computes it; the other rows take zeros."""
        fdef = self.module.fragments[node.fragment]
        body = fdef.body_for(fdef.placement.replicas)
        zeros = [jnp.zeros(a.shape, a.dtype) for a in body.out_avals]
        return lax.cond(frame.row == self.row[fdef.placement.group],
                        lambda xs: list(jex.jaxpr_as_fun(body)(*xs)), lambda xs: zeros, leaves)

    def if_branch(self, frame: Frame, i: int, node: If, leaves: list[Any]) -> list[Any]:
        """Every row takes the branch the index's own group computed (its row broadcasts it), so that the
        collectives inside the branch run on every device."""
        index = self._broadcast(frame, leaves[0], node.inputs[0].type.group)
        return super().if_branch(frame, i, node, [index] + list(leaves[1:]))

    def while_loop(self, frame: Frame, i: int, node: While, leaves: list[Any]) -> list[Any]:
        """Every row runs the trips the condition's own group decides (its row broadcasts each decision), so that
        every device takes part in the collectives of every trip."""
        cond_consts, body_consts, carry = node.split(leaves)
        group = node.cond.outputs[0].type.group

        def cond(c: list[Any]) -> Any:
            flag = self.region(frame, node.cond, cond_consts + list(c))[0]
            return self._broadcast(frame, flag.astype(jnp.int32), group) > 0

        return list(lax.while_loop(cond, lambda c: self.region(frame, node.body, body_consts + list(c)), carry))

    def _broadcast(self, frame: Frame, x: Any, group: str | None) -> Any:
        """A scalar as the row of `group` computed it, on every row (a value on no group is the same on all)."""
        if group is None:
            return x
        return lax.psum(jnp.where(frame.row == self.row[group], x, jnp.zeros_like(x)), GROUP)

    def transfer(self, frame: Frame, i: int, node: Transfer, leaves: list[Any]) -> list[Any]:
        """Device (src, r) sends its block to (dst, r)."""
        pairs = [(self.row[node.src], self.row[node.dst])]
        return [lax.ppermute(x, GROUP, pairs) for x in leaves]

    # ------------------------------------------------------------ the program

    def _lower(self) -> Any:
        state_specs = [_spec(t) for t in self.state_types]
        delay_specs = [_spec(t) for ts in self.delay_types for t in ts]
        metric_specs = [_spec(t, 1) for t in self.metric_types]
        program = jax.jit(jax.shard_map(
            self._chunk, mesh=self.mesh, in_specs=(state_specs, delay_specs, P()),
            out_specs=(state_specs, delay_specs, metric_specs), check_vma=False), donate_argnums=(0, 1))
        structs = [jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s)
                   for t, s in zip(self.state_types, self.state_shardings)]
        delay_structs = [jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s)
                         for ts, ss in zip(self.delay_types, self.delay_shardings) for t, s in zip(ts, ss)]
        with cpu_lowerings():
            return program.lower(structs, delay_structs, jax.ShapeDtypeStruct((), jnp.int32))

    def _chunk(self, state: list[Any], flat_delays: list[Any], n: jax.Array) -> tuple[list, list, list]:
        """Up to `k` iterations (those past `n` are skipped), then every leaf back on every row."""
        frame = Frame(row=lax.axis_index(GROUP))
        metric_zeros = [jnp.zeros(self._local(t).shape, t.dtype) for t in self.metric_types]

        def body(carry: tuple, i: jax.Array) -> tuple[tuple, list]:
            def step(carry: tuple) -> tuple[tuple, list]:
                state, delays = carry
                outs, new_delays = self.iteration(state, self._unflatten_delays(delays), frame)
                n_state = len(self.state_types)
                return (outs[:n_state], [x for j in self.delay_nodes for x in new_delays[j]]), outs[n_state:]

            return lax.cond(i < n, step, lambda c: (c, metric_zeros), carry)

        (state, flat_delays), metrics = lax.scan(body, (state, flat_delays), jnp.arange(self.k))
        flat_delay_types = [t for ts in self.delay_types for t in ts]
        return ([_from_row(x, self._row_of(t)) for x, t in zip(state, self.state_types)],
                [_from_row(x, self._row_of(t)) for x, t in zip(flat_delays, flat_delay_types)],
                [_from_row(x, self._row_of(t)) for x, t in zip(metrics, self.metric_types)])

    # ------------------------------------------------------------ helpers

    def _row_of(self, leaf: LeafType) -> int | None:
        return None if leaf.group is None else self.row[leaf.group]

    def _local(self, leaf: LeafType) -> LeafType:
        if leaf.axis is None:
            return leaf
        shape = list(leaf.shape)
        shape[leaf.axis] //= self.mesh.shape[REPLICA]
        return leaf.replace(shape=tuple(shape))

    def _unflatten_delays(self, flat: list[Any]) -> dict[int, list[Any]]:
        out, offset = {}, 0
        for i, ts in zip(self.delay_nodes, self.delay_types):
            out[i] = list(flat[offset : offset + len(ts)])
            offset += len(ts)
        return out


def _from_row(x: jax.Array, row: int | None) -> jax.Array:
    """`x` as row `row` holds it, on every row (unplaced leaves are the same everywhere)."""
    if row is None:
        return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(x)
        return jax.random.wrap_key_data(_from_row(jax.random.key_data(x), row), impl=impl)
    return lax.all_gather(x, GROUP)[row]
