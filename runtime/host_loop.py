"""The host loop: a fragment's time loop run from Python, device inference and host stepping alternating.

`split_time_loop` (ir/time_loop.py) cuts the fragment's body into prefix,
infer, host step, absorb and suffix. Each device part is compiled once, as a
`shard_map` over the fragment's group (so collectives in the prefix and
suffix mean what they mean in the fragment), with every value carried per
replica (a leading axis of length R, split over the group's devices) but the
trajectory, which is written where the fragment's results live
(`TrajectoryLayout`) and handed on by the suffix without a copy.

Per time step, for each environment group g (of G), in turn:

    results_g = finish_g()                     # wait for g's host step t (started earlier)
    finish_g+1 = begin(ops_g+1)                # start the next group's host step (once its actions are
                                               # there: its program was queued one turn earlier)
    carry_g, ys, ops_g, res_g = step(res_g, results_g, ys, t, t + 1, g)
                                               # queue absorb step t and infer step t + 1 for g

Dispatch is asynchronous and a pool with background workers (EnvPool's
threads, Gymnasium's AsyncVectorEnv) steps while Python goes on, so with
G >= 2 group g's inference runs on the devices while group g+1 steps on the
host, and Python's dispatch work happens while the host steps too; the
groups' host steps run one after another, as the same pools stepped in a
plain loop do. With G = 1 inference and stepping alternate. Groups never
exchange data, so every G computes the numbers of the synchronous loop.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fragc.ir.collectives import without_unit_reductions
from fragc.ir.host import start_host_call
from fragc.ir.module import REPLICA, FragmentDef
from fragc.ir.time_loop import TimeLoop

from .executable import Executable
from .lower import spec
from .multihost import place


def _without_unit_reductions(loop: TimeLoop) -> TimeLoop:
    """A one-replica loop's device parts with their reductions over `replica` dropped (the identity there), as
    `lower_fragment` drops a one-replica body's: XLA would keep each as an all-reduce over one device."""
    parts = ("prefix", "infer", "absorb", "suffix")
    return dataclasses.replace(loop, **{p: without_unit_reductions(getattr(loop, p)) for p in parts})


