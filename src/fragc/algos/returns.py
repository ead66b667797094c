"""Returns computed backwards over a trajectory: GAE (PPO, A2C, IPPO, MAPPO) and V-trace (IMPALA).

Both take [T, N] arrays (IPPO's [T, N, A]) and stop their traces at episode ends. A terminated step does not
bootstrap; a truncated one bootstraps from the value of the state it reached.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


def gae(traj: Any, gamma: float, lam: float) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets of a trajectory with `reward`, `value`, `next_value`, `terminated`, `done`."""
    not_terminated = 1.0 - traj.terminated.astype(jnp.float32)
    not_done = 1.0 - traj.done.astype(jnp.float32)
    deltas = traj.reward + gamma * traj.next_value * not_terminated - traj.value

    def backward(carry: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta, keep = x
        carry = delta + gamma * lam * keep * carry
        return carry, carry

    # [T, N]: unrolled 16 steps a trip, as PureJaxRL's: the same operations and bits, an eighth of the loop's trips.
    # The agents' [T, N, A] keep the loop: unrolled, XLA fuses their multiply-adds otherwise and the last bits move.
    unroll = 16 if deltas.ndim == 2 else 1
    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, not_done), reverse=True, unroll=unroll)
    return advantages, advantages + traj.value


@dataclasses.dataclass(frozen=True)
class VTrace:
    vs: jax.Array  # value targets v_s
    pg_advantages: jax.Array  # rho_s (r_s + gamma_s v_{s+1} - V(x_s))


def vtrace(log_rhos: jax.Array, rewards: jax.Array, values: jax.Array, next_values: jax.Array,
           terminated: jax.Array, done: jax.Array, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0) -> VTrace:
    """V-trace targets (Espeholt et al. 2018).

    log_rhos: log pi(a|x) - log mu(a|x), target minus behaviour.
    next_values: V(x_{t+1}) of the state each step reached (before any reset).
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
