"""The host loop: a fragment's time loop run from Python, device work and host steps alternating.

A `HostLoop` node (`lower_host_loops`) holds one time step as a region. This executor builds its phases from
that region's nodes as the passes left them (nothing is looked up by name, and no shape is assumed beyond the
verifier's rules): the step's nodes split into alternating *segments*, device work on the loop's group and host
work (transfers to and from `@host` and the host steps between them),

    D0, H1, D1, ..., Hm, Dm        (a device segment may be empty)

Each device segment compiles once, as a `shard_map` over the loop's group with every value carried per replica
(a leading axis R split over the devices), each node under its own body for one of G environment groups. The
last segment of step t and the first of step t + 1 are one program, so a step costs one dispatch per host
segment. The node's `prefix` and `suffix` run once a call; the per-step outputs are written where the
fragment's results live (`TrajectoryLayout`) and handed on by the suffix without a copy.

Per time step and host segment, for each environment group g (of G), in turn:

    results_g = finish_g()                     # wait for g's host work (started earlier)
    finish_g+1 = begin(g + 1)                  # start the next group's host work (its operands were queued a
                                               # turn earlier)
    queue g's device program after the host segment

Dispatch is asynchronous and a pool with background workers (EnvPool's threads, Gymnasium's AsyncVectorEnv)
steps while Python goes on, so with G >= 2 group g's device work runs while group g+1 steps on the host. With
G = 1 device work and host work alternate. Groups never exchange data, so every G computes the numbers of the
synchronous loop (the reference interpreter's).

The executor keeps no run state: a call's trajectory buffers come from the caller, who hands back (`Frame.spare`)
the buffers a previous call made once nothing reads them any more (the staged executor knows from the graph),
and which the call's first write then reuses by donation; otherwise they are new.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fragc.ir.collectives import without_unit_reductions
from fragc.ir.errors import FragcError
from fragc.ir.host import start_host_call
from fragc.ir.interpreter import Frame, host_callback
from fragc.ir.module import HOST, REPLICA, Glue, Graph, HostLoop, Module, Run, Transfer, Use, local_struct

from .executable import Executable
from .lower import spec
from .multihost import place
from .cpu_lowering import cpu_lowerings


@dataclasses.dataclass(frozen=True)
class Segment:
    """Consecutive nodes of a step that run on one side, the device's or the host's.

    reads: the leaves its nodes read that come from outside it (the step's inputs, earlier segments; for the last
      device segment also what the step yields); makes: the leaves it defines that later segments read or the
      step yields.
    """

    on_host: bool
    nodes: tuple[int, ...]
    reads: tuple[Use, ...]
    makes: tuple[Use, ...]


def split_step(module: Module, step: Graph) -> list[Segment]:
    """The step's nodes as alternating device and host segments, device first and last (either may be empty)."""
    sides: list[tuple[bool, list[int]]] = [(False, [])]
    for i, node in enumerate(step.nodes):
        host = isinstance(node, Transfer) or (isinstance(node, Run) and _group(module, node) == HOST)
        if host != sides[-1][0]:
            sides.append((host, []))
        sides[-1][1].append(i)
    if sides[-1][0]:
        sides.append((False, []))
    segments = []
    for k, (host, idx) in enumerate(sides):
        made = {u for i in idx for v in step.nodes[i].outputs for u in v.uses()}
        reads = [u for i in idx for u in step.nodes[i].operands if u not in made]
        later = [u for _, j in sides[k + 1:] for i in j for u in step.nodes[i].operands] + list(step.outputs)
        if k == len(sides) - 1:  # the last device segment writes what the step yields
            reads += [u for u in step.outputs if u not in made]
        segments.append(Segment(host, tuple(idx), _once(reads), _once(u for u in later if u in made)))
    return segments


