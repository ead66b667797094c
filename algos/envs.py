"""Vectorised environments behind one interface, chosen by name: `VecEnv(name)`.

A name is `BACKEND:ID` or a bare gymnax id (`BACKENDS` lists the backends, `fragc envs` prints them):

- `CartPole-v1` (or `gymnax:CartPole-v1`): a gymnax environment, stepped on the device inside the rollout;
- `gymnasium:CartPole-v1`: a Gymnasium vector environment stepped on the host (algos/host_envs.py);
  `gymnasium_async:CartPole-v1` the same with a worker process per environment;
- `envpool:Pong-v5`: an EnvPool pool stepped on the host (`pip install 'fragc[host]'`).

Every backend auto-resets and keeps episode statistics the same way: `VecEnv.step` returns the
observation after an automatic reset together with the true next observation (`final_obs`), so an
algorithm can bootstrap a time-limit truncation from the value of the state it really reached; the
algorithms' rollout code is the same for every backend.
"""

from __future__ import annotations

import difflib
import types
from typing import Any

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
}

_EXTRAS = {"envpool": "envpool"}  # backend -> the module it needs beyond fragc's dependencies


def backend_summary(backend: str) -> str:
    """What `fragc envs` says of a backend, and whether it can be used here."""
    import importlib.util

    module = _EXTRAS.get(backend)
    if module is not None and importlib.util.find_spec(module) is None:
        return f"{BACKENDS[backend]}; not installed: pip install 'fragc[host]'"
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


_RENDERING_ONLY = ("seaborn", "matplotlib.pyplot")
"""What gymnax's environment modules import at the top for their renderers only: about 1 s of every `fragc`
process's start (seaborn brings scipy.stats and pandas), for code that training never runs."""


class _OnFirstUse(types.ModuleType):
    """Stands in for a module while gymnax imports; the real module is imported the first time one of its
    attributes is read (a renderer), and the stand-in takes on its contents. (The standard library's
    `importlib.util.LazyLoader` cannot do this on Python 3.11: the import statement itself reads the
    module's `__spec__`, which loads it.)"""

    def __getattr__(self, attr: str) -> Any:
        import importlib
        import sys

        if attr.startswith("__") and attr.endswith("__"):  # `hasattr(module, "__file__")` and the like
            raise AttributeError(attr)
        if sys.modules.get(self.__name__) is self:  # read while gymnax imports: not itself, but the module
            del sys.modules[self.__name__]
        real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def _import_gymnax() -> Any:
    """gymnax, without importing `_RENDERING_ONLY` until a renderer uses them. The stand-ins live in
    `sys.modules` only while gymnax imports, so everything else imports the real modules."""
    import sys

    if "gymnax" in sys.modules:
        return sys.modules["gymnax"]
    stand_ins = {name: _OnFirstUse(name) for name in _RENDERING_ONLY if name not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        import gymnax
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
    return gymnax


def env_names() -> list[str]:
    return list(_import_gymnax().registered_envs)


def make(name: str) -> tuple[Any, Any]:
    """`gymnax.make` with a clear error (and the closest name) for unknown ids.

    gymnax is imported here, not at module level: importing it starts JAX's
    backend, after which CPU devices can no longer be simulated.
    """
    gymnax = _import_gymnax()

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

    env_state: Any  # gymnax: the environments' states; host backends: each environment's index in the host pool
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
    """`num_envs` copies of an environment, stepped together; `VecEnv(name)` makes the named backend's.

    The interface every backend gives: `action_space` and `is_discrete()` (gymnax spaces, whatever the
    backend), `obs_size` (observations are flattened to float32), `reset(key, num_envs) -> Runner` and
    `step(runner, action, step_keys) -> (Runner, Step)`, both callable inside a jitted function.
    """

    def __new__(cls, name: str, *args: Any, **kwargs: Any) -> "VecEnv":
        if cls is VecEnv:
            backend, _ = split_env_name(name)
            if backend == "gymnax":
                cls = GymnaxVecEnv
            else:
                from fragc.algos.host_envs import HostVecEnv

                cls = HostVecEnv
        return super().__new__(cls)

    name: str
    on_host: bool = False
    """Whether `step` runs on the host (a host call in the rollout) rather than on the device."""

    @property
    def action_space(self) -> Any:
        raise NotImplementedError

    @property
    def obs_size(self) -> int:
        raise NotImplementedError

    def is_discrete(self) -> bool:
        from gymnax.environments import spaces

        return isinstance(self.action_space, spaces.Discrete)

    @property
    def max_episode_steps(self) -> int | None:
        """The environment's time limit: no episode lasts longer (None: the backend sets none)."""
        raise NotImplementedError

    def reset(self, key: jax.Array, num_envs: int) -> Runner:
        raise NotImplementedError

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
                 terminated: jax.Array, truncated: jax.Array, final_obs: jax.Array) -> tuple[Runner, Step]:
        """The runner after a step (episode statistics updated) and what the step produced."""
        reward = reward.astype(jnp.float32)
        done = jnp.logical_or(terminated, truncated)
        episode_return = runner.episode_return + reward
        runner = Runner(
            env_state=env_state,
            obs=obs,
            key=carry_keys,
            episode_return=jnp.where(done, 0.0, episode_return),
            last_return=jnp.where(done, episode_return, runner.last_return),
            has_return=runner.has_return | done,
        )
        return runner, Step(reward, terminated, truncated, final_obs, done)

    @staticmethod
    def _new_runner(env_state: Any, obs: jax.Array, carry_keys: jax.Array) -> Runner:
        zeros = jnp.zeros((obs.shape[0],), jnp.float32)
        return Runner(env_state, obs, carry_keys, zeros, zeros, jnp.zeros((obs.shape[0],), bool))

    @staticmethod
    def _flat(obs: jax.Array) -> jax.Array:
        return obs.reshape(obs.shape[0], -1).astype(jnp.float32)


