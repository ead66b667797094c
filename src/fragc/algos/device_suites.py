"""The environment suites JAX RL trains on, stepped on the device through their own packages: `craftax:ID`,
`jumanji:ID`, `brax:NAME` and `playground:NAME` (MuJoCo Playground).

Each is a `VecEnv` (vec_env.py) like gymnax's: batched over environments, stepped inside the rollout, and it keeps
the observation reached before an auto-reset (`final_obs`), so a truncated episode is bootstrapped from the state it
reached, not treated as terminal.
- **Craftax**: the suite's own auto-reset (`EnvironmentAutoReset.step`: `step_env`, then `reset_env` where done),
  written out here so the pre-reset observation is kept; an episode cut by `max_timesteps` is truncated.
- **Jumanji**: its `AutoResetWrapper(next_obs_in_extras=True)`; a last step with a nonzero discount is a
  truncation. Structured observations are flattened leaf by leaf; discrete action specs only.
- **Brax and Playground**: brax's `EpisodeWrapper` (its `truncation` info marks the time limit, `episode_length`
  1000), each environment reset from a fresh key where done (Playground's `full_reset`). Actions in [-1, 1].

Each suite is an extra (`pip install 'fragc[craftax]'`, ...); a missing one, an unknown id (with the closest), and
an environment an algorithm cannot take are refused in one line before compiling.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fragc.algos.vec_env import IMPLEMENTATIONS, Runner, Step, VecEnv, split_env_name
from fragc.ir.errors import FragcError

CRAFTAX_IDS = ("Craftax-Symbolic-v1", "Craftax-Pixels-v1", "Craftax-Classic-Symbolic-v1", "Craftax-Classic-Pixels-v1")


def suite_module(module: str, backend: str, extra: str) -> Any:
    """`module`, a suite's package: refused in one line, naming the extra, where it is not installed."""
    try:
        with jax.ensure_compile_time_eval():  # suites make arrays at import: concrete, even inside a trace
            return importlib.import_module(module)
    except ImportError as err:
        raise FragcError(f"{backend}: environments need {module.split('.')[0]}: pip install 'fragc[{extra}]'") from err


def known(backend: str, env_id: str, ids: Any) -> None:
    """Refuse an id the suite does not have, with the closest it has."""
    if env_id not in ids:
        close = difflib.get_close_matches(env_id, list(ids), n=1)
        raise FragcError(f"{backend}: unknown environment '{env_id}'" +
                         (f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(sorted(ids))}"))


def discrete(n: int) -> Any:
    from gymnax.environments import spaces  # gymnax starts JAX's backend when imported (vec_env.py)

    return spaces.Discrete(int(n))


def box(size: int) -> Any:
    from gymnax.environments import spaces

    return spaces.Box(-1.0, 1.0, (int(size),), jnp.float32)


def flat_leaves(obs: Any) -> jax.Array:
    """One environment's observation, every leaf flattened to float32 and concatenated (Jumanji's are structured)."""
    return jnp.concatenate([jnp.ravel(leaf).astype(jnp.float32) for leaf in jax.tree.leaves(obs)])


class SuiteVecEnv(VecEnv):
    """What the suites share: one environment's `reset_one(key) -> (obs, state)` and `step_one(key, state, action)
    -> (obs, state, reward, terminated, truncated, final_obs)`, vmapped over the runner's environments."""

    _obs_shape: tuple[int, ...]
    _time_limit: int | None

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return self._obs_shape

    @property
    def max_episode_steps(self) -> int | None:
        return self._time_limit

    def reset_one(self, key: jax.Array) -> tuple[jax.Array, Any]:
        raise NotImplementedError

    def step_one(self, key: jax.Array, state: Any, action: jax.Array) -> tuple:
        raise NotImplementedError

    def reset_each(self, keys: jax.Array, index: jax.Array | None = None) -> Runner:
        reset_keys, carry_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
        obs, env_state = jax.vmap(self.reset_one)(reset_keys)
        return self._new_runner(env_state, self._flat(obs), carry_keys)

    def step(self, runner: Runner, action: jax.Array, step_keys: jax.Array | None = None) -> tuple[Runner, Step]:
        step_keys, carry_keys = self._keys(runner, step_keys)
        obs, env_state, reward, terminated, truncated, final_obs = jax.vmap(self.step_one)(
            step_keys, runner.env_state, action)
        return self._advance(runner, env_state, self._flat(obs), carry_keys, reward, terminated, truncated,
                             self._flat(final_obs))


class CraftaxVecEnv(SuiteVecEnv):
    """`craftax:Craftax-Symbolic-v1` and the other three."""

    def __init__(self, name: str):
        self.name = name
        _, env_id = split_env_name(name)
        known("craftax", env_id, CRAFTAX_IDS)
        craftax_env = suite_module("craftax.craftax_env", "craftax", "craftax")
        with jax.ensure_compile_time_eval():
            self.env = craftax_env.make_craftax_env_from_name(env_id, auto_reset=True)
            self.params = self.env.default_params
        self.action_space = discrete(self.env.action_space(self.params).n)
        self._obs_shape = tuple(self.env.observation_space(self.params).shape)
        self._time_limit = int(self.params.max_timesteps)

    def reset_one(self, key: jax.Array) -> tuple[jax.Array, Any]:
        return self.env.reset(key, self.params)

    def step_one(self, key: jax.Array, state: Any, action: jax.Array) -> tuple:
        key_step, key_reset = jax.random.split(key)  # Craftax's EnvironmentAutoReset.step, the reached obs kept
        obs_st, state_st, reward, done, _ = self.env.step_env(key_step, state, action, self.params)
        obs_re, state_re = self.env.reset_env(key_reset, self.params)
        state = jax.tree.map(lambda x, y: jax.lax.select(done, x, y), state_re, state_st)
        truncated = done & (state_st.timestep >= self.params.max_timesteps)
        return jnp.where(done, obs_re, obs_st), state, reward, done & ~truncated, truncated, obs_st


class JumanjiVecEnv(SuiteVecEnv):
    """`jumanji:Snake-v1` and the other registered environments with one discrete action."""

    def __init__(self, name: str):
        self.name = name
        _, env_id = split_env_name(name)
        jumanji = suite_module("jumanji", "jumanji", "jumanji")
        wrappers = suite_module("jumanji.wrappers", "jumanji", "jumanji")
        known("jumanji", env_id, jumanji.registered_environments())
        with jax.ensure_compile_time_eval():
            self.env = wrappers.AutoResetWrapper(jumanji.make(env_id), next_obs_in_extras=True)
        spec = self.env.action_spec
        if not hasattr(spec, "num_values") or np.ndim(spec.num_values) != 0:
            raise FragcError(f"jumanji:{env_id} takes {type(spec).__name__} actions; fragc's algorithms take one "
                             "discrete action (DiscreteArray) or a Box")
        self.action_space = discrete(spec.num_values)
        obs = jax.eval_shape(lambda k: self.env.reset(k)[1].observation, jax.random.key(0))
        self._obs_shape = (sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(obs)),)
        self._time_limit = getattr(self.env.unwrapped, "time_limit", None)

    def reset_one(self, key: jax.Array) -> tuple[jax.Array, Any]:
        state, timestep = self.env.reset(_raw(key))
        return flat_leaves(timestep.observation), state

    def step_one(self, key: jax.Array, state: Any, action: jax.Array) -> tuple:
        state, timestep = self.env.step(state, action)  # its own keys live in its state
        last = timestep.last()
        terminated = last & (timestep.discount == 0)
        final_obs = flat_leaves(timestep.extras["next_obs"])
        return flat_leaves(timestep.observation), state, timestep.reward, terminated, last & ~terminated, final_obs