@dataclasses.dataclass(frozen=True)
class DeviceProgram:
    """One compiled program of a step's device work: its segments (the step's last device segment and, with two,
    the next step's first, run on the carry the first yields), whether it writes the step's outputs into the
    trajectory, and its arguments and results: the leaves it reads from outside (per replica), the time-major
    step inputs it reads (sliced at the step inside) and the leaves it makes that later segments read."""

    name: str
    segments: tuple[Segment, ...]
    writes: bool
    reads: tuple[Use, ...]
    xs: tuple[Use, ...]
    makes: tuple[Use, ...]
    x_positions: tuple[int, ...]  # of `xs` among the step's time-major inputs

    @classmethod
    def of(cls, name: str, segments: Sequence[Segment], writes: bool, carry: Sequence[Use],
           x: Sequence[Use]) -> "DeviceProgram":
        reads: list[Use] = []
        for k, seg in enumerate(segments):
            handed = set(carry) if k else set()  # the next step's carry comes from the step before, inside
            reads += [u for u in seg.reads if u not in x and u not in handed and u not in reads]
        xs = tuple(u for u in x if any(u in seg.reads for seg in segments))
        makes = segments[-1].makes if len(segments) > 1 or not writes else ()
        return cls(name, tuple(segments), writes, tuple(reads), xs, tuple(makes), tuple(x.index(u) for u in xs))


@dataclasses.dataclass(frozen=True)
class HostWork:
    """One node of a host segment, prepared so that a step looks nothing up: what it reads and makes (flat leaves)
    and what it does: `to_host` (a transfer to the host), `to_device` (a transfer back: each leaf's dtype and one
    group's shape) or `call` (a host step: the callback of its body's one host call)."""

    what: str
    reads: tuple[Use, ...]
    makes: tuple[Use, ...]
    callback: Any = None
    leaves: tuple[tuple[Any, tuple[int, ...]], ...] = ()

    @classmethod
    def of(cls, module: Module, node: Any, groups: int) -> "HostWork":
        makes = tuple(u for v in node.outputs for u in v.uses())
        if isinstance(node, Transfer) and node.dst == HOST:
            return cls("to_host", tuple(node.operands), makes)
        if isinstance(node, Transfer):
            return cls("to_device", tuple(node.operands), makes,
                       leaves=tuple((u.type.dtype, _leaf_group_shape(u.type, groups)) for u in makes))
        return cls("call", tuple(node.operands), makes, host_callback(module.fragments[node.fragment]))


def _group(module: Module, node: Run) -> str | None:
    p = module.fragments[node.fragment].placement
    return p.group if p is not None else None


def _once(uses: Any) -> tuple[Use, ...]:
    return tuple(dict.fromkeys(uses))


