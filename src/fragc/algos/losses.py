"""The actor-critics' losses, and one gradient step (PPO, A2C, IMPALA, PQN; IPPO and MAPPO through PPO's update)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

import fragc
from fragc.algos.diagnostics import approx_kl, clip_fraction, lr_metric


def value_loss(value: jax.Array, targets: jax.Array, old_value: jax.Array | None = None,
               clip_eps: Any = None) -> jax.Array:
    """Half the mean squared error of the values against their targets; with `clip_eps`, each value update clipped
    to `clip_eps` around the rollout's `old_value` (PureJaxRL's, the pessimistic of the two errors)."""
    if clip_eps is None:
        return 0.5 * jnp.mean((value - targets) ** 2)
    value_clipped = old_value + jnp.clip(value - old_value, -clip_eps, clip_eps)
    return 0.5 * jnp.mean(jnp.maximum((value - targets) ** 2, (value_clipped - targets) ** 2))


def clipped_surrogate(log_prob: jax.Array, old_log_prob: jax.Array, advantages: jax.Array,
                      clip_eps: Any) -> tuple[jax.Array, dict]:
    """PPO's clipped objective on normalised advantages (as a loss), and its diagnostics (approximate KL, the
    fraction of ratios clipped)."""
    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    loss = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv))
    return loss, {"approx_kl": approx_kl(log_ratio), "clip_fraction": clip_fraction(ratio, clip_eps)}


def policy_gradient(log_prob: jax.Array, advantages: jax.Array) -> jax.Array:
    """The policy-gradient loss -E[log pi(a|s) A], the advantages held constant (A2C's, IMPALA's)."""
    return -jnp.mean(log_prob * jax.lax.stop_gradient(advantages))


def gradient_step(learner: Any, loss: Any, batch: tuple, tx: optax.GradientTransformation,
                  lr: Any = None) -> tuple[Any, dict]:
    """One step of `tx` on the gradient of `loss(params, *batch) -> (loss, metrics)`, averaged over the learner's
    replicas -> (`learner` after it, the metrics with the learning rate `lr` of the step, where it is known)."""
    grads, metrics = jax.grad(loss, has_aux=True)(learner.params, *batch)
    metrics = {**metrics, **lr_metric(lr, learner.opt_state)}
    return apply_gradients(learner, fragc.pmean(grads), tx), metrics


def apply_gradients(learner: Any, grads: Any, tx: optax.GradientTransformation) -> Any:
    """`learner` (with `params` and `opt_state`) after one step of `tx` on `grads`."""
    updates, opt_state = tx.update(grads, learner.opt_state, learner.params)
    return learner.replace(params=optax.apply_updates(learner.params, updates), opt_state=opt_state)