class HostLoop:
    """`leaves -> leaves` of a fragment whose placement runs its time loop from the host: its loop node's
    time loop (`time_loop_of`), the jaxprs the IR holds.

    `executables` are its compiled programs: `{stage}.prefix` and `.suffix` once a call, `.infer` for a
    group's first step, `.step` (absorb a step, infer the next) for the others, `.absorb` for its last.
    """

    def __init__(self, loop: TimeLoop, fdef: FragmentDef, mesh: Mesh, stage: str):
        self.fdef, self.mesh, self.groups = fdef, mesh, fdef.placement.env_groups
        self.loop = loop  # the jaxprs the IR holds
        self.lowered = _without_unit_reductions(loop) if mesh.size == 1 else loop  # the jaxprs that compile
        self.per_replica = NamedSharding(mesh, P(REPLICA))
        replicated = NamedSharding(mesh, P())
        self._local = replicated.is_fully_addressable  # else every process steps the environments of its devices
        self._ys = [TrajectoryLayout.of((self.loop.length,) + tuple(a.shape), a.dtype, axis, self.groups, mesh.size)
                    for a, axis in zip(self.loop.absorb.out_avals[self.loop.num_carry:], self.loop.ys_group_axes)]
        self.executables = self._compile(stage, replicated)
        self._prefix, self._infer, self._step, self._absorb, self._suffix = (e.compiled for e in self.executables)
        self._index = [place(np.int32(i), replicated) for i in range(max(self.loop.length, self.groups))]
        self._slice = jax.jit(_slice, static_argnums=(1, 2, 3), out_shardings=self.per_replica)
        self._concat = jax.jit(_concat, static_argnums=1, out_shardings=self.per_replica)

    def _compile(self, stage: str, replicated: NamedSharding) -> list[Executable]:
        """The five programs, compiled for their inputs: the fragment's leaves (prefix), else per replica."""
        loop, fdef = self.loop, self.fdef
        R, T = self.mesh.size, loop.length
        nc, nk, n_ops = loop.num_consts, loop.num_carry, loop.num_operands
        stacked = lambda shapes: [self._struct((R,) + tuple(a.shape), a.dtype) for a in shapes]  # noqa: E731
        over_time = lambda shapes: [jax.ShapeDtypeStruct((T,) + tuple(a.shape), a.dtype) for a in shapes]  # noqa: E731
        t = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
        consts, carry = stacked(loop.infer.in_avals[:nc]), stacked(loop.infer.in_avals[nc:nc + nk])
        xs = stacked(over_time(loop.infer.in_avals[nc + nk:]))
        residuals, results = stacked(loop.infer.out_avals[n_ops:]), stacked(loop.result_avals)
        ys = [self._struct(y.shape, y.dtype, y.spec) for y in self._ys]
        self._zeros = jax.jit(lambda: [jnp.zeros(y.shape, y.dtype) for y in ys], out_shardings=[y.sharding for y in ys])
        split = all(layout.axis is not None for layout in self._ys)  # else the suffix takes a replica's part
        suffix = self.lowered.suffix
        self._passed_through = _passed_through(suffix, len(suffix.in_avals) - len(ys), len(ys)) if split else None
        self._spare: list[Any] | None = None  # the last call's trajectory buffers, for `_trajectory_buffers`
        prefix = [self._struct(leaf.shape, leaf.dtype, spec(leaf.axis)) for leaf in fdef.in_leaf_types]
        kept_and_carry = stacked(loop.suffix.in_avals[:len(loop.suffix.in_avals) - len(ys)])
        parts = (
            ("prefix", self._prefix_program(), prefix),
            ("infer", self._stacked(self._infer_fn, 3, 1, 2), (consts, carry, xs, t)),
            ("step", self._stacked(self._step_fn, 5, 3, 4, ys_at=4, donate=(4,)),
             (consts, xs, residuals, results, ys, t, t, t)),
            ("absorb", self._stacked(self._absorb_fn, 3, 2, 2, ys_at=2, donate=(2,)), (residuals, results, ys, t, t)),
            ("suffix", self._suffix_program(len(kept_and_carry)), (*kept_and_carry, *ys)),
        )
        return [_compile(f"{stage}.{name}", stage, fdef, program, structs) for name, program, structs in parts]

    def _struct(self, shape: tuple[int, ...], dtype: Any, partition: P = P(REPLICA)) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(self.mesh, partition))

    # ------------------------------------------------------------ the programs, per replica

    def _infer_fn(self, consts: list, carry: list, xs: list, t: jax.Array) -> tuple[list, list]:
        """-> (the host step's operands, residuals) at step t."""
        outs = jex.jaxpr_as_fun(self.lowered.infer)(*consts, *carry, *[x[t] for x in xs])
        return outs[:self.loop.num_operands], outs[self.loop.num_operands:]

    def _absorb_fn(self, residuals: list, results: list, ys: list, t: jax.Array, g: jax.Array) -> tuple[list, list]:
        """-> (carry, the per-step outputs with group g's step t written)."""
        outs = jex.jaxpr_as_fun(self.lowered.absorb)(*residuals, *results)
        nk = self.loop.num_carry
        return outs[:nk], [layout.write(buf, y, t, g) for layout, buf, y in zip(self._ys, ys, outs[nk:])]

    def _step_fn(self, consts: list, xs: list, residuals: list, results: list, ys: list, t: jax.Array,
                 t_next: jax.Array, g: jax.Array) -> tuple[list, list, list, list]:
        """Absorb group g's step t and infer its step t_next in one program: one dispatch a step."""
        carry, ys = self._absorb_fn(residuals, results, ys, t, g)
        ops, residuals = self._infer_fn(consts, carry, xs, t_next)
        return carry, ys, ops, residuals

    def _stacked(self, fn: Any, n_stacked: int, n_scalar: int, n_out: int, ys_at: int | None = None,
                 donate: tuple[int, ...] = ()) -> Any:
        """jit(shard_map(fn)) of `n_stacked + n_scalar` arguments and `n_out` results, every value per replica
        (stacked: a leading axis R over the devices) but the last `n_scalar` arguments (step and group indices,
        the same on every device) and the per-step outputs, argument `ys_at` and result 1, in their own layout
        (`TrajectoryLayout`)."""
        ys_specs = [y.spec for y in self._ys]

        def body(*args: Any) -> Any:
            per_replica = [a if i == ys_at else jax.tree.map(lambda x: x[0], a) for i, a in enumerate(args[:n_stacked])]
            outs = fn(*per_replica, *args[n_stacked:])
            return tuple(o if ys_at is not None and i == 1 else jax.tree.map(lambda x: x[None], o)
                         for i, o in enumerate(outs))

        in_specs = [ys_specs if i == ys_at else P(REPLICA) for i in range(n_stacked)] + [P()] * n_scalar
        out_specs = [ys_specs if ys_at is not None and i == 1 else P(REPLICA) for i in range(n_out)]
        return jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=tuple(in_specs), out_specs=tuple(out_specs),
                                     check_vma=False), donate_argnums=donate)

    def _prefix_program(self) -> Any:
        """The fragment's inputs (in its layout) -> the scan's operands and what the suffix reads, stacked."""
        fn = jex.jaxpr_as_fun(self.lowered.prefix)
        n_out = len(self.loop.prefix.out_avals)
        return jax.jit(jax.shard_map(lambda *xs: tuple(o[None] for o in fn(*xs)), mesh=self.mesh,
                                     in_specs=tuple(spec(a) for a in self.fdef.in_axes),
                                     out_specs=(P(REPLICA),) * n_out, check_vma=False))

    def _suffix_program(self, n_kept: int) -> Any:
        """(what the prefix kept and the final carry, stacked; the per-step outputs in their layout) -> the
        fragment's outputs. The per-step outputs are donated: a trajectory the suffix passes through to the
        fragment's results (in the same layout) is then not copied."""
        fn = jex.jaxpr_as_fun(self.lowered.suffix)
        n_ys = len(self._ys)

        def body(*xs: Any) -> tuple[Any, ...]:
            ys = [y if layout.axis is not None else y[0] for layout, y in zip(self._ys, xs[n_kept:])]
            return tuple(fn(*[x[0] for x in xs[:n_kept]], *ys))

        in_specs = (P(REPLICA),) * n_kept + tuple(y.spec for y in self._ys)
        return jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=in_specs,
                                     out_specs=tuple(spec(a) for a in self.fdef.out_axes), check_vma=False),
                       donate_argnums=tuple(range(n_kept, n_kept + n_ys)))

    # ------------------------------------------------------------ running

    def __call__(self, *leaves: Any) -> list[Any]:
        loop, G = self.loop, self.groups
        nc, nk, nx = loop.num_consts, loop.num_carry, loop.num_xs
        out = self._prefix(*leaves)
        operands, kept = out[:nc + nk + nx], out[nc + nk + nx:]
        parts = [self._group(operands, g) for g in range(G)]  # per group: consts + carry + xs
        consts, carry, xs = [p[:nc] for p in parts], [p[nc:nc + nk] for p in parts], [p[nc + nk:] for p in parts]
        ys = self._trajectory_buffers()  # every group writes its own environments' part of them
        steps = list(range(loop.length - 1, -1, -1) if loop.reverse else range(loop.length))
        pending = [self._infer(consts[g], carry[g], xs[g], self._index[steps[0]]) for g in range(G)]
        started: list[Any] = [None] * G  # each group's host step in flight: a function that waits for its results
        try:
            ys = self._steps(steps, consts, carry, xs, ys, pending, started)
        except BaseException:  # a failure or Ctrl-C: receive every step in flight, so the pools can be used again
            for finish in started:
                if finish is not None:
                    try:
                        finish()
                    except Exception:  # noqa: BLE001 - the first error is the one to report
                        pass
            raise
        final = self._merge(carry, loop.group_axes[nc:nc + nk])
        outs = list(self._suffix(*kept, *final, *ys))
        if self._passed_through is not None:  # the trajectory, handed on in the buffers the loop wrote
            self._spare = [outs[o] for o in self._passed_through]
        return outs

    def _trajectory_buffers(self) -> list[Any]:
        """Buffers for the per-step outputs: the last call's, when nothing but this loop holds them any more
        (every element is written again: each group writes its rows of every step), else new ones.

        New buffers cost more than their zeros: the kernel maps and clears fresh pages for them (Pong's two
        231 MB frame buffers took 110-150 ms a call on 2 CPU cores, while the environments waited). The
        results of the last call are the buffers it wrote (the suffix hands them on without a copy); once the
        learner has dropped them, donating them to the next call's first step reuses their pages."""
        spare, self._spare = self._spare, None
        if spare is not None and all(sys.getrefcount(x) <= _ONLY_HERE for x in spare):
            return spare
        return self._zeros()

    def _steps(self, steps: list[int], consts: list, carry: list, xs: list, ys: list, pending: list,
               started: list) -> list:
        """Every time step of every group (module docstring); `carry` and `started` are updated in place, the
        trajectory is returned."""
        loop, G, index = self.loop, self.groups, self._index
        started[0] = self._begin(pending[0][0])
        for n, t in enumerate(steps):
            for g in range(G):
                residuals = pending[g][1]
                finish, started[g] = started[g], None
                results = [self._to_device(r, a) for r, a in zip(finish(), loop.result_avals)]
                nxt, n_nxt = (g + 1, n) if g + 1 < G else (0, n + 1)
                if G > 1 and n_nxt < len(steps):  # the next group's step, started before this group's dispatch
                    started[nxt] = self._begin(pending[nxt][0])
                if n + 1 < len(steps):  # absorb step t and infer step t + 1
                    carry[g], ys, *pending[g] = self._step(consts[g], xs[g], residuals, results, ys, index[t],
                                                           index[steps[n + 1]], index[g])
                    if G == 1:
                        started[0] = self._begin(pending[0][0])
                else:
                    carry[g], ys = self._absorb(residuals, results, ys, index[t], index[g])
        return ys

    def _begin(self, operands: Sequence[jax.Array]) -> Any:
        """Start a group's host step (waiting for its inference: the operands) -> wait for its results."""
        return start_host_call(self.loop.callback, *[self._to_host(x) for x in operands])

    def _to_host(self, x: jax.Array) -> np.ndarray:
        """This process's replicas of a per-replica value: all of them in one process; across processes
        (Sebulba on several hosts) those of its own devices, whose environments it steps."""
        if self._local:
            return np.asarray(x)
        shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
        return np.concatenate([np.asarray(s.data) for s in shards])

    def _to_device(self, result: Any, aval: Any) -> Any:
        """A host step's result (this process's replicas) as the per-replica value the program takes: numpy
        straight into the compiled program in one process (its C++ path moves it ~10x faster than
        `device_put`), an array assembled from every process's part across processes."""
        local = np.asarray(result, aval.dtype).reshape((-1,) + tuple(aval.shape))
        if self._local:
            return local
        return jax.make_array_from_process_local_data(self.per_replica, local, (self.mesh.size,) + tuple(aval.shape))

    def _group(self, leaves: Sequence[Any], g: int) -> list[Any]:
        """Group g's part of each per-replica leaf (stacked: the group axis is one further)."""
        if self.groups == 1:
            return list(leaves)
        return [x if axis is None else self._slice(x, g, self.groups, axis + 1)
                for x, axis in zip(leaves, self.loop.group_axes)]

    def _merge(self, per_group: list[list[Any]], axes: Sequence[int | None]) -> list[Any]:
        """The carry's per-replica leaves from every group's: concatenated along the group axis (stacked: one
        further)."""
        if self.groups == 1:
            return list(per_group[0])
        return [per_group[0][i] if axis is None else self._concat(tuple(p[i] for p in per_group), axis + 1)
                for i, axis in enumerate(axes)]