def to_gymnax_space(space: Any, env_name: str) -> Any:
    """A Gymnasium space as the gymnax space the algorithms read (gymnax spaces pass through)."""
    import gymnasium
    from gymnax.environments import spaces

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


class GymnaxVecEnv(VecEnv):
    """A gymnax environment vectorised over `num_envs` copies, stepped on the device."""

    def __init__(self, name: str):
        self.name = name
        _, env_id = split_env_name(name)
        # Algorithms make their environment on first use, which may be inside a trace (`jax.eval_shape`
        # of `init`); evaluate the environment's constants eagerly so no tracer leaks into them.
        with jax.ensure_compile_time_eval():
            self.env, self.params = make(env_id)

    @property
    def action_space(self) -> Any:
        return self.env.action_space(self.params)

    @property
    def obs_size(self) -> int:
        shape = self.env.observation_space(self.params).shape
        return int(np.prod(shape)) if shape else 1

    @property
    def max_episode_steps(self) -> int:
        return int(self.params.max_steps_in_episode)

    def reset(self, key: jax.Array, num_envs: int) -> Runner:
        return self.reset_each(jax.random.split(key, num_envs))

    def reset_each(self, keys: jax.Array, index: jax.Array | None = None) -> Runner:
        reset_keys, carry_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
        obs, env_state = jax.vmap(self.env.reset, in_axes=(0, None))(reset_keys, self.params)
        return self._new_runner(env_state, self._flat(obs), carry_keys)

    def step(self, runner: Runner, action: jax.Array, step_keys: jax.Array | None = None) -> tuple[Runner, Step]:
        step_keys, carry_keys = self._keys(runner, step_keys)
        obs, env_state, reward, terminated, truncated, info = jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(
            step_keys, runner.env_state, action, self.params
        )
        return self._advance(runner, env_state, self._flat(obs), carry_keys, reward, terminated, truncated,
                             self._flat(info["final_observation"]))


def discrete_env(name: str, algo: str, hint: str = "") -> "VecEnv":
    """`VecEnv(name)` for an algorithm that needs discrete actions; another action space is refused in one
    line naming `algo` (and `hint`, e.g. the algorithm to use instead)."""
    env = VecEnv(name)
    if not env.is_discrete():
        raise FragcError(f"{algo} supports discrete action spaces; {name} has {type(env.action_space).__name__}{hint}")
    return env
