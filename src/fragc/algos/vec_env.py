"""The interface every vector environment backend gives (`VecEnv`, `Runner`, `Step`), the backends' names, and
`VecEnv(name)`'s choice among the backends registered (`IMPLEMENTATIONS`). envs.py is the face: it holds the
gymnax backend and loads host_envs.py's, so that `fragc.algos.envs.VecEnv(name)` makes any of them.

gymnax is imported only where a gymnax space is needed, never when this module is imported: importing gymnax starts
JAX's backend, after which CPU devices can no longer be simulated (src/fragc/algos/envs.py, `make`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fragc.ir.errors import FragcError

BACKENDS = {
    "gymnax": "JAX environments stepped on the device inside the rollout (the default: a bare id is gymnax)",
    "gymnasium": "any Gymnasium id, a vector env stepped on the host CPU (synchronous, autoreset SAME_STEP)",
    "gymnasium_async": "the same with one worker process per env, shared memory (AsyncVectorEnv, spawned workers)",
    "envpool": "EnvPool's C++ pool stepped on the host CPU (synchronous)",
    "jaxmarl": "JaxMARL's multi-agent environments (MPE_*, SMAX_<map>) stepped on the device, agents stacked over an "
               "axis after the environment axis (ippo, mappo)",
    "craftax": "Craftax (Craftax-Symbolic-v1, Craftax-Classic-Symbolic-v1, ...) stepped on the device",
    "jumanji": "Jumanji's environments with one discrete action (Snake-v1, Game2048-v1, ...) stepped on the device",
    "brax": "Brax's environments (ant, halfcheetah, hopper, ...; its default backend) stepped on the device",
    "playground": "MuJoCo Playground's MJX environments (CartpoleBalance, CheetahRun, ...) stepped on the device",
    "pgx": "pgx's two-player board games (connect_four, tic_tac_toe, othello, go_9x9, ...) stepped on the device, "
           "for search (alphazero)",
}

_EXTRAS = {"envpool": ("envpool", "host"), "jaxmarl": ("jaxmarl", "marl"), "pgx": ("pgx", "search"),
           "craftax": ("craftax", "craftax"), "jumanji": ("jumanji", "jumanji"), "brax": ("brax", "brax"),
           "playground": ("mujoco_playground", "playground")}
"""Backend -> (the module it needs beyond fragc's dependencies, fragc's extra that installs it)."""

IMPLEMENTATIONS: dict[str, type] = {}
"""Backend -> the `VecEnv` subclass that steps its environments (envs.py registers gymnax's, host_envs.py each host
pool's: `VecEnv(name)` chooses from here)."""


def backend_summary(backend: str) -> str:
    """What `fragc envs` says of a backend, and whether it can be used here."""
    module, extra = _EXTRAS.get(backend, (None, None))
    if module is not None and importlib.util.find_spec(module) is None:
        return f"{BACKENDS[backend]}; not installed: pip install 'fragc[{extra}]'"
    return BACKENDS[backend]


def split_env_name(name: str) -> tuple[str, str]:
    """`"gymnasium:CartPole-v1"` -> `("gymnasium", "CartPole-v1")`; a bare id is gymnax."""
    backend, sep, env_id = name.partition(":")
    if not sep:
        return "gymnax", name
    if backend not in BACKENDS:
        raise FragcError(f"unknown environment backend '{backend}' in '{name}'; backends: {', '.join(BACKENDS)}")
    if not env_id:
        raise FragcError(f"environment '{name}' names no id after '{backend}:'")
    return backend, env_id


@struct.dataclass
class Runner:
    """Per-environment state, batched over environments (axis 0)."""

    env_state: Any  # gymnax: the environments' states; host backends: each environment's index in the host pool
    obs: jax.Array
    key: jax.Array  # one PRNG key per environment
    episode_return: jax.Array  # running return of the current episode
    last_return: jax.Array  # return of the last completed episode
    has_return: jax.Array  # whether an episode has completed yet
    episode_length: jax.Array  # int32: steps of the current episode so far
    last_length: jax.Array  # int32: steps of the last completed episode


@struct.dataclass
class Step:
    """What one vectorised step produced, per environment."""

    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array  # the observation reached, before any reset
    episode_done: jax.Array
    score: jax.Array | None = None  # what the episode statistics count: an Atari game's own unclipped score
    game_over: jax.Array | None = None  # where the statistics' episode ends: an Atari game's end, not a life's
    # (None, as a user's environment may leave them: the reward, and episode_done)

    def counted(self) -> tuple[jax.Array, jax.Array]:
        """(what the episode statistics count this step, where their episode ends)."""
        return (self.reward if self.score is None else self.score,
                self.episode_done if self.game_over is None else self.game_over)


class VecEnv:
    """`num_envs` copies of an environment, stepped together; `VecEnv(name)` makes the named backend's.

    The interface every backend gives: `action_space` and `is_discrete()` (gymnax spaces, whatever the
    backend), `obs_size` (observations are flattened to float32; `obs_shape` and `obs_dtype` say what they
    were), `reset(key, num_envs) -> Runner` and
    `step(runner, action, step_keys) -> (Runner, Step)`, both callable inside a jitted function.
    """

    def __new__(cls, name: str, *args: Any, **kwargs: Any) -> "VecEnv":
        if cls is VecEnv:
            cls = IMPLEMENTATIONS[split_env_name(name)[0]]
        return super().__new__(cls)

    name: str
    action_space: Any  # a gymnax space, whatever the backend
    on_host: bool = False
    """Whether `step` runs on the host (a host call in the rollout) rather than on the device."""

    @property
    def obs_size(self) -> int:
        return int(np.prod(self.obs_shape))

    @property
    def obs_shape(self) -> tuple[int, ...]:
        """One observation's shape as the environment makes it (frames: 3 axes), before it is flattened."""
        raise NotImplementedError

    @property
    def obs_dtype(self) -> np.dtype:
        """The dtype an algorithm keeps observations in as frames: uint8 for 8-bit frames (Atari's), else
        float32 (src/fragc/algos/networks.py, `Observations`)."""
        return np.dtype(np.float32)

    def is_discrete(self) -> bool:
        from gymnax.environments import spaces  # gymnax starts JAX's backend when imported: see the module docstring

        return isinstance(self.action_space, spaces.Discrete)

    @property
    def max_episode_steps(self) -> int | None:
        """The environment's time limit: no episode lasts longer (None: the backend sets none)."""
        raise NotImplementedError

    def reset(self, key: jax.Array, num_envs: int) -> Runner:
        return self.reset_each(jax.random.split(key, num_envs), jnp.arange(num_envs, dtype=jnp.int32))

    def reset_each(self, keys: jax.Array, index: jax.Array) -> Runner:
        """Reset one environment per key: `keys[n]`, and `index[n]` (int32) the environments' places in
        the backend's pool (a host pool's environments are named by index; gymnax's need none).
        `reset(key, n)` is `reset_each(jax.random.split(key, n), jnp.arange(n))`."""
        raise NotImplementedError

    def step(self, runner: Runner, action: jax.Array, step_keys: jax.Array | None = None) -> tuple[Runner, Step]:
        """One step of every environment. `step_keys`: the keys of this step, when the caller split them
        from `runner.key` already (then `runner.key` is carried as is); by default split here."""
        raise NotImplementedError

    @staticmethod
    def _keys(runner: Runner, step_keys: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        """(keys of this step, keys carried to the next)."""
        if step_keys is None:
            step_keys, carry_keys = jax.vmap(jax.random.split, out_axes=1)(runner.key)
            return step_keys, carry_keys
        return step_keys, runner.key

    @staticmethod
    def _advance(runner: Runner, env_state: Any, obs: jax.Array, carry_keys: jax.Array, reward: jax.Array,
                 terminated: jax.Array, truncated: jax.Array, final_obs: jax.Array, score: jax.Array | None = None,
                 game_over: jax.Array | None = None) -> tuple[Runner, Step]:
        """The runner after a step (episode statistics updated) and what the step produced.

        The statistics count `score` until `game_over` where the environment gives them (an Atari game
        under episodic life and reward clipping: the unclipped score of the whole game, as the references
        report it), else the reward until the episode ends."""
        reward = reward.astype(jnp.float32)
        done = jnp.logical_or(terminated, truncated)
        ends = done if game_over is None else game_over
        score = reward if score is None else score.astype(jnp.float32)
        episode_return = runner.episode_return + score
        episode_length = runner.episode_length + 1
        runner = Runner(
            env_state=env_state,
            obs=obs,
            key=carry_keys,
            episode_return=jnp.where(ends, 0.0, episode_return),
            last_return=jnp.where(ends, episode_return, runner.last_return),
            has_return=runner.has_return | ends,
            episode_length=jnp.where(ends, 0, episode_length),
            last_length=jnp.where(ends, episode_length, runner.last_length),
        )
        return runner, Step(reward, terminated, truncated, final_obs, done, score, ends)

    @staticmethod
    def _new_runner(env_state: Any, obs: jax.Array, carry_keys: jax.Array) -> Runner:
        zeros = jnp.zeros((obs.shape[0],), jnp.float32)
        counts = jnp.zeros((obs.shape[0],), jnp.int32)
        return Runner(env_state, obs, carry_keys, zeros, zeros, jnp.zeros((obs.shape[0],), bool), counts, counts)

    @staticmethod
    def _flat(obs: jax.Array) -> jax.Array:
        return obs.reshape(obs.shape[0], -1).astype(jnp.float32)


def to_gymnax_space(space: Any, env_name: str) -> Any:
    """A Gymnasium space as the gymnax space the algorithms read (gymnax spaces pass through)."""
    from gymnax.environments import spaces  # gymnax starts JAX's backend when imported: see the module docstring

    if isinstance(space, (spaces.Discrete, spaces.Box)):
        return space
    if isinstance(space, gymnasium.spaces.Discrete):
        if int(space.start) != 0:
            raise FragcError(f"{env_name}: discrete actions must start at 0, this space starts at {space.start}")
        return spaces.Discrete(int(space.n))
    if isinstance(space, gymnasium.spaces.Box):
        return spaces.Box(np.asarray(space.low, np.float32), np.asarray(space.high, np.float32), space.shape,
                          jnp.float32)
    raise FragcError(f"{env_name}: action space {type(space).__name__} is not supported (Discrete or Box)")
