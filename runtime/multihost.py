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
from jax.sharding import Sharding


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
    from jax.experimental import multihost_utils

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
