"""The host loop: a fragment's time loop run from Python, device inference and host stepping alternating.

`split_time_loop` (ir/time_loop.py) cuts the fragment's body into prefix,
infer, host step, absorb and suffix. Each device part is compiled once, as a
`shard_map` over the fragment's group (so collectives in the prefix and
suffix mean what they mean in the fragment), with every value carried per
replica: a leading axis of length R, split over the group's devices.

Per time step and environment group g (of G):

    ops_g, res_g  = infer(consts_g, carry_g, xs_g, t)     # queued on the devices
    results_g     = host(ops_g)                           # waits for ops_g, steps g's pool
    carry_g, ys_g = absorb(res_g, results_g, ys_g, t)     # queued
    ops_g, res_g  = infer(consts_g, carry_g, xs_g, t + 1) # queued before the host steps group g+1

Dispatch is asynchronous, so while the host steps group g+1 the devices run
g's absorb and next inference: with G >= 2 the device work hides behind the
host's. Groups never exchange data, so every G computes the numbers of the
synchronous loop (G = 1).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fragc.ir.module import REPLICA, FragmentDef
from fragc.ir.time_loop import split_time_loop

from .lower import spec
from .executable import Executable


class HostLoop:
    """`leaves -> leaves` of a fragment whose placement runs its time loop from the host.

    `executables` are its four compiled programs (`{stage}.prefix`, `.infer`, `.absorb`, `.suffix`);
    infer and absorb run once per time step and group.
    """

    def __init__(self, fdef: FragmentDef, mesh: Mesh, stage: str):
        p = fdef.placement
        self.fdef, self.mesh, self.groups = fdef, mesh, p.env_groups
        self.loop = loop = split_time_loop(fdef, p.replicas, self.groups)
        R, T = mesh.size, loop.length
        self.per_replica = NamedSharding(mesh, P(REPLICA))
        replicated = NamedSharding(mesh, P())
        stacked = lambda avals: [self._struct((R,) + tuple(a.shape), a.dtype) for a in avals]  # noqa: E731
        nc, nk, nx = loop.num_consts, loop.num_carry, loop.num_xs
        t = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
        infer_in = loop.infer.in_avals
        xs_whole = [(T,) + tuple(a.shape) for a in infer_in[nc + nk:]]
        infer_structs = stacked(infer_in[:nc + nk]) + [self._struct((R,) + s, a.dtype) for s, a in
                                                          zip(xs_whole, infer_in[nc + nk:])] + ([t] if nx else [])
        n_ops = loop.num_operands
        y_avals = loop.absorb.out_avals[nk:]
        self._ys_structs = [self._struct((R, T) + tuple(a.shape), a.dtype) for a in y_avals]
        absorb_structs = (stacked(loop.infer.out_avals[n_ops:]), stacked(loop.result_avals), self._ys_structs, t)
        prefix_structs = [self._struct(leaf.shape, leaf.dtype, spec(leaf.axis)) for leaf in fdef.in_leaf_types]
        suffix_structs = stacked(loop.suffix.in_avals)
        self.executables = [
            _compile(f"{stage}.prefix", stage, fdef, self._program(loop.prefix, [spec(a) for a in fdef.in_axes],
                                                                   stacked_out=True), prefix_structs),
            _compile(f"{stage}.infer", stage, fdef, self._program(loop.infer, None, stacked_out=True,
                                                                  time_index=nx), infer_structs),
            _compile(f"{stage}.absorb", stage, fdef, self._absorb_program(), absorb_structs),
            _compile(f"{stage}.suffix", stage, fdef, self._program(
                loop.suffix, None, out_specs=[spec(a) for a in fdef.out_axes]), suffix_structs),
        ]
        self._prefix, self._infer, self._absorb, self._suffix = (e.compiled for e in self.executables)
        self._index = [jax.device_put(np.int32(i), replicated) for i in range(T)]
        self._zeros = jax.jit(lambda: [jnp.zeros(s.shape, s.dtype) for s in self._ys_structs],
                              out_shardings=[self.per_replica] * len(y_avals))
        self._slice = jax.jit(_slice, static_argnums=(1, 2, 3), out_shardings=self.per_replica)
        self._concat = jax.jit(_concat, static_argnums=1, out_shardings=self.per_replica)

    def _struct(self, shape: tuple[int, ...], dtype: Any, partition: P = P(REPLICA)) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(self.mesh, partition))

    # ------------------------------------------------------------ the programs

    def _program(self, part: jex.ClosedJaxpr, in_specs: list | None, stacked_out: bool = False,
                 out_specs: list | None = None, time_index: int = 0) -> Any:
        """jit(shard_map(part)); inputs per replica (stacked) unless `in_specs` says otherwise.
        `time_index` > 0: the last `time_index` inputs are whole `xs`, indexed at the step given last."""
        fn = jex.jaxpr_as_fun(part)
        n_in = len(part.in_avals)
        stacked_in = in_specs is None

        def body(*xs: Any) -> tuple[Any, ...]:
            if time_index:
                *xs, t = xs
                xs = list(xs[:n_in - time_index]) + [x[:, t] for x in xs[n_in - time_index:]]
            outs = fn(*([x[0] for x in xs] if stacked_in else xs))
            return tuple(o[None] for o in outs) if stacked_out else tuple(outs)

        specs = [P(REPLICA)] * n_in + ([P()] if time_index else []) if stacked_in else in_specs
        outs = [P(REPLICA)] * len(part.out_avals) if stacked_out else out_specs
        return jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=tuple(specs), out_specs=tuple(outs),
                                     check_vma=False))

    def _absorb_program(self) -> Any:
        fn = jex.jaxpr_as_fun(self.loop.absorb)
        nk = self.loop.num_carry

        def body(residuals: list, results: list, ys: list, t: jax.Array) -> tuple[list, list]:
            outs = fn(*[x[0] for x in residuals], *[x[0] for x in results])
            ys = [jax.lax.dynamic_update_slice_in_dim(buf, y[None, None], t, axis=1) for buf, y in zip(ys, outs[nk:])]
            return [c[None] for c in outs[:nk]], ys

        sharded = jax.shard_map(body, mesh=self.mesh, in_specs=(P(REPLICA), P(REPLICA), P(REPLICA), P()),
                                out_specs=P(REPLICA), check_vma=False)
        return jax.jit(sharded, donate_argnums=2)

    # ------------------------------------------------------------ running

    def __call__(self, *leaves: Any) -> list[Any]:
        loop, G, R = self.loop, self.groups, self.mesh.size
        nc, nk, nx, n_ops = loop.num_consts, loop.num_carry, loop.num_xs, loop.num_operands
        out = self._prefix(*leaves)
        operands, kept = out[:nc + nk + nx], out[nc + nk + nx:]
        parts = [self._group(operands, g) for g in range(G)]  # per group: consts + carry + xs
        consts, carry, xs = [p[:nc] for p in parts], [p[nc:nc + nk] for p in parts], [p[nc + nk:] for p in parts]
        ys = [self._zeros() for _ in range(G)]
        steps = list(range(loop.length - 1, -1, -1) if loop.reverse else range(loop.length))

        def infer(g: int, t: int) -> list[Any]:
            return self._infer(*consts[g], *carry[g], *xs[g], *([self._index[t]] if nx else []))

        pending = [infer(g, steps[0]) for g in range(G)]
        for n, t in enumerate(steps):
            for g in range(G):
                ops, residuals = pending[g][:n_ops], list(pending[g][n_ops:])
                results = loop.callback(*[np.asarray(x) for x in ops])  # waits for this group's inference
                results = [jax.device_put(np.asarray(r, a.dtype).reshape((R,) + tuple(a.shape)), self.per_replica)
                           for r, a in zip(results, loop.result_avals)]
                carry[g], ys[g] = self._absorb(residuals, results, ys[g], self._index[t])
                if n + 1 < len(steps):  # queued before the host steps the next group
                    pending[g] = infer(g, steps[n + 1])
        final = self._merge(carry, loop.group_axes[nc:nc + nk])
        return list(self._suffix(*kept, *final, *self._merge(ys, loop.ys_group_axes)))

    def _group(self, leaves: Sequence[Any], g: int) -> list[Any]:
        """Group g's part of each per-replica leaf (stacked: the group axis is one further)."""
        if self.groups == 1:
            return list(leaves)
        return [x if axis is None else self._slice(x, g, self.groups, axis + 1)
                for x, axis in zip(leaves, self.loop.group_axes)]

    def _merge(self, per_group: list[list[Any]], axes: Sequence[int | None]) -> list[Any]:
        """Per-replica leaves from every group's: concatenated along the group axis (stacked: one further)."""
        if self.groups == 1:
            return list(per_group[0])
        return [per_group[0][i] if axis is None else self._concat(tuple(p[i] for p in per_group), axis + 1)
                for i, axis in enumerate(axes)]


def _compile(name: str, stage: str, fdef: FragmentDef, program: Any, structs: Any) -> Executable:
    lowered = program.lower(*structs)
    return Executable(name, (stage,), (fdef.name,), lowered, lowered.compile())


def _slice(x: jax.Array, g: int, groups: int, axis: int) -> jax.Array:
    n = x.shape[axis] // groups
    return jax.lax.slice_in_dim(x, g * n, (g + 1) * n, axis=axis)


def _concat(parts: tuple[jax.Array, ...], axis: int) -> jax.Array:
    return jnp.concatenate(parts, axis=axis)