class BraxVecEnv(SuiteVecEnv):
    """`brax:ant` (Brax's environments, its default backend) and `playground:CartpoleBalance` (MuJoCo Playground's
    MJX environments), both in brax's `EpisodeWrapper`."""

    episode_length = 1000

    def __init__(self, name: str):
        self.name = name
        backend, env_id = split_env_name(name)
        if backend == "brax":
            envs = suite_module("brax.envs", "brax", "brax")
            known("brax", env_id, envs._envs)  # brax's registry has no public listing
            make: Callable[[], Any] = lambda: envs.get_environment(env_id)  # noqa: E731
        else:
            registry = suite_module("mujoco_playground", "playground", "playground").registry
            known("playground", env_id, registry.ALL_ENVS)
            make = lambda: load_playground(registry, env_id)  # noqa: E731
        training = suite_module("brax.envs.wrappers.training", backend, backend)
        with jax.ensure_compile_time_eval():
            self.env = training.EpisodeWrapper(make(), self.episode_length, action_repeat=1)
        obs = jax.eval_shape(lambda k: self.env.reset(k).obs, jax.random.key_data(jax.random.key(0)))
        if not isinstance(obs, jax.ShapeDtypeStruct):
            raise FragcError(f"{name}'s observations are a {type(obs).__name__}; fragc takes one array")
        self.action_space = box(self.env.action_size)
        self._obs_shape = tuple(obs.shape)
        self._time_limit = self.episode_length

    def reset_one(self, key: jax.Array) -> tuple[jax.Array, Any]:
        state = self.env.reset(_raw(key))
        return state.obs, state

    def step_one(self, key: jax.Array, state: Any, action: jax.Array) -> tuple:
        state = self.env.step(state, action)
        done = state.done > 0
        truncated = done & (state.info["truncation"] > 0)
        fresh = self.env.reset(_raw(key))  # where done: a new episode from a fresh key (Playground's full_reset)
        kept = jax.tree.map(lambda x, y: jnp.where(done, x, y), fresh, state)
        return kept.obs, kept, state.reward, done & ~truncated, truncated, state.obs


def load_playground(registry: Any, env_id: str) -> Any:
    """Playground's environment. Its locomotion and manipulation robots load mujoco_menagerie's assets, which
    Playground clones from the internet when they are missing: refused in one line instead, before any clone."""
    mjx_env = suite_module("mujoco_playground._src.mjx_env", "playground", "playground")
    if env_id not in registry.dm_control_suite.ALL_ENVS and not mjx_env.MENAGERIE_PATH.exists():
        raise FragcError(f"playground:{env_id}'s robot is in mujoco_menagerie, which is not installed "
                         f"({mjx_env.MENAGERIE_PATH}); Playground would clone it from the internet: clone "
                         "https://github.com/google-deepmind/mujoco_menagerie there, or use a DM Control Suite task")
    # MJX's JAX implementation: MuJoCo Warp's (Playground's default) keeps counters shared by the whole batch
    # (`nacon`), which no policy can split over replicas with the environments
    return registry.load(env_id, config_overrides={"impl": "jax"})


def _raw(key: jax.Array) -> jax.Array:
    """Brax's environments take raw uint32 keys."""
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


IMPLEMENTATIONS.update({"craftax": CraftaxVecEnv, "jumanji": JumanjiVecEnv, "brax": BraxVecEnv,
                        "playground": BraxVecEnv})
