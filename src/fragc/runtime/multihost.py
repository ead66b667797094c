"""Moving values between the host and arrays that may span processes.

In a multi-process run (`jax.distributed`) an array on a global mesh has
shards this process cannot read, and `device_put` cannot send a value to
another process's devices. These helpers work the same in one process and in
many; where they gather across processes, every process must call them in the
same order (they run a collective).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from fragc.ir.errors import FragcError


def spans_processes(devices: Sequence[jax.Device]) -> bool:
    """Whether some of `devices` belong to another process."""
    me = jax.process_index()
    return any(d.process_index != me for d in devices)


def to_host(tree: Any) -> Any:
    """Every leaf's whole value on this host (numpy; PRNG keys stay keys, on a local device)."""
    return jax.tree.map(_leaf_to_host, tree)


def _leaf_to_host(x: Any) -> Any:
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return jax.device_get(x)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(_leaf_to_host(jax.random.key_data(x)), impl=jax.random.key_impl(x))
    if x.sharding.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def place(x: Any, sharding: Sharding) -> jax.Array:
    """`x` (a host value, or an array of the same value on every process) laid out as `sharding`.

    Within one process this is `device_put`; across processes each process
    builds its own shards from its host copy, so every process must pass the
    same value.
    """
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if x.sharding == sharding:
            return x
        x = _leaf_to_host(x)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(x)
        data = place(np.asarray(jax.random.key_data(x)), sharding)
        return jax.random.wrap_key_data(data, impl=impl)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index], dtype=host.dtype)


def halves_by_process(devices: Sequence[jax.Device]) -> list[jax.Device]:
    """`devices` reordered for Sebulba across processes: the first half of each process's devices (in process
    order), then the second halves. A policy that puts its actors on the first half of the program's devices
    and its learner on the second (`actor_learner`) then has actors and learner devices on every process,
    shard i of the actors on the process of shard i of the learner: each process steps its own host
    environments and feeds its own learner devices. Unchanged where the processes' counts are odd or differ."""
    by_process: dict[int, list[jax.Device]] = {}
    for d in devices:
        by_process.setdefault(d.process_index, []).append(d)
    counts = {len(ds) for ds in by_process.values()}
    if len(by_process) < 2 or len(counts) != 1 or counts.pop() % 2:
        return list(devices)
    half = len(devices) // len(by_process) // 2
    return [d for ds in by_process.values() for d in ds[:half]] + [d for ds in by_process.values() for d in ds[half:]]


def move_within_processes(x: jax.Array, sharding: Sharding, what: str = "a value") -> jax.Array:
    """`x` laid out as `sharding`, every shard copied to a device of the process that holds it: `device_put`
    within one process; across processes each process copies its own shards, so every destination shard
    must be one this process already holds (else a clear error: the value would have to cross processes)."""
    if x.is_fully_addressable and sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = move_within_processes(jax.random.key_data(x), _with_key_dims(sharding, x), what)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    held = {_index_key(s.index, x.shape): s.data for s in x.addressable_shards}
    shards = []
    for device, index in sharding.addressable_devices_indices_map(x.shape).items():
        source = held.get(_index_key(index, x.shape))
        if source is None:
            part = "[" + ", ".join(f"{a}:{b}" for a, b in _index_key(index, x.shape)) + "]"
            raise FragcError(f"{what} would cross processes (process {jax.process_index()} does not hold the part "
                             f"{part} that its device {device.id} receives): across processes a transfer moves "
                             "each process's own shards only; lay the groups out so that shard i of both lives on "
                             "one process (actor_learner does, with an even device count on every process)")
        shards.append(jax.device_put(source, device))
    return jax.make_array_from_single_device_arrays(x.shape, sharding, shards)


def _index_key(index: tuple, shape: tuple[int, ...]) -> tuple:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _with_key_dims(sharding: Sharding, key: jax.Array) -> Sharding:
    """`sharding` for a key array's data (one more trailing dimension, not split)."""
    extra = jax.random.key_data(key).ndim - key.ndim
    spec = tuple(sharding.spec) + (None,) * (key.ndim - len(sharding.spec) + extra)
    return NamedSharding(sharding.mesh, PartitionSpec(*spec))
