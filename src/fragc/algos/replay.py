"""An on-device replay buffer: `insert` a rollout, `sample` batches from it.

DQN and SAC call these from two fragments of role `buffer`, each with `BUFFER_AXES`. The buffer is a ring of time slots
batched over environments (axis 1: `[capacity per env, num_envs, ...]`), so a policy can keep it beside the actors or
beside the learner and split it over replicas like any other batched state: each replica holds its environments'
columns, inserts their transitions, and samples its share of every batch from them. A transition is any pytree whose
leaves have the environment axis first (`[num_envs, ...]` for one vector step); `Transition` is the usual one.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

import fragc


@struct.dataclass
class Transition:
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    next_obs: jax.Array  # the observation reached, before any reset
    terminated: jax.Array


@struct.dataclass
class Buffer:
    data: Any  # transitions, each leaf [capacity per env, num_envs, ...]
    position: jax.Array  # next time slot to write (replicated)
    size: jax.Array  # time slots written so far, at most the capacity


BUFFER_AXES = Buffer(1, None, None)
"""A buffer's environment axes: its transitions' (axis 1), the ring's position and size replicated."""


def empty(step: Any, buffer_size: int, num_envs: int) -> Buffer:
    """An empty buffer for transitions shaped like `step` (one vector step: arrays or `jax.ShapeDtypeStruct`s with
    the environment axis first); `buffer_size // num_envs` time slots per environment."""
    capacity = buffer_size // num_envs
    data = jax.tree.map(lambda x: jnp.zeros((capacity,) + tuple(x.shape), x.dtype), step)
    return Buffer(data, jnp.int32(0), jnp.int32(0))


def insert(buffer: Buffer, traj: Any) -> Buffer:
    """Write a rollout (`[num_steps, num_envs, ...]` leaves) at the next time slots, wrapping around."""
    capacity = jax.tree.leaves(buffer.data)[0].shape[0]
    steps = jax.tree.leaves(traj)[0].shape[0]
    slots = (buffer.position + jnp.arange(steps)) % capacity
    data = jax.tree.map(lambda d, x: d.at[slots].set(x), buffer.data, traj)
    return Buffer(data, (buffer.position + steps) % capacity, jnp.minimum(buffer.size + steps, capacity))


def sample(buffer: Buffer, key: jax.Array, batches: int, batch_size: int, num_envs: int) -> Any:
    """[batches, batch_size] transitions from written slots only; each replica samples its share of a batch from its
    own environments, with the key folded with its index (one key for every replica would draw the same slots of each
    replica's environments)."""
    local_envs = jax.tree.leaves(buffer.data)[0].shape[1]
    per_update = batch_size * local_envs // num_envs
    k_time, k_env = jax.random.split(fragc.fold_in_replica(key))
    shape = (batches, per_update)
    t = jax.random.randint(k_time, shape, 0, buffer.size)
    e = jax.random.randint(k_env, shape, 0, local_envs)
    return jax.tree.map(lambda d: d[t, e], buffer.data)
