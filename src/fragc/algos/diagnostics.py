"""The diagnostics the algorithms log beside their losses (docs/metrics.md): CleanRL's PPO set and its equivalents.

Each is a small function of arrays the learn or rollout fragment already holds, so it costs a few reductions and
changes nothing the algorithm computes. Those over a whole batch (explained variance, episode statistics) reduce
over the fragment's replicas with `fragc.psum`, so that they mean the same under every policy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

import fragc
from fragc.algos.vec_env import Runner


def approx_kl(log_ratio: jax.Array) -> jax.Array:
    """CleanRL's estimate of KL(old || new) from log(pi_new / pi_old) of the sampled actions:
    mean((ratio - 1) - log ratio) (Schulman's k3 estimator: unbiased, never negative)."""
    return jnp.mean(jnp.expm1(log_ratio) - log_ratio)


def clip_fraction(ratio: jax.Array, clip: jax.Array | float) -> jax.Array:
    """The fraction of samples whose probability ratio lies outside [1 - clip, 1 + clip] (CleanRL's clipfrac)."""
    return jnp.mean((jnp.abs(ratio - 1.0) > clip).astype(jnp.float32))


def explained_variance(targets: jax.Array, values: jax.Array) -> jax.Array:
    """1 - var(targets - values) / var(targets) over every replica's batch (CleanRL's, on the returns and the
    rollout's values): 1 when the critic predicts the returns exactly, 0 when it does no better than their mean,
    negative when worse. 0 where the targets do not vary, where CleanRL logs NaN: a NaN metric stops a fragc run."""
    count = fragc.psum(jnp.float32(targets.size))
    errors = targets - values
    means = fragc.psum(jnp.stack([jnp.sum(targets), jnp.sum(errors)])) / count
    var_targets, var_errors = fragc.psum(jnp.stack([jnp.sum((targets - means[0]) ** 2),
                                                    jnp.sum((errors - means[1]) ** 2)])) / count
    return jnp.where(var_targets > 0, 1.0 - var_errors / jnp.where(var_targets > 0, var_targets, 1.0), 0.0)


def scheduled_lr(lr: Any, opt_state: Any) -> jax.Array | None:
    """The learning rate the optimizer's next update applies: `lr` itself, or the schedule `lr` at the step count
    of the optimizer's one `scale_by_schedule` state (what `optax.adam(schedule)` and its kin keep). None when the
    optimizer keeps no single such state (a user's own optimizer): its learning rate is then not known here."""
    if not callable(lr):
        return jnp.asarray(lr, jnp.float32)
    is_schedule = lambda s: isinstance(s, optax.ScaleByScheduleState)  # noqa: E731
    states = [s for s in jax.tree.leaves(opt_state, is_leaf=is_schedule) if is_schedule(s)]
    return jnp.asarray(lr(states[0].count), jnp.float32) if len(states) == 1 else None


def lr_metric(lr: Any, opt_state: Any) -> dict[str, jax.Array]:
    """`{"learning_rate": ...}` (`scheduled_lr`), or nothing where the learning rate is not known."""
    value = scheduled_lr(lr, opt_state)
    return {} if value is None else {"learning_rate": value}


def episode_metrics(runner: Runner) -> dict:
    """The mean return and length of each environment's last completed episode, over the environments of every
    replica that completed one (CleanRL's episodic_return and episodic_length)."""
    completed = fragc.psum(jnp.sum(runner.has_return))
    lengths = fragc.psum(jnp.sum(runner.last_length * runner.has_return)).astype(jnp.float32)
    return {"episode_return": fragc.psum(jnp.sum(runner.last_return * runner.has_return)) / jnp.maximum(completed, 1),
            "episode_length": lengths / jnp.maximum(completed, 1)}