class HostLoopExecutor:
    """`(frame, leaves) -> leaves` of a host loop node, as its step region says.

    `executables` are its compiled programs: `{stage}.prefix` and `.suffix` once a call, `.first` (a group's
    first step's device work before the host), `.step` (the device work after step t's last host segment and
    before step t + 1's first, one program), `.last` (after the last step's) and, where a step crosses to the host
    more than once, `.between{j}` (between host segments j and j + 1).
    """

    def __init__(self, module: Module, index: int, node: HostLoop, mesh: Mesh, stage: str):
        self.module, self.index, self.node, self.mesh = module, index, node, mesh
        self.fdef = module.fragments[node.fragment]
        self.groups, step = node.groups, node.body
        self.segments = split_step(module, step)
        self.device, self.host = self.segments[0::2], self.segments[1::2]
        nc, nk = node.num_consts, node.num_carry
        inputs = step.input_leaves
        self.consts, self.carry, self.x = inputs[:nc], inputs[nc:nc + nk], inputs[nc + nk:]
        self.group_axes = {u: u.type.axis for u in inputs}  # in per-replica coordinates (the step's types)
        self.per_replica = NamedSharding(mesh, P(REPLICA))
        replicated = NamedSharding(mesh, P())
        self._local = replicated.is_fully_addressable  # else every process steps the environments of its devices
        self._ys = [TrajectoryLayout.of((node.steps,) + tuple(u.type.shape), u.type.dtype, u.type.axis,
                                        self.groups, mesh.size) for u in step.outputs[nk:]]
        self._bodies = {i: self._device_body(n) for i, n in enumerate(step.nodes)
                        if not any(i in s.nodes for s in self.host)}
        self._host_work = [[HostWork.of(module, step.nodes[i], self.groups) for i in seg.nodes] for seg in self.host]
        self.executables = self._compile(stage, replicated)
        self._index = [place(np.int32(i), replicated) for i in range(max(node.steps, self.groups))]
        self._slice = jax.jit(_slice, static_argnums=(1, 2, 3), out_shardings=self.per_replica)
        self._concat = jax.jit(_concat, static_argnums=1, out_shardings=self.per_replica)

    # ------------------------------------------------------------ the bodies, one replica's and one group's

    def _device_body(self, node: Any) -> Callable[..., list[Any]]:
        """A device node of the step as one group of one replica runs it: a part's body for the loop's groups,
        glue traced again at one group's shapes (its leaves' `@env` axes split by G)."""
        G, one = self.groups, self.mesh.size == 1
        if isinstance(node, Glue):
            body = node.body if G == 1 else _glue_for_groups(node, G)
        else:
            body = self.module.fragments[node.fragment].body_for(G)
        return jex.jaxpr_as_fun(without_unit_reductions(body) if one else body)

    def _run(self, segment: Segment, env: dict[Use, Any]) -> None:
        """A device segment's nodes on one replica's values in `env` (inside a program); their results into it."""
        for i in segment.nodes:
            node = self.node.body.nodes[i]
            outs = self._bodies[i](*[env[u] for u in node.operands])
            env.update(zip((u for v in node.outputs for u in v.uses()), outs))

    # ------------------------------------------------------------ the programs

    def _compile(self, stage: str, replicated: NamedSharding) -> list[Executable]:
        """The prefix, the device programs of the step (module docstring) and the suffix, compiled."""
        node, R = self.node, self.mesh.size
        group_struct = lambda u: self._struct((R,) + _group_shape(u, self.groups), u.type.dtype)  # noqa: E731
        over_time = lambda u: self._struct((R, node.steps) + _group_shape(u, self.groups), u.type.dtype)  # noqa: E731
        t = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
        ys = [self._struct(y.shape, y.dtype, y.spec) for y in self._ys]
        self._zeros = jax.jit(lambda: [jnp.zeros(y.shape, y.dtype) for y in ys], out_shardings=[y.sharding for y in ys])
        suffix = self._lowered(node.suffix)
        n_kept = len(suffix.in_avals) - len(ys) - node.num_carry
        split = all(layout.axis is not None for layout in self._ys)  # else the suffix takes a replica's part
        self._passed_through = _passed_through(suffix, n_kept + node.num_carry, len(ys)) if split else None
        prefix = [self._struct(leaf.shape, leaf.dtype, spec(leaf.axis)) for leaf in self.fdef.in_leaf_types]
        kept_and_carry = [self._struct((R,) + tuple(a.shape), a.dtype)
                          for a in node.suffix.in_avals[:len(node.suffix.in_avals) - len(ys)]]
        first, last = self.device[0], self.device[-1]
        plans = [("first", [first], False)] + [(f"between{j}", [seg], False) for j, seg in enumerate(self.device[1:-1], 1)]
        plans += [("step", [last, first], True), ("last", [last], True)]
        self.device_programs = {name: DeviceProgram.of(name, segs, writes, self.carry, self.x)
                                for name, segs, writes in plans}
        programs = [("prefix", self._prefix_program(), prefix)]
        programs += [(name, *self._program(d, group_struct, over_time, t, ys if d.writes else ()))
                     for name, d in self.device_programs.items()]
        programs += [("suffix", self._suffix_program(n_kept + node.num_carry), (*kept_and_carry, *ys))]
        executables = [_compile(f"{stage}.{name}", stage, self.fdef, program, structs)
                       for name, program, structs in programs]
        self._programs = {e.name.rpartition(".")[2]: e.compiled for e in executables}
        return executables

    def _lowered(self, body: jex.ClosedJaxpr) -> jex.ClosedJaxpr:
        """A prefix or suffix as it compiles: on one device without its reductions over `replica` (the identity
        there), as `lower_fragment` drops a one-replica body's (XLA would keep each as an all-reduce)."""
        return without_unit_reductions(body) if self.mesh.size == 1 else body

    def _program(self, d: DeviceProgram, group_struct: Any, over_time: Any, t: Any, ys: Sequence[Any]
                 ) -> tuple[Any, tuple]:
        """`d`'s program and the shapes it compiles for. Arguments: what it reads from outside, the time-major
        step inputs it reads, the trajectory (where it writes it), then the step, the next step and the group
        indices. Results: where it writes, the carry and the trajectory; then what it makes for later segments."""
        nk, step, layouts = self.node.num_carry, self.node.body, self._ys

        def body(read: list, x: list, trajectory: list, t: Any, t_next: Any, g: Any) -> tuple:
            env = dict(zip(d.reads, read))
            env.update((u, v[t]) for u, v in zip(d.xs, x))
            self._run(d.segments[0], env)
            out: tuple = ()
            if d.writes:
                yielded = [env[u] for u in step.outputs]
                trajectory = [layout.write(buf, y, t, g) for layout, buf, y in zip(layouts, trajectory, yielded[nk:])]
                out = (yielded[:nk], trajectory)
                if len(d.segments) > 1:  # the next step's first segment, on the carry just made
                    env = dict(zip(d.reads, read))
                    env.update(zip(self.carry, yielded[:nk]))
                    env.update((u, v[t_next]) for u, v in zip(d.xs, x))
                    self._run(d.segments[1], env)
            return out + ([env[u] for u in d.makes],)

        structs = ([group_struct(u) for u in d.reads], [over_time(u) for u in d.xs], list(ys), t, t, t)
        return self._stacked(body, ys_at=2 if d.writes else None, n_out=3 if d.writes else 1), structs

    def _struct(self, shape: tuple[int, ...], dtype: Any, partition: P = P(REPLICA)) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(self.mesh, partition))

    def _stacked(self, fn: Any, ys_at: int | None, n_out: int) -> Any:
        """jit(shard_map(fn)) of (read, x, trajectory, t, t_next, g): every value per replica (stacked: a leading
        axis R over the devices) but the trajectory (argument `ys_at`, result 1) in its own layout
        (`TrajectoryLayout`), donated, and the indices (the same on every device)."""
        ys_specs = [y.spec for y in self._ys]

        def body(*args: Any) -> Any:
            per_replica = [a if i == ys_at else jax.tree.map(lambda x: x[0], a) for i, a in enumerate(args[:3])]
            outs = fn(*per_replica, *args[3:])
            return tuple(o if ys_at is not None and i == 1 else jax.tree.map(lambda x: x[None], o)
                         for i, o in enumerate(outs))

        in_specs = [ys_specs if i == ys_at else P(REPLICA) for i in range(3)] + [P()] * 3
        out_specs = [ys_specs if ys_at is not None and i == 1 else P(REPLICA) for i in range(n_out)]
        return jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=tuple(in_specs), out_specs=tuple(out_specs),
                                     check_vma=False), donate_argnums=(2,) if ys_at is not None else ())

    def _prefix_program(self) -> Any:
        """The fragment's inputs (in its layout) -> the step's constants, carry and time-major inputs, and what the
        suffix reads, stacked."""
        fn = jex.jaxpr_as_fun(self._lowered(self.node.prefix))
        n_out = len(self.node.prefix.out_avals)
        return jax.jit(jax.shard_map(lambda *xs: tuple(o[None] for o in fn(*xs)), mesh=self.mesh,
                                     in_specs=tuple(spec(a) for a in self.fdef.in_axes),
                                     out_specs=(P(REPLICA),) * n_out, check_vma=False))

    def _suffix_program(self, n_kept: int) -> Any:
        """(what the prefix kept and the final carry, stacked; the per-step outputs in their layout) -> the
        fragment's outputs. The per-step outputs are donated: a trajectory the suffix passes through to the
        fragment's results (in the same layout) is then not copied."""
        fn = jex.jaxpr_as_fun(self._lowered(self.node.suffix))
        n_ys = len(self._ys)

        read_only = [k for k, o in enumerate(self._passed_through or ()) if o is None]

        def body(*xs: Any) -> tuple[Any, ...]:
            ys = [y if layout.axis is not None else y[0] for layout, y in zip(self._ys, xs[n_kept:])]
            return tuple(fn(*[x[0] for x in xs[:n_kept]], *ys)) + tuple(ys[k] for k in read_only)

        in_specs = (P(REPLICA),) * n_kept + tuple(y.spec for y in self._ys)
        out_specs = tuple(spec(a) for a in self.fdef.out_axes) + tuple(self._ys[k].spec for k in read_only)
        return jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False),
                       donate_argnums=tuple(range(n_kept, n_kept + n_ys)))

    # ------------------------------------------------------------ running

    def __call__(self, frame: Frame, *leaves: Any) -> list[Any]:
        node, G = self.node, self.groups
        nc, nk, nx = node.num_consts, node.num_carry, len(self.x)
        out = self._programs["prefix"](*leaves)
        operands, kept = out[:nc + nk + nx], out[nc + nk + nx:]
        envs = [dict(zip(self.consts + self.carry, self._group(operands[:nc + nk], g, self.consts + self.carry)))
                for g in range(G)]  # per group: its constants and carry, then what its segments make
        xs = [self._group(operands[nc + nk:], g, self.x, time=True) for g in range(G)]
        ys = self._trajectory_buffers(frame)  # every group writes its own environments' part of them
        steps = list(range(node.steps - 1, -1, -1) if node.reverse else range(node.steps))
        for g in range(G):
            self._dispatch(envs[g], xs[g], "first", None, steps[0], steps[0], g)
        started: list[Any] = [None] * G  # each group's host work in flight: a function that waits for it
        try:
            ys = self._turns(steps, envs, xs, ys, started)
        except BaseException:  # a failure or Ctrl-C: receive every host step in flight, so the pools can be used again
            for finish in started:
                if finish is not None:
                    try:
                        finish()
                    except Exception:  # noqa: BLE001 - the first error is the one to report
                        pass
            raise
        final = self._merge([[env[u] for u in self.carry] for env in envs], [self.group_axes[u] for u in self.carry])
        outs = list(self._programs["suffix"](*kept, *final, *ys))
        outs, read_only = outs[:len(self.fdef.out_axes)], iter(outs[len(self.fdef.out_axes):])
        if self._passed_through is not None:  # the trajectory's buffers: handed on as results, or read by the suffix
            # and returned as they were (aliased, not copied), for the next call to write into again
            frame.made[self.index] = [outs[o] if o is not None else next(read_only) for o in self._passed_through]
        return outs

    def _trajectory_buffers(self, frame: Frame) -> list[Any]:
        """Buffers for the per-step outputs: those the caller hands back (`Frame.spare`: the trajectory of an
        earlier call, which nothing reads any more; every element is written again, each group its rows of every
        step), else new ones.

        New buffers cost more than their zeros: the kernel maps and clears fresh pages for them (Pong's two 231 MB
        frame buffers took 110-150 ms a call on 2 CPU cores, while the environments waited). Donating the handed
        back buffers to the call's first write reuses their pages."""
        spare = frame.spare.pop(self.index, None)
        if spare is not None and [(x.shape, x.dtype) for x in spare] == [(y.shape, y.dtype) for y in self._ys]:
            return list(spare)
        return self._zeros()

    def _turns(self, steps: list[int], envs: list[dict], xs: list[list], ys: list, started: list) -> list:
        """Every host segment of every step of every group, each followed by the device program after it (module
        docstring); `envs` and `started` are updated in place, the trajectory is returned."""
        G, m = self.groups, len(self.host)
        turns = [(n, j) for n in range(len(steps)) for j in range(m)]
        started[0] = self._begin(envs[0], 0)
        for k, (n, j) in enumerate(turns):
            for g in range(G):
                finish, started[g] = started[g], None
                envs[g].update(finish())
                nxt, k_nxt = (g + 1, k) if g + 1 < G else (0, k + 1)
                if G > 1 and k_nxt < len(turns):  # the next group's host work, started before this group's dispatch
                    started[nxt] = self._begin(envs[nxt], turns[k_nxt][1])
                t = steps[n]
                if j + 1 < m:
                    self._dispatch(envs[g], xs[g], f"between{j + 1}", None, t, t, g)
                elif n + 1 < len(steps):  # step t's last device work and step t + 1's first
                    ys = self._dispatch(envs[g], xs[g], "step", ys, t, steps[n + 1], g)
                else:
                    ys = self._dispatch(envs[g], xs[g], "last", ys, t, t, g)
                if G == 1 and k + 1 < len(turns):
                    started[0] = self._begin(envs[0], turns[k + 1][1])
        return ys

    def _dispatch(self, env: dict, xs: list, name: str, ys: Any, t: int, t_next: int, g: int) -> Any:
        """Queue device program `name` on a group's values; its results into the group's `env`; the trajectory it
        wrote, where it writes one."""
        d, index = self.device_programs[name], self._index
        x = [xs[k] for k in d.x_positions]
        outs = self._programs[name]([env[u] for u in d.reads], x, ys if d.writes else [], index[t], index[t_next],
                                    index[g])
        if d.writes:
            env.update(zip(self.carry, outs[0]))
            ys = outs[1]
        env.update(zip(d.makes, outs[-1]))
        return ys

    def _begin(self, env: dict[Use, Any], j: int) -> Callable[[], dict[Use, Any]]:
        """Start a group's host segment j (its transfers to the host wait for the device values they move) -> a
        function that waits for it and returns what it makes: the values moved back, as numpy for the program,
        and host values later host segments read."""
        work, segment = self._host_work[j], self.host[j]
        host: dict[Use, Any] = {}
        k = 0
        while k < len(work) and work[k].what != "call":  # the transfers before the first host step
            self._host_node(work[k], env, host)
            k += 1
        if k == len(work):
            return lambda: {u: host[u] for u in segment.makes if u in host}
        call = work[k]
        finish = start_host_call(call.callback, *[host[u] if u in host else env[u] for u in call.reads])

        def done() -> dict[Use, Any]:
            host.update(zip(call.makes, finish()))
            for w in work[k + 1:]:
                self._host_node(w, env, host)
            return {u: host[u] for u in segment.makes if u in host}

        return done

    def _host_node(self, work: HostWork, env: dict[Use, Any], host: dict[Use, Any]) -> None:
        """A host segment's node after its first host step, or a transfer before it."""
        ins = [host[u] if u in host else env[u] for u in work.reads]
        if work.what == "to_host":
            outs = [self._to_host(x) for x in ins]
        elif work.what == "to_device":
            outs = [self._to_device(x, dtype, shape) for x, (dtype, shape) in zip(ins, work.leaves)]
        else:
            outs = start_host_call(work.callback, *ins)()
        host.update(zip(work.makes, outs))

    def _to_host(self, x: Any) -> np.ndarray:
        """This process's replicas of a per-replica value: all of them in one process; across processes
        (Sebulba on several hosts) those of its own devices, whose environments it steps."""
        if isinstance(x, np.ndarray) or self._local:
            return np.asarray(x)
        shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
        return np.concatenate([np.asarray(s.data) for s in shards])

    def _to_device(self, result: Any, dtype: Any, per_group: tuple[int, ...]) -> Any:
        """A host step's result (this process's replicas) as the per-replica value the program takes: numpy
        straight into the compiled program in one process (its C++ path moves it ~10x faster than
        `device_put`), an array assembled from every process's part across processes."""
        local = np.asarray(result, dtype).reshape((-1,) + per_group)
        if self._local:
            return local
        return jax.make_array_from_process_local_data(self.per_replica, local, (self.mesh.size,) + per_group)

    def _group(self, leaves: Sequence[Any], g: int, uses: Sequence[Use], time: bool = False) -> list[Any]:
        """Group g's part of each per-replica leaf (stacked: the group axis is one further; `time`: one more)."""
        if self.groups == 1:
            return list(leaves)
        return [x if self.group_axes[u] is None else self._slice(x, g, self.groups, self.group_axes[u] + 1 + time)
                for x, u in zip(leaves, uses)]

    def _merge(self, per_group: list[list[Any]], axes: Sequence[int | None]) -> list[Any]:
        """The carry's per-replica leaves from every group's: concatenated along the group axis (stacked: one
        further)."""
        if self.groups == 1:
            return list(per_group[0])
        return [per_group[0][i] if axis is None else self._concat(tuple(p[i] for p in per_group), axis + 1)
                for i, axis in enumerate(axes)]


