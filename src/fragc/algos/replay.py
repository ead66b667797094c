"""An on-device replay buffer as two fragments of role `buffer`: `insert` a rollout, `sample` batches from it.

DQN and SAC take the `ReplayBuffer` mixin. The buffer is a ring of time slots
batched over environments (axis 1: `[capacity per env, num_envs, ...]`), so a
policy can keep it beside the actors or beside the learner and split it over
replicas like any other batched state: each replica holds its environments'
columns, inserts their transitions, and samples its share of every batch from
them. A transition is any pytree whose leaves have the environment axis first
(`[num_envs, ...]` for one vector step); `Transition` is the usual one.
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


class ReplayBuffer:
    """Mixin for an algorithm whose `config` has `num_envs`, `buffer_size` and `batch_size`, and which says how
    many batches one `sample` call draws (`batches_per_iteration`: its gradient steps per iteration)."""

    config: Any

    @property
    def batches_per_iteration(self) -> int:
        raise NotImplementedError

    def empty_buffer(self, step: Any) -> Buffer:
        """An empty buffer for transitions shaped like `step` (one vector step: arrays or `jax.ShapeDtypeStruct`s
        with the environment axis first); `buffer_size // num_envs` time slots per environment."""
        capacity = self.config.buffer_size // self.config.num_envs
        data = jax.tree.map(lambda x: jnp.zeros((capacity,) + tuple(x.shape), x.dtype), step)
        return Buffer(data, jnp.int32(0), jnp.int32(0))

    @fragc.fragment(role="buffer", in_axes=(Buffer(1, None, None), 1), out_axes=Buffer(1, None, None))
    def insert(self, buffer: Buffer, traj: Any) -> Buffer:
        """Write a rollout (`[num_steps, num_envs, ...]` leaves) at the next time slots, wrapping around."""
        capacity = jax.tree.leaves(buffer.data)[0].shape[0]
        steps = jax.tree.leaves(traj)[0].shape[0]
        slots = (buffer.position + jnp.arange(steps)) % capacity
        data = jax.tree.map(lambda d, x: d.at[slots].set(x), buffer.data, traj)
        return Buffer(data, (buffer.position + steps) % capacity, jnp.minimum(buffer.size + steps, capacity))

    @fragc.fragment(role="buffer", in_axes=(Buffer(1, None, None), None), out_axes=1)
    def sample(self, buffer: Buffer, key: jax.Array) -> Any:
        """[batches_per_iteration, batch] transitions from written slots only; each replica samples its share of
        the batch from its own environments, with the key folded with its index (one key for every replica would
        draw the same slots of each replica's environments)."""
        c = self.config
        local_envs = jax.tree.leaves(buffer.data)[0].shape[1]
        per_update = c.batch_size * local_envs // c.num_envs
        k_time, k_env = jax.random.split(fragc.fold_in_replica(key))
        shape = (self.batches_per_iteration, per_update)
        t = jax.random.randint(k_time, shape, 0, buffer.size)
        e = jax.random.randint(k_env, shape, 0, local_envs)
        return jax.tree.map(lambda d: d[t, e], buffer.data)
