"""Minibatches of a rollout: its steps flattened, shuffled and split (PPO's epochs, PQN's)."""

from __future__ import annotations

from typing import Any

import jax


def flatten_steps(tree: Any) -> Any:
    """Every leaf's time and environment axes [T, N, ...] as one axis of steps [T * N, ...]."""
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), tree)


def shuffled(key: jax.Array, batch: Any, num_minibatches: int) -> Any:
    """`batch` ([steps, ...] leaves) in a random order, split into `num_minibatches` [num_minibatches, steps / n,
    ...]."""
    perm = jax.random.permutation(key, jax.tree.leaves(batch)[0].shape[0])
    return jax.tree.map(lambda x: x[perm].reshape((num_minibatches, -1) + x.shape[1:]), batch)
