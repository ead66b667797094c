"""gymnax environments, vectorised, with auto-reset and episode statistics.

`VecEnv.step` returns the observation after an automatic reset together with
the true next observation (`final_obs`), so an algorithm can bootstrap a
time-limit truncation from the value of the state it really reached.
"""

from __future__ import annotations

import difflib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fragc.ir.errors import FragcError


def env_names() -> list[str]:
    import gymnax

    return list(gymnax.registered_envs)


def make(name: str) -> tuple[Any, Any]:
    """`gymnax.make` with a clear error (and the closest name) for unknown ids.

    gymnax is imported here, not at module level: importing it starts JAX's
    backend, after which CPU devices can no longer be simulated.
    """
    import gymnax

    if name not in gymnax.registered_envs:
        close = difflib.get_close_matches(name, gymnax.registered_envs, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(gymnax.registered_envs)}"
        raise FragcError(f"unknown environment '{name}'{hint}")
    try:
        return gymnax.make(name)
    except OSError as err:  # MNISTBandit-bsuite downloads its data set when made
        raise FragcError(f"environment '{name}' could not be made: {err}") from err


@struct.dataclass
class Runner:
    """Per-environment state, batched over environments (axis 0)."""

    env_state: Any
    obs: jax.Array
    key: jax.Array  # one PRNG key per environment
    episode_return: jax.Array  # running return of the current episode
    last_return: jax.Array  # return of the last completed episode
    has_return: jax.Array  # whether an episode has completed yet


@struct.dataclass
class Step:
    """What one vectorised step produced, per environment."""

    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array  # the observation reached, before any reset
    episode_done: jax.Array


class VecEnv:
    """A gymnax environment vectorised over `num_envs` copies."""

    def __init__(self, name: str):
        self.name = name
        # Algorithms make their environment on first use, which may be inside a trace (`jax.eval_shape`
        # of `init`); evaluate the environment's constants eagerly so no tracer leaks into them.
        with jax.ensure_compile_time_eval():
            self.env, self.params = make(name)

    @property
    def action_space(self) -> Any:
        return self.env.action_space(self.params)

    @property
    def obs_size(self) -> int:
        shape = self.env.observation_space(self.params).shape
        return int(np.prod(shape)) if shape else 1

    def is_discrete(self) -> bool:
        from gymnax.environments import spaces

        return isinstance(self.action_space, spaces.Discrete)

    def reset(self, key: jax.Array, num_envs: int) -> Runner:
        keys = jax.random.split(key, num_envs)
        reset_keys, carry_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
        obs, env_state = jax.vmap(self.env.reset, in_axes=(0, None))(reset_keys, self.params)
        zeros = jnp.zeros((num_envs,), jnp.float32)
        return Runner(env_state, self._flat(obs), carry_keys, zeros, zeros, jnp.zeros((num_envs,), bool))

    def step(self, runner: Runner, action: jax.Array, step_keys: jax.Array | None = None) -> tuple[Runner, Step]:
        """One step of every environment. `step_keys`: the keys of this step, when the caller split them
        from `runner.key` already (then `runner.key` is carried as is); by default split here."""
        if step_keys is None:
            step_keys, carry_keys = jax.vmap(jax.random.split, out_axes=1)(runner.key)
        else:
            carry_keys = runner.key
        obs, env_state, reward, terminated, truncated, info = jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(
            step_keys, runner.env_state, action, self.params
        )
        reward = reward.astype(jnp.float32)
        done = jnp.logical_or(terminated, truncated)
        episode_return = runner.episode_return + reward
        runner = Runner(
            env_state=env_state,
            obs=self._flat(obs),
            key=carry_keys,
            episode_return=jnp.where(done, 0.0, episode_return),
            last_return=jnp.where(done, episode_return, runner.last_return),
            has_return=runner.has_return | done,
        )
        final_obs = self._flat(info["final_observation"])
        return runner, Step(reward, terminated, truncated, final_obs, done)

    @staticmethod
    def _flat(obs: jax.Array) -> jax.Array:
        return obs.reshape(obs.shape[0], -1).astype(jnp.float32)