_ONLY_HERE = 3
"""`sys.getrefcount` of a buffer that only `_trajectory_buffers` holds: its list, the loop variable, the call."""


def _passed_through(suffix: jex.ClosedJaxpr, n_kept: int, n_ys: int) -> list[int] | None:
    """For each per-step output (the suffix's last `n_ys` inputs), the suffix result that hands it on
    unchanged; None unless every one is handed on (then the results are the buffers the loop wrote)."""
    invars = suffix.jaxpr.invars[n_kept:n_kept + n_ys]
    outvars = list(suffix.jaxpr.outvars)
    found = [next((o for o, v in enumerate(outvars) if v is y), None) for y in invars]
    return None if None in found or len(set(found)) != len(found) else found


def _compile(name: str, stage: str, fdef: FragmentDef, program: Any, structs: Any) -> Executable:
    lowered = program.lower(*structs)
    return Executable(name, (stage,), (fdef.name,), lowered, lowered.compile())


def _slice(x: jax.Array, g: int, groups: int, axis: int) -> jax.Array:
    n = x.shape[axis] // groups
    return jax.lax.slice_in_dim(x, g * n, (g + 1) * n, axis=axis)


def _concat(parts: tuple[jax.Array, ...], axis: int) -> jax.Array:
    return jnp.concatenate(parts, axis=axis)


