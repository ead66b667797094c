"""The constants of the cost model (`runtime.cost.Machine`), measured by micro-benchmarks on the devices once per
device kind and count and kept on disk; and the device's memory limit."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fragc.compiler import build
from fragc.ir.frontend import fragment
from fragc.options import CompileOptions
from fragc.runtime.cost import Machine, jaxpr_cost
from fragc.runtime import cpu_threads
from fragc.runtime.user_cache import read_json, write_json

from .cache import cache_folder, digest
from .candidates import group_sizes_of


def best_time(fn: Callable[[], Any], repeats: int = 9) -> float:
    """The median seconds of `repeats` calls of `fn`, after one call to warm up."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_machine(devices: Sequence[Any], group_sizes: Sequence[int]) -> Machine:
    """Micro-benchmarks on `devices` (a second or two)."""
    d0 = devices[0]
    n = 192

    def matmuls(x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ x), None), x, None, length=16)[0]

    x = jax.device_put(jnp.ones((n, n), jnp.float32) / n, d0)
    f_mm = jax.jit(matmuls)
    t_mm = best_time(lambda: f_mm(x))
    c_mm = jaxpr_cost(jax.make_jaxpr(matmuls)(x).jaxpr)

    def elementwise(y):  # a cache-sized array, as an RL network's activations are
        return jax.lax.scan(lambda c, _: (c * 1.0001 + 0.5, None), y, None, length=32)[0]

    y = jax.device_put(jnp.ones((1 << 16,), jnp.float32), d0)
    f_ew = jax.jit(elementwise)
    t_ew = best_time(lambda: f_ew(y))
    c_ew = jaxpr_cost(jax.make_jaxpr(elementwise)(y).jaxpr)

    def small_ops(z):
        return jax.lax.scan(lambda c, _: (jnp.sin(c) * 1.01 + 0.1, None), z, None, length=256)[0]

    z = jax.device_put(jnp.ones((8,), jnp.float32), d0)
    f_op = jax.jit(small_ops)
    t_op = best_time(lambda: f_op(z))
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
        t_g = best_time(lambda: f_g(xs))
        speedup[str(g)] = g * t_mm / t_g
        zs = jax.device_put(jnp.ones((g * 8,), jnp.float32), NamedSharding(mesh, P("d")))
        f_t = jax.jit(jax.shard_map(small_ops, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        trip_s[str(g)] = max(1e-9, best_time(lambda: f_t(zs)) / c_op["trips"])

        def psums(b):
            return jax.lax.scan(lambda c, _: (jax.lax.psum(c, "d") * 0.1 + c * 0.5, None), b, None, length=64)[0]

        f_c = jax.jit(jax.shard_map(psums, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
        collective_s[str(g)] = max(0.0, best_time(lambda: f_c(zs)) / 64 - trip_s[str(g)])

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
            per_call[leaves] = best_time(lambda: _chain(f_s, xs, 32)) / 32
        stage_leaf_s[str(g)] = max(0.0, (per_call[16] - per_call[1]) / 15)
        stage_call_s[str(g)] = max(1e-7, per_call[1] - stage_leaf_s[str(g)])
        if nd > 1:
            put_leaf_s[str(g)] = best_time(lambda: [jax.device_put(x, dst) for x in xs]) / len(xs)

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
        t_ps = best_time(lambda: f_ps(v))
        coll_bps = 2 * (nd - 1) / nd * m * 4 / t_ps
        w = jax.device_put(jnp.ones((1 << 20,), jnp.float32), devices[0])
        t_tr = best_time(lambda: jax.device_put(w, devices[-1]))
        transfer_bps = w.nbytes / t_tr

    def host_round_trip(b):
        return jax.pure_callback(lambda c: np.asarray(c) + 1, jax.ShapeDtypeStruct(b.shape, b.dtype), b)

    f_h = jax.jit(host_round_trip)
    t_h = best_time(lambda: f_h(a))
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
        return {"x": [jnp.zeros((2,), jnp.float32) for _ in range(self.leaves)]}

    def iteration(self, state):
        xs = _tiny_step(state["x"])
        return {"x": xs}, {f"m{i}": xs[i % self.leaves][0] for i in range(self.metrics)}


@fragment(role="learner", in_axes=(None,), out_axes=(None,))
def _tiny_step(xs):
    return [x + 1 for x in xs]


def _fragc_dispatch_s(device: Any) -> tuple[float, float, float]:
    """What one more dispatch costs a fragc program through `Program.run` (its Python driver, the program's
    launch with its arguments, the metrics' fetch and slicing): tiny programs of (state leaves, metrics) =
    (1, 1), (33, 1), (1, 9), each run with k=1 and with k=32 -> (seconds per dispatch, per state leaf, per
    metric). The difference of k=1 and k=32 over the dispatches saved is the cost of a dispatch."""
    def per_dispatch(leaves: int, metrics: int) -> float:
        per = {}
        for k in (1, 32):
            prog = build(_Tiny(leaves, metrics), CompileOptions("single", [device], iterations_per_dispatch=k))
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


def default_memory_limit(devices: Sequence[Any]) -> int | None:
    """The device's own memory limit where it reports one (GPU), else None (CPU: no limit)."""
    try:
        stats = devices[0].memory_stats()
    except Exception:
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def machine_constants(devices: Sequence[Any], group_sizes: Sequence[int] = (), cache: bool = True) -> Machine:
    """`measure_machine`, cached on disk per device kind and count. It measures the group sizes of the default
    space (`group_sizes_of`) and any other asked for, so that every search on these devices reads the same
    file; a size the file lacks measures again (all of them) and rewrites it."""
    n = len(devices)
    sizes = sorted(set(group_sizes_of(n)) | {g for g in group_sizes if 1 <= g <= n})
    key = {"kind": devices[0].device_kind, "platform": devices[0].platform, "count": n, "jax": jax.__version__,
           "v": 5}
    if devices[0].platform == "cpu":  # the constants depend on the threads XLA runs a program on
        key["threads"] = cpu_threads.threads()
    path = os.path.join(cache_folder(), f"machine-{digest(key)}.json")
    if cache and (d := read_json(path)):
        try:
            m = Machine(**d)
            if {str(g) for g in sizes if g > 1} <= set(m.speedup):
                return m
            sizes = sorted(set(sizes) | {int(g) for g in m.speedup})
        except TypeError:
            pass
    m = measure_machine(devices, sizes)
    if cache:
        write_json(path, dataclasses.asdict(m))
    return m
