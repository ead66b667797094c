"""`policy="auto"`: a placement search guided by a cost model and checked by measurement (docs/auto.md).

1. enumerate candidates: every built-in policy (actor/learner splits of the devices), iterations per
   dispatch, environment groups for host environments, a population's base policy;
2. prune what cannot run, with the reason: the passes refuse it (`FragcError`), or its state does not fit
   the memory limit per device;
3. rank the rest by a cost model (`predict`): no XLA compilation, only the passes and the jaxprs;
4. compile and time the best few (`top`), alternating, within a time budget; XLA's memory analysis of each
   compiled program prunes one over the limit; the fastest measured wins;
5. cache the decision on disk, keyed by the algorithm's configuration, the devices, fragc's version and the
   candidate space: the same search again compiles only the chosen program.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np

from fragc.ir.errors import FragcError
from fragc.ir.frontend import fragment as _fragment

KS = (4, 16, 64)
"""Iterations per dispatch the search tries (capped by the run length)."""

MARGIN = 1.4
"""The model's measured ranking error: in the calibration of docs/benchmarks.md (8 simulated CPU devices, PPO,
DQN, IMPALA, Regression), a placement predicted up to 1.31x slower than another was measured faster than it
(DQN's actor_learner_async against anakin), none predicted more; against the earlier run's measured times
(commit a3e294e) up to 1.39x. The search times a runner-up only when it is predicted within this factor of
the best."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One configuration: a policy (any string `resolve` accepts, e.g. `actor_learner(actors=2)`), iterations
    per dispatch, environment groups (None: the policy's own), population seeds (0: none)."""

    policy: str
    k: int = 16
    env_groups: int | None = None
    seeds: int = 0

    @property
    def label(self) -> str:
        p = f"population({self.policy},{self.seeds})" if self.seeds else self.policy
        return p + f" k={self.k}" + ("" if self.env_groups is None else f" G={self.env_groups}")

    def policy_arg(self) -> Any:
        from fragc.passes.policy import population

        return population(self.policy, self.seeds) if self.seeds else self.policy


@dataclasses.dataclass
class Row:
    """A candidate's line in the table."""

    candidate: Candidate
    predicted_s: float | None = None  # seconds per iteration, the cost model's
    measured_s: float | None = None  # seconds per iteration, median of the timed repeats
    pruned: str = ""  # why it cannot run
    note: str = ""  # e.g. "not timed: out of budget"
    memory_bytes: int | None = None  # per device: the state's (estimate), or XLA's analysis once compiled
    terms: dict = dataclasses.field(default_factory=dict)  # the model's terms, seconds per iteration

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["candidate"] = dataclasses.asdict(self.candidate)
        return d

    @staticmethod
    def from_json(d: dict) -> "Row":
        return Row(**{**d, "candidate": Candidate(**d["candidate"])})


@dataclasses.dataclass
class AutoReport:
    """What the search did: `prog.auto` of a program compiled with `policy="auto"`."""

    chosen: Candidate
    rows: list[Row]
    search_s: float
    devices: int
    device_kind: str
    steps_per_iteration: int = 0
    budget_s: float = 60.0
    out_of_budget: bool = False
    cached: bool = False
    cache_file: str | None = None
    compiled: int = 0  # programs compiled (and timed) by the search
    constants: dict = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        how = ("cached decision" if self.cached else
               f"{len(self.rows)} candidates in {self.search_s:.1f} s"
               + (", out of budget" if self.out_of_budget else ""))
        return f"auto: chose {self.chosen.label} from {how}"

    def table(self) -> str:
        """The ranked table: predicted and measured time per iteration (and env-steps/s), or why pruned."""
        steps = self.steps_per_iteration
        ranked = sorted(self.rows, key=_rank_key)
        lines = [f"{'':2}{'candidate':40}{'predicted ms/it':>16}{'measured ms/it':>16}{'env-steps/s':>13}"
                 f"{'MiB/device':>11}  note"]
        for r in ranked:
            mark = "*" if r.candidate == self.chosen else ""
            pred = f"{r.predicted_s * 1e3:.2f}" if r.predicted_s is not None else "-"
            meas = f"{r.measured_s * 1e3:.2f}" if r.measured_s is not None else "-"
            sps = f"{steps / r.measured_s:,.0f}" if (r.measured_s and steps) else "-"
            mem = f"{r.memory_bytes / 2**20:.2f}" if r.memory_bytes is not None else "-"
            why = f"pruned: {r.pruned}" if r.pruned else r.note
            lines.append(f"{mark:2}{r.candidate.label:40}{pred:>16}{meas:>16}{sps:>13}{mem:>11}  {why}")
        lines.append(self.summary())
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["chosen"] = dataclasses.asdict(self.chosen)
        d["rows"] = [r.to_json() for r in self.rows]
        return d

    @staticmethod
    def from_json(d: dict) -> "AutoReport":
        return AutoReport(**{**d, "chosen": Candidate(**d["chosen"]), "rows": [Row.from_json(r) for r in d["rows"]]})


def _rank_key(r: Row) -> tuple:
    if r.pruned:
        return (2, 0.0, 0.0)
    if r.measured_s is not None:
        return (0, r.measured_s, 0.0)
    return (1, r.predicted_s if r.predicted_s is not None else math.inf, 0.0)


# ---------------------------------------------------------------- the candidate space

def default_candidates(num_devices: int, hosted: bool = False, iterations: int | None = None, seeds: int = 0,
                       env_groups: int | None = None, ks: Sequence[int] = KS) -> list[Candidate]:
    """Every built-in policy (actor/learner splits with N/4, N/2 and 3N/4 actors), each k in `ks` capped by
    the run length `iterations`, environment groups 1 and 2 for host environments (unless `env_groups` is
    fixed), as a population of `seeds` seeds when one was asked for."""
    n = num_devices
    policies = ["single"]
    if n > 1:
        policies += ["anakin", "gspmd"]
        splits = sorted({a for a in (n // 4, n // 2, (3 * n) // 4) if 1 <= a < n})
        for base in ("actor_learner", "actor_learner_async"):
            policies += [f"{base}(actors={a})" for a in splits]
    kset = sorted({min(k, iterations) if iterations else k for k in ks})
    groups: list[int | None] = [env_groups] if env_groups is not None else ([1, 2] if hosted else [None])
    return [Candidate(p, k, g, seeds) for p in policies for g in groups for k in kset]


# ---------------------------------------------------------------- the cost model

def jaxpr_cost(jaxpr: Any, times: float = 1.0) -> dict[str, float]:
    """FLOPs (matrix products and convolutions), bytes read and written (every equation's operands and
    results, as if unfused), equations and loop trips, per call of `jaxpr`, a scan's body `length` times (XLA's own cost
    analysis counts a loop's body once), the costlier branch of a `cond`, a `while` body once."""
    from jax.extend import core as jex

    out = {"flops": 0.0, "bytes": 0.0, "ops": 0.0, "trips": 0.0}
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        subs = list(jex.jaxprs_in_params(eqn.params))
        if subs:
            if name == "cond":
                costs = [jaxpr_cost(s, times) for s in subs]
                best = max(costs, key=lambda c: c["flops"] + c["bytes"])
                for key in out:
                    out[key] += best[key]
                continue
            trips = float(eqn.params.get("length", 1)) if name == "scan" else 1.0
            out["trips"] += times * trips if name in ("scan", "while") else 0.0
            for s in subs:
                sub = jaxpr_cost(s, times * trips)
                for key in out:
                    out[key] += sub[key]
            continue
        out["ops"] += times
        out["bytes"] += times * sum(_nbytes(v.aval) for v in list(eqn.invars) + list(eqn.outvars))
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            k = int(np.prod([eqn.invars[0].aval.shape[d] for d in contract])) if contract else 1
            out["flops"] += times * 2.0 * k * _size(eqn.outvars[0].aval)
        elif name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape
            out["flops"] += times * 2.0 * _size(eqn.outvars[0].aval) * int(np.prod(rhs)) / max(1, rhs[0])
    return out


def _size(aval: Any) -> int:
    return int(np.prod(getattr(aval, "shape", ()) or (1,)))


def _nbytes(aval: Any) -> int:
    dtype = getattr(aval, "dtype", None)
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # PRNG keys, tokens
        itemsize = 8
    return _size(aval) * itemsize if hasattr(aval, "shape") else 0


@dataclasses.dataclass
class Machine:
    """Constants of one device kind and count, measured once by micro-benchmarks (`measure_machine`)."""

    flops_per_s: float  # matrix products, one device
    bytes_per_s: float  # unfused operand + result bytes, one device (as `jaxpr_cost` counts them)
    speedup: dict  # group size (str) -> how much faster g devices run g equal shares than one device runs one
    trip_s: dict  # group size (str) -> seconds per loop trip of a program on g devices
    collective_s: dict  # group size (str) -> seconds per collective call over g devices (its latency)
    dispatch_s: float  # one dispatch of a program and the fetch of its result (per dispatch)
    call_s: float  # queuing one more program call (per stage call of a staged iteration)
    collective_bytes_per_s: float  # bytes one device receives from a psum, per second
    transfer_bytes_per_s: float  # device_put between devices
    host_call_s: float  # one round trip device -> host -> device
    # what fragc's runtime pays per dispatch beyond `dispatch_s`, measured on tiny fragc programs
    dispatch_leaf_s: float = 0.0  # per leaf of the state (the program's arguments, donated, and results)
    dispatch_metric_s: float = 0.0  # per metric (its rows fetched to the host and sliced)
    # a staged schedule's fixed costs, per group size (str) of the stage or of the transfer's destination
    stage_call_s: dict = dataclasses.field(default_factory=dict)  # one stage program's launch
    stage_leaf_s: dict = dataclasses.field(default_factory=dict)  # each argument leaf of that launch
    put_leaf_s: dict = dataclasses.field(default_factory=dict)  # one leaf's device_put between groups

    def parallel(self, g: int) -> float:
        return _by_size(self.speedup, g, 1.0)

    def trip(self, g: int) -> float:
        return _by_size(self.trip_s, g, 0.0)

    def collective(self, g: int) -> float:
        return _by_size(self.collective_s, g, 0.0) if g > 1 else 0.0

    def stage_call(self, g: int) -> float:
        return _by_size(self.stage_call_s, g, self.call_s)

    def stage_leaf(self, g: int) -> float:
        return _by_size(self.stage_leaf_s, g, 0.0)

    def put_leaf(self, g: int) -> float:
        return _by_size(self.put_leaf_s, g, 0.0)


def _by_size(table: dict, g: int, default: float) -> float:
    """The entry of group size g, else the nearest measured size below it."""
    if str(g) in table:
        return float(table[str(g)])
    below = [v for k, v in sorted((int(k), v) for k, v in table.items()) if k <= g]
    return float(below[-1]) if below else default


def _best_time(fn: Callable[[], Any], repeats: int = 9) -> float:
    import jax

    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_machine(devices: Sequence[Any], group_sizes: Sequence[int]) -> Machine:
    """Micro-benchmarks on `devices` (a second or two)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    d0 = devices[0]
    n = 192

    def matmuls(x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ x), None), x, None, length=16)[0]

    x = jax.device_put(jnp.ones((n, n), jnp.float32) / n, d0)
    f_mm = jax.jit(matmuls)
    t_mm = _best_time(lambda: f_mm(x))
    c_mm = jaxpr_cost(jax.make_jaxpr(matmuls)(x).jaxpr)

    def elementwise(y):  # a cache-sized array, as an RL network's activations are
        return jax.lax.scan(lambda c, _: (c * 1.0001 + 0.5, None), y, None, length=32)[0]

    y = jax.device_put(jnp.ones((1 << 16,), jnp.float32), d0)
    f_ew = jax.jit(elementwise)
    t_ew = _best_time(lambda: f_ew(y))
    c_ew = jaxpr_cost(jax.make_jaxpr(elementwise)(y).jaxpr)

    def small_ops(z):
        return jax.lax.scan(lambda c, _: (jnp.sin(c) * 1.01 + 0.1, None), z, None, length=256)[0]

    z = jax.device_put(jnp.ones((8,), jnp.float32), d0)
    f_op = jax.jit(small_ops)
    t_op = _best_time(lambda: f_op(z))
    c_op = jaxpr_cost(jax.make_jaxpr(small_ops)(z).jaxpr)

    bytes_per_s = c_ew["bytes"] / t_ew
    trip1 = max(1e-9, (t_op - c_op["bytes"] / bytes_per_s) / c_op["trips"])
    flops_per_s = c_mm["flops"] / max(1e-9, t_mm - c_mm["bytes"] / bytes_per_s - c_mm["trips"] * trip1)

    speedup, trip_s, collective_s = {"1": 1.0}, {"1": trip1}, {}
    for g in sorted(set(group_sizes)):
        if g <= 1 or g > len(devices):
            continue
        mesh = Mesh(np.array(devices[:g]), ("d",))
        xs = jax.device_put(jnp.ones((g * n, n), jnp.float32) / n, NamedSharding(mesh, P("d")))
        f_g = jax.jit(jax.shard_map(matmuls, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        t_g = _best_time(lambda: f_g(xs))
        speedup[str(g)] = g * t_mm / t_g
        zs = jax.device_put(jnp.ones((g * 8,), jnp.float32), NamedSharding(mesh, P("d")))
        f_t = jax.jit(jax.shard_map(small_ops, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        trip_s[str(g)] = max(1e-9, _best_time(lambda: f_t(zs)) / c_op["trips"])

        def psums(b):
            return jax.lax.scan(lambda c, _: (jax.lax.psum(c, "d") * 0.1 + c * 0.5, None), b, None, length=64)[0]

        f_c = jax.jit(jax.shard_map(psums, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        collective_s[str(g)] = max(0.0, _best_time(lambda: f_c(zs)) / 64 - trip_s[str(g)])

    # a staged schedule: a stage program's launch and each of its argument leaves, a leaf's device_put
    stage_call_s, stage_leaf_s, put_leaf_s = {}, {}, {}
    nd = len(devices)
    for g in sorted(set(group_sizes) | {1}):
        if g > nd:
            continue
        src = NamedSharding(Mesh(np.array(devices[:g]), ("d",)), P("d"))
        dst_devs = devices[nd - g:] if 2 * g <= nd else devices[::-1][:g]  # every shard moves
        dst = NamedSharding(Mesh(np.array(dst_devs), ("d",)), P("d"))
        per_call = {}
        for leaves in (1, 16):
            xs = [jax.device_put(jnp.ones((g * 4,), jnp.float32), src) for _ in range(leaves)]
            f_s = jax.jit(lambda *a: [x + 1 for x in a]).lower(*xs).compile()
            per_call[leaves] = _best_time(lambda: _chain(f_s, xs, 32)) / 32
        stage_leaf_s[str(g)] = max(0.0, (per_call[16] - per_call[1]) / 15)
        stage_call_s[str(g)] = max(1e-7, per_call[1] - stage_leaf_s[str(g)])
        if nd > 1:
            put_leaf_s[str(g)] = _best_time(lambda: [jax.device_put(x, dst) for x in xs]) / len(xs)

    tiny = jax.jit(lambda a: a + 1)
    a = jax.device_put(jnp.zeros((4,), jnp.float32), d0)
    tiny(a).block_until_ready()
    dispatch_s, dispatch_leaf_s, dispatch_metric_s = _fragc_dispatch_s(d0)
    t0 = time.perf_counter()
    for _ in range(50):
        a = tiny(a)
    a.block_until_ready()
    call_s = (time.perf_counter() - t0) / 50

    coll_bps = transfer_bps = 1e9
    if nd > 1:
        mesh = Mesh(np.array(devices), ("d",))
        m = 1 << 16
        v = jax.device_put(jnp.ones((nd * m,), jnp.float32), NamedSharding(mesh, P("d")))
        f_ps = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "d"), mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        t_ps = _best_time(lambda: f_ps(v))
        coll_bps = 2 * (nd - 1) / nd * m * 4 / t_ps
        w = jax.device_put(jnp.ones((1 << 20,), jnp.float32), devices[0])
        t_tr = _best_time(lambda: jax.device_put(w, devices[-1]))
        transfer_bps = w.nbytes / t_tr

    def host_round_trip(b):
        return jax.pure_callback(lambda c: np.asarray(c) + 1, jax.ShapeDtypeStruct(b.shape, b.dtype), b)

    f_h = jax.jit(host_round_trip)
    t_h = _best_time(lambda: f_h(a))
    return Machine(flops_per_s, bytes_per_s, speedup, trip_s, collective_s, dispatch_s, call_s, coll_bps,
                   transfer_bps, max(0.0, t_h - dispatch_s), dispatch_leaf_s, dispatch_metric_s, stage_call_s,
                   stage_leaf_s, put_leaf_s)


def _chain(f: Any, xs: list[Any], n: int) -> list[Any]:
    """`n` calls of `f`, each on the previous call's results (queued, as a staged iteration queues its stages)."""
    for _ in range(n):
        xs = f(*xs)
    return xs


class _Tiny:
    """The smallest algorithm with `leaves` state leaves and `metrics` metrics (for `_fragc_dispatch_s`)."""

    steps_per_iteration = 1

    def __init__(self, leaves: int = 1, metrics: int = 1):
        self.leaves, self.metrics = leaves, metrics

    def init(self, key):
        import jax.numpy as jnp

        return {"x": [jnp.zeros((2,), jnp.float32) for _ in range(self.leaves)]}

    def iteration(self, state):
        xs = _tiny_step(state["x"])
        return {"x": xs}, {f"m{i}": xs[i % self.leaves][0] for i in range(self.metrics)}


@_fragment(role="learner", in_axes=(None,), out_axes=(None,))
def _tiny_step(xs):
    return [x + 1 for x in xs]


def _fragc_dispatch_s(device: Any) -> tuple[float, float, float]:
    """What one more dispatch costs a fragc program through `Program.run` (its Python driver, the program's
    launch with its arguments, the metrics' fetch and slicing): tiny programs of (state leaves, metrics) =
    (1, 1), (33, 1), (1, 9), each run with k=1 and with k=32 -> (seconds per dispatch, per state leaf, per
    metric). The difference of k=1 and k=32 over the dispatches saved is the cost of a dispatch."""
    import fragc

    def per_dispatch(leaves: int, metrics: int) -> float:
        per = {}
        for k in (1, 32):
            prog = fragc.compile(_Tiny(leaves, metrics), "single", devices=[device], iterations_per_dispatch=k)
            state, _ = prog.run(prog.init(0), 32)
            best = math.inf
            for _ in range(5):
                t0 = time.perf_counter()
                state, _ = prog.run(state, 64)
                best = min(best, time.perf_counter() - t0)
            per[k] = best
        return max(1e-6, (per[1] - per[32]) / (64 - 2))

    base = per_dispatch(1, 1)
    leaf = max(0.0, (per_dispatch(33, 1) - base) / 32)
    metric = max(0.0, (per_dispatch(1, 9) - base) / 8)
    return max(1e-6, base - leaf - metric), leaf, metric


_FRAGMENT_COSTS: dict[tuple, dict] = {}


def _fragment_cost(fdef: Any) -> dict[str, float]:
    """`jaxpr_cost` of a fragment's body at global shapes, cached by name and types (candidates share it)."""
    body = fdef.body
    key = (fdef.name, str(body.in_avals), str(body.out_avals), len(body.jaxpr.eqns))
    if key not in _FRAGMENT_COSTS:
        _FRAGMENT_COSTS[key] = jaxpr_cost(body.jaxpr)
    return _FRAGMENT_COSTS[key]


_COLLECTIVES: dict[tuple, tuple] = {}


def _collectives(fdef: Any, group_size: int) -> tuple[float, float]:
    """(bytes one device receives, collective calls) per run of the fragment (runtime/cost.py's rules); for
    a `jit` fragment, as if it ran one replica per device of its group (XLA's own choice is not visible
    before compiling)."""
    from fragc.runtime.cost import _jaxpr_bytes, collective_calls

    r = fdef.placement.replicas if fdef.placement.lowering == "shard_map" else group_size
    if r <= 1:
        return 0.0, 0.0
    key = (fdef.name, str(fdef.body.in_avals), r)
    if key not in _COLLECTIVES:
        try:
            body = fdef.body_for(r).jaxpr
            _COLLECTIVES[key] = (float(_jaxpr_bytes(body, r)), float(collective_calls(body)))
        except Exception:  # an axis that does not divide: XLA still partitions it; count nothing
            _COLLECTIVES[key] = (0.0, 0.0)
    return _COLLECTIVES[key]


def predict(module: Any, machine: Machine, k: int) -> dict[str, float]:
    """Seconds per iteration of a placed, scheduled module with `k` iterations a dispatch, by term.

    compute: each fragment run's serial time (FLOPs / F + bytes / B, the work of all replicas and
      population members) over the speedup of its group's size, plus its loop trips x the cost of a trip on
      that many devices; groups in sequence, or, with staleness (actor_learner_async), overlapped (the
      slowest group);
    collectives: bytes received per device / collective bandwidth + calls x a call's latency on the group;
    transfers: bytes / transfer bandwidth, plus (staged) each leaf's device_put latency on its destination
      group, or (one program) a call each; host: the host steps' round trips and bytes (overlapped with
      inference with G >= 2);
    stages (staged only): each stage program's launch on its group, plus a cost per argument leaf;
    dispatch: one dispatch per k iterations: a base cost, plus one per state leaf and one per metric."""
    from fragc.ir.module import Delay, Loop, Run, Transfer, walk_counted
    from fragc.runtime.cost import host_bytes

    members = max(1, len(module.population))
    sizes = {m.name: len(m.devices) for m in module.meshes}
    group_s: dict[str, float] = {}
    coll = host = 0.0
    for node, times in walk_counted(module.graph.nodes):
        if not isinstance(node, Run):
            continue
        fdef = module.fragments[node.fragment]
        if fdef.part_of:
            continue
        g = sizes.get(fdef.placement.group, 1)
        c = _fragment_cost(fdef)
        serial = members * (c["flops"] / machine.flops_per_s + c["bytes"] / machine.bytes_per_s)
        compute = times * (serial / machine.parallel(g) + c["trips"] * machine.trip(g))
        nbytes, calls = _collectives(fdef, g)
        coll += times * (nbytes / machine.collective_bytes_per_s + calls * machine.collective(g))
        steps = sum(s.calls for s in fdef.host_steps)
        if steps:
            trip = machine.host_call_s * steps
            if isinstance(node, Loop):  # the time loop from the host: infer, step, absorb each step and group
                trip += 3 * machine.call_s * node.steps * node.groups
                if node.groups >= 2:  # inference of one group overlaps the host stepping of the other
                    both = max(compute, trip)
                    compute, trip = both, min(compute, trip) / node.groups
            host += times * trip
        group_s[fdef.placement.group] = group_s.get(fdef.placement.group, 0.0) + compute
    to_host, from_host = host_bytes(module)
    host += (to_host + from_host) / machine.transfer_bytes_per_s
    from fragc.runtime.cost import transfer_bytes
    from fragc.runtime.stages import region_stages

    staged = module.schedule.shape == "staged"
    transfers = [(n, t) for n, t in walk_counted(module.graph.nodes) if isinstance(n, Transfer)]
    transfer = transfer_bytes(module) / machine.transfer_bytes_per_s
    stages = 0.0
    if staged:  # each transfer is a device_put per leaf, each stage a program launched with its leaves
        transfer += sum(t * len(n.outputs[0].type.leaves) * machine.put_leaf(sizes.get(n.dst, 1))
                        for n, t in transfers)
        runs = [(s, 1) for s in module.stages] + [(s, t) for s, _, t in region_stages(module.graph)]
        for s, t in runs:
            g = sizes.get(s.group, 1)
            stages += t * (machine.stage_call(g) + len(s.inputs) * machine.stage_leaf(g))
    else:  # inside the one program: a call's worth each
        transfer += sum(t for _, t in transfers) * machine.call_s
    overlapped = staged and any(isinstance(n, Delay) for n in module.graph.nodes)
    compute = max(group_s.values(), default=0.0) if overlapped else sum(group_s.values())
    leaves = len(module.graph.inputs[0].type.leaves)
    metrics = max(0, len(module.graph.outputs) - leaves)
    dispatch = (machine.dispatch_s + leaves * machine.dispatch_leaf_s + metrics * machine.dispatch_metric_s) / k
    total = compute + coll + transfer + host + stages + dispatch
    return {"compute": compute, "collectives": coll, "transfers": transfer, "host": host, "stages": stages,
            "dispatch": dispatch, "total": total}


def state_bytes_per_device(module: Any, devices: Sequence[Any]) -> int:
    """The most bytes of the training state that one device holds (a population's members included)."""
    from fragc.runtime.lower import leaf_sharding

    members = (len(module.population),) if module.population else ()
    per: dict[Any, int] = {}
    for leaf in module.graph.inputs[0].type.leaves:
        shape = members + tuple(leaf.shape)
        sharding = leaf_sharding(leaf, module, devices)
        try:
            local = sharding.shard_shape(shape)
        except Exception:
            local = shape
        nbytes = int(np.prod(local or (1,))) * _itemsize(leaf.dtype)
        for d in sharding.device_set:
            per[d] = per.get(d, 0) + nbytes
    return max(per.values(), default=0)


def _itemsize(dtype: Any) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 8


def program_memory(prog: Any) -> int:
    """XLA's memory analysis of a compiled program: argument + output + temp bytes, the largest of its
    executables (each runs on one device group; the numbers are per device)."""
    best = 0
    for e in prog._executor.executables:
        try:
            m = e.compiled.memory_analysis()
        except Exception:
            m = None
        if m is None:
            continue
        best = max(best, int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes))
    return best


def default_memory_limit(devices: Sequence[Any]) -> int | None:
    """The device's own memory limit where it reports one (GPU), else None (CPU: no limit)."""
    try:
        stats = devices[0].memory_stats()
    except Exception:
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


# ---------------------------------------------------------------- the cache

def cache_folder() -> str:
    from fragc.runtime.reporting import default_cache_dir

    env = os.environ.get("FRAGC_CACHE_DIR")
    return os.path.join(env or os.path.dirname(default_cache_dir()), "auto")


def algo_key(algo: Any) -> dict:
    """The algorithm as the cache sees it: its class and its config (or its plain attributes)."""
    from fragc.training import config_dict

    config = config_dict(algo)
    if config is None:
        plain = {k: v for k, v in sorted(vars(algo).items()) if isinstance(v, (int, float, str, bool, type(None)))}
        config = plain
    return {"algo": f"{type(algo).__module__}.{type(algo).__qualname__}", "config": config}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def _write_json(path: str, obj: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as f:
            json.dump(obj, f, indent=1, default=str)
        os.replace(partial, path)
    except OSError:  # a cache that cannot be written costs a search next time, nothing else
        pass


def group_sizes_of(num_devices: int) -> list[int]:
    """The group sizes of the default space on `num_devices` devices: 1, the actor/learner splits, all."""
    n = num_devices
    return sorted({g for g in (1, n // 4, n // 2, (3 * n) // 4, n - n // 4, n - n // 2, n) if 1 <= g <= n})


def machine_constants(devices: Sequence[Any], group_sizes: Sequence[int] = (), cache: bool = True) -> Machine:
    """`measure_machine`, cached on disk per device kind and count. It measures the group sizes of the default
    space (`group_sizes_of`) and any other asked for, so that every search on these devices reads the same
    file; a size the file lacks measures again (all of them) and rewrites it."""
    import jax

    n = len(devices)
    sizes = sorted(set(group_sizes_of(n)) | {g for g in group_sizes if 1 <= g <= n})
    key = {"kind": devices[0].device_kind, "platform": devices[0].platform, "count": n, "jax": jax.__version__,
           "v": 5}
    path = os.path.join(cache_folder(), f"machine-{_digest(key)}.json")
    if cache and (d := _read_json(path)):
        try:
            m = Machine(**d)
            if {str(g) for g in sizes if g > 1} <= set(m.speedup):
                return m
            sizes = sorted(set(sizes) | {int(g) for g in m.speedup})
        except TypeError:
            pass
    m = measure_machine(devices, sizes)
    if cache:
        _write_json(path, dataclasses.asdict(m))
    return m


# ---------------------------------------------------------------- the search

@dataclasses.dataclass
class Counters:
    """What searches did in this process (tests read it): programs compiled, and timed."""

    compiled: int = 0
    timed: int = 0


COUNTERS = Counters()


def rank(algo: Any, devs: Sequence[Any], candidates: Sequence[Candidate], memory_limit: int | None = None, *,
         env_workers: int | None = None, transfers: str = "auto", machine: Machine | None = None,
         cache: bool = True, traced: Any = None) -> tuple[list[Row], Machine]:
    """The search's first half, no XLA compilation: each candidate's row, pruned (the passes refuse it, its
    state does not fit `memory_limit` bytes per device) or predicted (`predict`)."""
    from fragc.ir.frontend import trace

    rows = [Row(c) for c in candidates]
    traced = traced or trace(algo)  # once for the whole search
    # 1. the passes of each (policy, environment groups): one module serves every k
    modules: dict[tuple, Any] = {}
    for row in rows:
        c = row.candidate
        mkey = (c.policy, c.env_groups, c.seeds)
        if mkey not in modules:
            try:
                modules[mkey] = (_passes(traced, c, devs, transfers, env_workers), list(devs), None)
            except FragcError as err:
                modules[mkey] = (None, None, str(err))
        module, pdevs, error = modules[mkey]
        if error is not None:
            row.pruned = error
            continue
        row.memory_bytes = state_bytes_per_device(module, pdevs)
        if memory_limit is not None and row.memory_bytes > memory_limit:
            row.pruned = f"state needs {_mib(row.memory_bytes)} per device, over the limit {_mib(memory_limit)}"
    # 2. the model
    sizes = sorted({len(m.devices) for module, _, _ in modules.values() if module is not None
                    for m in module.meshes} | {1})
    machine = machine or machine_constants(devs, sizes, cache=cache)
    for row in rows:
        if row.pruned:
            continue
        module = modules[(row.candidate.policy, row.candidate.env_groups, row.candidate.seeds)][0]
        row.terms = predict(module, machine, row.candidate.k)
        row.predicted_s = row.terms["total"]
    return rows, machine


def _passes(traced: Any, c: Candidate, devs: Sequence[Any], transfers: str, env_workers: int | None) -> Any:
    """`fragc.api.run_passes` for one process, from a module traced once: the placed, scheduled module."""
    from fragc.api import carrier
    from fragc.passes import default_passes, resolve, run_pipeline

    policy = resolve(c.policy_arg(), len(devs))
    if c.env_groups is not None:
        policy = dataclasses.replace(policy, env_groups=c.env_groups)
    if env_workers is not None:
        policy = dataclasses.replace(policy, env_workers=env_workers)
    if policy.num_devices > len(devs):
        raise FragcError(f"policy '{policy.name}' uses {policy.num_devices} devices but the program has {len(devs)}")
    hosted = any(f.host_steps for f in traced.fragments.values())
    passes = default_passes(policy, c.k, carrier(transfers, devs, hosted))
    return run_pipeline(traced, passes, printer=lambda s: None).final


def search(algo: Any, devices: int | Sequence[Any] | None = None, *, budget: float = 60.0, top: int = 3,
           candidates: Sequence[Candidate] | None = None, memory_limit: int | None | str = "device",
           iterations: int | None = None, seeds: int = 0, env_groups: int | None = None,
           env_workers: int | None = None, transfers: str = "auto", cache: bool = True,
           log: Callable[[str], None] | None = None, timed_iterations: int = 16, repeats: int = 3,
           margin: float = MARGIN, settle: float = 0.1, machine: Machine | None = None) -> Any:
    """The search (module docstring) -> the chosen, compiled `Program`, with `prog.auto` its `AutoReport`.

    devices: a count or the devices (default: all); budget: seconds for the whole search, after which
    candidates are no longer timed; top: how many of the best predicted to time; candidates: the space
    (default `default_candidates`); memory_limit: bytes per device (default "device": the device's own
    limit where it reports one, none on CPU); iterations: the run length, which caps k; seeds: a population's
    seed count; timed_iterations, repeats: each timed candidate runs `repeats` alternating times for at
    least `timed_iterations` iterations (whole dispatches; one round when only one is timed: there is nothing
    to compare; no more rounds once every other candidate's fastest round is over 1 + `settle` times the
    leader's slowest: more rounds cannot change the choice by more than that); margin: a candidate predicted more than `margin` times slower than the best predicted is not
    timed (default `MARGIN`, the model's measured ranking error); machine: the constants of the model (default:
    measured once per device kind and count, cached). Only the best predicted k of each placement (policy,
    environment groups) is timed: k changes only the dispatch term, which the model measures."""
    import jax

    import fragc
    from fragc.devices import devices as choose_devices
    from fragc.ir.frontend import trace
    from fragc.runtime.actions import steps_per_iteration

    say = log or (lambda line: None)
    if jax.process_count() > 1:
        raise FragcError("auto: the placement search runs in one process; search there (fragc run ... --policy auto "
                         "--explain) and pass the chosen policy to the multi-process run")
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not budget > 0:
        raise FragcError(f"auto: the search budget must be a positive number of seconds, got {budget!r}")
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise FragcError(f"auto: top must be a positive int, got {top!r}")
    if devices is None or isinstance(devices, int):
        devs = choose_devices(devices if devices is not None else None)
    else:
        devs = list(devices)
    n = len(devs)
    if memory_limit == "device":
        memory_limit = default_memory_limit(devs)
    if memory_limit is not None and (not isinstance(memory_limit, int) or isinstance(memory_limit, bool)
                                     or memory_limit < 1):
        raise FragcError(f"auto: memory_limit must be a positive number of bytes, got {memory_limit!r}")
    start = time.perf_counter()
    traced = trace(algo)
    hosted = any(f.host_steps for f in traced.fragments.values())
    if candidates is None:
        candidates = default_candidates(n, hosted, iterations, seeds, env_groups)
    candidates = list(candidates)
    if not candidates:
        raise FragcError("auto: the candidate space is empty")
    if not all(isinstance(c, Candidate) for c in candidates):
        raise FragcError("auto: candidates must be fragc.auto.Candidate values")
    steps = steps_per_iteration(algo)
    kind = f"{devs[0].platform}:{devs[0].device_kind}"
    key = {"algo": algo_key(algo), "device_kind": kind, "devices": n, "fragc": fragc.__version__,
           "space": [c.label for c in candidates], "top": top, "memory_limit": memory_limit,
           "transfers": transfers, "env_workers": env_workers, "search": 3}
    path = os.path.join(cache_folder(), f"choice-{_digest(key)}.json")
    if cache and (saved := _read_json(path)) and saved.get("key") == json.loads(json.dumps(key, default=str)):
        report = AutoReport.from_json(saved["report"])
        report.cached, report.cache_file = True, path
        c = report.chosen
        prog = fragc.compile(algo, c.policy_arg(), devices=devs, iterations_per_dispatch=c.k,
                             env_groups=c.env_groups, env_workers=env_workers, transfers=transfers)
        report.search_s = time.perf_counter() - start
        return _attach(prog, report)

    # `cache` is the decision's: the machine constants are read from their own cache whatever it says
    rows, machine = rank(algo, devs, candidates, memory_limit, env_workers=env_workers, transfers=transfers,
                         machine=machine, traced=traced)
    live = sorted((r for r in rows if not r.pruned), key=lambda r: r.predicted_s)
    if not live:
        reasons = "; ".join(sorted({r.pruned for r in rows}))[:400]
        raise FragcError(f"auto: no candidate can run on {n} devices: {reasons}")
    say(f"auto: {len(rows)} candidates, {len(live)} can run, ranked in {time.perf_counter() - start:.1f} s")
    # 3. compile and time the best few, alternating
    timed: list[tuple[Row, Any, Any, int]] = []
    out_of_budget = False
    compiled = 0
    placements: set = set()
    first_state = None
    for row in live:
        c = row.candidate
        if len(timed) >= top:
            break
        if (c.policy, c.env_groups) in placements:
            row.note = "not timed: a better k of this placement is"
            continue
        if timed and row.predicted_s > margin * live[0].predicted_s:
            row.note = f"not timed: predicted over {margin:g}x the best"
            continue
        if time.perf_counter() - start > budget and timed:
            out_of_budget = True
            row.note = "not timed: out of budget"
            break
        placements.add((c.policy, c.env_groups))
        try:
            prog = fragc.compile(algo, c.policy_arg(), devices=devs, iterations_per_dispatch=c.k,
                                 env_groups=c.env_groups, env_workers=env_workers, transfers=transfers)
        except FragcError as err:
            row.pruned = str(err)
            continue
        compiled += 1
        COUNTERS.compiled += 1
        row.memory_bytes = program_memory(prog) or row.memory_bytes
        if memory_limit is not None and row.memory_bytes > memory_limit:
            row.pruned = (f"XLA's memory analysis: {_mib(row.memory_bytes)} per device, over the limit "
                          f"{_mib(memory_limit)}")
            continue
        n_it = c.k * max(1, math.ceil(timed_iterations / c.k))
        try:  # the first program's initial state, placed: one init program compiled per search, not per candidate
            state = prog.init(0) if first_state is None else prog.place_state(first_state)
        except FragcError:
            state = prog.init(0)
        first_state = state if first_state is None else first_state
        state, _ = prog.run(state, 1)  # warm-up: the first dispatch, transfers
        jax.block_until_ready(state)
        timed.append((row, prog, state, n_it))
        say(f"auto: compiled {c.label} ({prog.compile_seconds:.1f} s; {time.perf_counter() - start:.1f} s in)")
    samples: dict[int, list[float]] = {id(t[0]): [] for t in timed}
    for r in range(repeats if len(timed) > 1 else 1):
        if r > 0 and _decided(samples, settle):
            break
        if r > 0 and time.perf_counter() - start > budget:
            out_of_budget = True
            break
        for i, (row, prog, state, n_it) in enumerate(timed):
            t0 = time.perf_counter()
            state, _ = prog.run(state, n_it)
            jax.block_until_ready(state)
            samples[id(row)].append((time.perf_counter() - t0) / n_it)
            timed[i] = (row, prog, state, n_it)
            COUNTERS.timed += 1
    for row, _, _, _ in timed:
        row.measured_s = statistics.median(samples[id(row)]) if samples[id(row)] else None
    timed_rows = {id(t[0]) for t in timed}
    for row in live:
        if id(row) not in timed_rows and not row.note and not row.pruned:
            row.note = "not timed" + (": out of budget" if out_of_budget else "")
    if timed:
        best_row, best_prog = min(((r, p) for r, p, _, _ in timed), key=lambda t: t[0].measured_s or math.inf)
    else:  # nothing compiled fits: say so
        raise FragcError("auto: no candidate fits: " + "; ".join(r.pruned for r in live[:3]))
    report = AutoReport(best_row.candidate, rows, time.perf_counter() - start, n, kind, steps, float(budget),
                        out_of_budget, False, path if cache else None, compiled, dataclasses.asdict(machine))
    if cache:
        _write_json(path, {"key": key, "report": report.to_json()})
    return _attach(best_prog, report)


def _decided(samples: dict[int, list[float]], settle: float) -> bool:
    """Whether more rounds cannot change the choice by more than `settle`: every other candidate's fastest
    sample is over (1 + settle) x the leader's slowest."""
    runs = [v for v in samples.values() if v]
    if len(runs) < 2:
        return True
    leader = min(runs, key=min)
    return all(min(v) > (1 + settle) * max(leader) for v in runs if v is not leader)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def _attach(prog: Any, report: AutoReport) -> Any:
    """The chosen program, with its report in `prog.auto` and a line about it in its IR's header."""
    prog.__class__ = _AutoProgram
    prog.auto = report
    return prog


def _program_class() -> type:
    from fragc.runtime.program import Program

    class AutoProgram(Program):
        """A `Program` chosen by the search: `auto` holds its report, and `ir()` says so in its header."""

        auto: AutoReport

        def ir(self, after: str | None = None) -> str:
            text = super().ir(after)
            first, _, rest = text.partition("\n")
            return f"{first}\n// {self.auto.summary()}\n{rest}"

    return AutoProgram


_AutoProgram = _program_class()
