"""PPO for continuous actions: a Gaussian policy with a state-independent log standard deviation.

Everything but the action distribution is `src/fragc/algos/ppo.py`'s: the same rollout
and learn fragments, GAE and clipped objective. Sampled actions are stored
unclipped (their log-probabilities are exact) and clipped to the action
space's bounds only for the environment.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fragc.algos import ppo
from fragc.algos.envs import single_agent_env
from fragc.ir.errors import FragcError


@dataclasses.dataclass(frozen=True)
class Config(ppo.Config):
    env: str = "Pendulum-v1"
    """Environment: a gymnax id, or BACKEND:ID for a host backend (fragc envs); continuous (Box) actions."""
    num_envs: int = 16
    """Environments stepped in parallel."""
    num_steps: int = 128
    """Steps per environment in one rollout."""
    total_steps: int = 1_000_000
    """Environment steps over the whole run."""
    lr: float = 1e-3
    """Adam learning rate (at the start, when annealed)."""
    update_epochs: int = 10
    """Passes over each rollout."""
    num_minibatches: int = 32
    """Minibatches per epoch."""
    gamma: float = 0.95
    """Discount factor (Pendulum's reward is dense; a shorter horizon learns faster)."""
    ent_coef: float = 0.0
    """Entropy bonus weight."""
    clip_value: bool = False
    """Clip each value update to `clip_eps` around the rollout's values; off by default here: Pendulum's returns
    are in the hundreds, and a critic held within 0.2 of its rollout values per update lags its targets
    (docs/results.md)."""
    network: str = "mlp"
    """mlp (or auto, the same): no pixel network for continuous actions yet."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.network not in ("auto", "mlp"):
            raise FragcError(f"ppo_continuous: network must be auto or mlp (no pixel network for continuous "
                             f"actions), got {self.network!r}")


class GaussianActorCritic(nn.Module):
    """MLPs for the action mean and the value; log std is a free parameter per action dimension."""

    action_dim: int
    hidden: int = 64
    activation: str = "tanh"

    def setup(self) -> None:
        self.actor = ppo.MLP(self.hidden, self.action_dim, 0.01, self.activation)
        self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        self.critic = ppo.MLP(self.hidden, 1, 1.0, self.activation)

    def __call__(self, obs: jax.Array) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        mean = self.actor(obs)
        return (mean, jnp.broadcast_to(self.log_std, mean.shape)), self.value(obs)

    def value(self, obs: jax.Array) -> jax.Array:
        return jnp.squeeze(self.critic(obs), -1)


def gaussian_log_prob(mean: jax.Array, log_std: jax.Array, x: jax.Array) -> jax.Array:
    z = (x - mean) / jnp.exp(log_std)
    return jnp.sum(-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), -1)


class PPOContinuous(ppo.PPO):
    """PPO with a diagonal Gaussian policy, for Box action spaces."""

    def __init__(self, config: Config = Config()):
        super().__init__(config)

    @functools.cached_property
    def env(self) -> Any:
        env = single_agent_env(self.config.env, "ppo_continuous")
        if env.is_discrete():
            raise FragcError(f"ppo_continuous supports continuous (Box) action spaces; {self.config.env} is discrete; "
                             "use ppo")
        return env

    network_name = "mlp"

    @functools.cached_property
    def network(self) -> GaussianActorCritic:
        return GaussianActorCritic(int(np.prod(self.env.action_space.shape)), self.config.hidden,
                                   self.config.activation)

    def act(self, params: Any, obs: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        (mean, log_std), value = self.network.apply(params, obs)
        noise = jax.vmap(lambda k, m: jax.random.normal(k, m.shape))(keys, mean)
        action = mean + jnp.exp(log_std) * noise
        return action, gaussian_log_prob(mean, log_std, action), value

    def evaluate(self, params: Any, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        (mean, log_std), value = self.network.apply(params, obs)
        entropy = jnp.sum(log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e), -1)
        return gaussian_log_prob(mean, log_std, action), entropy, value

    def env_action(self, action: jax.Array) -> jax.Array:
        space = self.env.action_space
        return jnp.clip(action, space.low, space.high).reshape((action.shape[0],) + tuple(space.shape))

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        """The Gaussian's mean for each of `obs[n, obs_size]`, clipped to the action space as `env_action` does."""
        (mean, _), _ = self.network.apply(params, obs)
        return self.env_action(mean)