def _group_shape(use: Use, groups: int) -> tuple[int, ...]:
    """One group's shape of a leaf of the step (its `@env` axis split by `groups`)."""
    return _leaf_group_shape(use.type, groups)


def _leaf_group_shape(leaf: Any, groups: int) -> tuple[int, ...]:
    shape = list(leaf.shape)
    if leaf.axis is not None:
        shape[leaf.axis] //= groups
    return tuple(shape)


def _glue_for_groups(node: Glue, groups: int) -> jex.ClosedJaxpr:
    """Glue of a step traced again at one group's shapes (its operands' `@env` axes split by `groups`); refused
    in one line where its equations fix the whole replica's shapes (a reshape, a broadcast to a size)."""
    structs = [local_struct(u.type, groups) for u in node.inputs]
    try:
        body = jax.make_jaxpr(jex.jaxpr_as_fun(node.body))(*structs)
    except Exception as err:  # JAX's shape errors come as TypeError, ValueError, ...
        raise FragcError(f"glue %{node.outputs[0].name} in a host loop's step does not run on one of {groups} "
                         f"environment groups ({type(err).__name__}: {str(err).splitlines()[0][:200]}); use "
                         "env_groups=1, or do that work in a fragment") from err
    want = [_leaf_group_shape(t, groups) for t in node.outputs[0].type.leaves]
    if [tuple(a.shape) for a in body.out_avals] != want:
        raise FragcError(f"glue %{node.outputs[0].name} in a host loop's step makes other shapes on one of {groups} "
                         "environment groups than its types say; use env_groups=1, or do that work in a fragment")
    return body