@dataclasses.dataclass(frozen=True)
class TrajectoryLayout:
    """Where a per-step output of the time loop (a `ys` leaf: the trajectory) lives while the loop writes it.

    A leaf split between environments (its group axis `axis`, in per-replica coordinates, time first) is
    laid out as the fragment lays out its results: the replicas' parts concatenated along that axis, so
    that the suffix can hand it on as a fragment result without a copy (the buffer is donated), and every
    group writes its own rows of it, at step t. A leaf equal in every group (no group axis) is stacked
    (a leading replica axis), and group 0 writes it.
    """

    shape: tuple[int, ...]  # global
    dtype: Any
    spec: P
    axis: int | None  # the group axis, per replica
    rows: int  # of one group along it

    @classmethod
    def of(cls, per_group: tuple[int, ...], dtype: Any, axis: int | None, groups: int,
           replicas: int) -> "TrajectoryLayout":
        """The layout of a leaf of shape `per_group` (time first) per replica and group."""
        if axis is None:
            return cls((replicas,) + per_group, dtype, P(REPLICA), None, 0)
        shape = list(per_group)
        shape[axis] *= groups * replicas
        return cls(tuple(shape), dtype, spec(axis), axis, per_group[axis])

    def write(self, buf: jax.Array, y: jax.Array, t: jax.Array, g: jax.Array) -> jax.Array:
        """`buf` (one replica's block) with group g's output `y` of step t written."""
        if self.axis is None:
            step = jax.lax.dynamic_index_in_dim(buf[0], t, 0, keepdims=False)
            return jax.lax.dynamic_update_index_in_dim(buf[0], jnp.where(g == 0, y, step), t, 0)[None]
        start = [jnp.int32(0)] * buf.ndim
        start[0], start[self.axis] = t, g * self.rows
        return jax.lax.dynamic_update_slice(buf, y[None].astype(buf.dtype), start)
