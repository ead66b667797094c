"""IMPALA: actor-critic with V-trace off-policy correction (Espeholt et al. 2018).

The actors may act with older parameters than the learner's (under
`actor_learner_async` they are one iteration stale); V-trace corrects the
value targets and the policy gradient with truncated importance weights.
Data collection is PPO's `rollout` fragment, learning one gradient step per
rollout as in A2C, with V-trace in place of GAE.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

import fragc
from fragc.algos import a2c, ppo
from fragc.algos.diagnostics import explained_variance


@dataclasses.dataclass(frozen=True)
class Config(a2c.Config):
    rho_bar: float = 1.0
    """Truncation of the importance weights in the TD errors and the policy gradient."""
    c_bar: float = 1.0
    """Truncation of the trace-cutting importance weights."""
    vtrace_lambda: float = 1.0
    """Lambda of V-trace's traces (1.0: the paper's V-trace)."""


@dataclasses.dataclass(frozen=True)
class VTrace:
    vs: jax.Array  # value targets v_s
    pg_advantages: jax.Array  # rho_s (r_s + gamma_s v_{s+1} - V(x_s))


def vtrace(log_rhos: jax.Array, rewards: jax.Array, values: jax.Array, next_values: jax.Array,
           terminated: jax.Array, done: jax.Array, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0) -> VTrace:
    """V-trace targets over [T, N] arrays, computed backwards in time.

    log_rhos: log pi(a|x) - log mu(a|x), target minus behaviour.
    next_values: V(x_{t+1}) of the state each step reached (before any reset).
    A terminated step does not bootstrap; at any episode end the trace stops.
    """
    rhos = jnp.exp(log_rhos)
    clipped_rhos = jnp.minimum(rho_bar, rhos)
    cs = lam * jnp.minimum(c_bar, rhos)
    discounts = gamma * (1.0 - terminated.astype(jnp.float32))
    keep = 1.0 - done.astype(jnp.float32)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)

    def backward(acc: jax.Array, x: tuple) -> tuple[jax.Array, jax.Array]:
        delta, discount, c, k = x
        acc = delta + discount * c * k * acc
        return acc, acc

    _, diffs = jax.lax.scan(backward, jnp.zeros_like(values[0]), (deltas, discounts, cs, keep), reverse=True)
    vs = values + diffs
    # v_{s+1}: the next target within the episode, else the bootstrap value of the state reached
    vs_next = jnp.concatenate([vs[1:], next_values[-1:]], axis=0)
    vs_next = jnp.where(done, next_values, vs_next)
    pg_advantages = clipped_rhos * (rewards + discounts * vs_next - values)
    return VTrace(jax.lax.stop_gradient(vs), jax.lax.stop_gradient(pg_advantages))


class IMPALA(a2c.A2C):
    """Importance-weighted actor-learner architecture, synchronous or pipelined by the policy."""

    def __init__(self, config: Config = Config()):
        super().__init__(config)

    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: ppo.Learner, traj: ppo.Transition) -> tuple[ppo.Learner, dict]:
        grads, (metrics, targets, values) = jax.grad(self._vtrace_loss, has_aux=True)(learner.params, traj)
        grads = fragc.pmean(grads)
        diagnostics = {**self.learning_rate(learner.opt_state),
                       "explained_variance": explained_variance(targets, values)}
        updates, opt_state = self.optimizer.update(grads, learner.opt_state, learner.params)
        learner = learner.replace(params=optax.apply_updates(learner.params, updates), opt_state=opt_state)
        return learner, {**fragc.pmean(metrics), **diagnostics}

    def _vtrace_loss(self, params: Any, traj: ppo.Transition) -> tuple[jax.Array, tuple[dict, jax.Array, jax.Array]]:
        """The loss, and beside it its metrics, the V-trace targets v_s and the values V(x_s) they are compared
        with (for the explained variance, over every replica's batch)."""
        c = self.config
        log_prob, entropy, values = self.evaluate(params, traj.obs, traj.action)  # [T, n] each
        _, next_values = self.apply_network(params, traj.next_obs)
        targets = vtrace(jax.lax.stop_gradient(log_prob) - traj.log_prob, traj.reward, jax.lax.stop_gradient(values),
                         jax.lax.stop_gradient(next_values), traj.terminated, traj.done, c.gamma, c.rho_bar, c.c_bar,
                         c.vtrace_lambda)
        entropy = jnp.mean(entropy)
        actor_loss = -jnp.mean(log_prob * targets.pg_advantages)
        value_loss = 0.5 * jnp.mean((values - targets.vs) ** 2)
        loss = actor_loss + c.vf_coef * value_loss - c.ent_coef * entropy
        rhos = jnp.exp(log_prob - traj.log_prob)
        metrics = {"loss": loss, "actor_loss": actor_loss, "value_loss": value_loss, "entropy": entropy,
                   "mean_rho": jnp.mean(rhos), "rho_clip_fraction": jnp.mean((rhos > c.rho_bar).astype(jnp.float32))}
        return loss, (metrics, targets.vs, jax.lax.stop_gradient(values))