def _passed_through(suffix: jex.ClosedJaxpr, n_kept: int, n_ys: int) -> list[int | None] | None:
    """For each per-step output (the suffix's last `n_ys` inputs), the suffix result that hands it on unchanged,
    or None where the suffix only reads it (PPO's s_{t+1}, made into V(s_{t+1})); None if one is handed on twice."""
    invars = suffix.jaxpr.invars[n_kept:n_kept + n_ys]
    outvars = list(suffix.jaxpr.outvars)
    found = [next((o for o, v in enumerate(outvars) if v is y), None) for y in invars]
    handed = [o for o in found if o is not None]
    return None if len(set(handed)) != len(handed) else found


def _compile(name: str, stage: str, fdef: Any, program: Any, structs: Any) -> Executable:
    with cpu_lowerings():
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
    def of(cls, per_replica: tuple[int, ...], dtype: Any, axis: int | None, groups: int,
           replicas: int) -> "TrajectoryLayout":
        """The layout of a leaf of shape `per_replica` (time first) per replica, whose step leaf has its group
        axis at `axis` (without time)."""
        if axis is None:
            return cls((replicas,) + per_replica, dtype, P(REPLICA), None, 0)
        axis += 1  # time first
        shape = list(per_replica)
        shape[axis] *= replicas
        return cls(tuple(shape), dtype, spec(axis), axis, per_replica[axis] // groups)

    def write(self, buf: jax.Array, y: jax.Array, t: jax.Array, g: jax.Array) -> jax.Array:
        """`buf` (one replica's block) with group g's output `y` of step t written."""
        if self.axis is None:
            step = jax.lax.dynamic_index_in_dim(buf[0], t, 0, keepdims=False)
            return jax.lax.dynamic_update_index_in_dim(buf[0], jnp.where(g == 0, y, step), t, 0)[None]
        start = [jnp.int32(0)] * buf.ndim
        start[0], start[self.axis] = t, g * self.rows
        return jax.lax.dynamic_update_slice(buf, y[None].astype(buf.dtype), start)
