"""Vectorised environments behind one interface, chosen by name: `VecEnv(name)`.

A name is `BACKEND:ID` or a bare gymnax id (`BACKENDS` lists the backends, `fragc envs` prints them):

- `CartPole-v1` (or `gymnax:CartPole-v1`): a gymnax environment, stepped on the device inside the rollout;
- `gymnasium:CartPole-v1`: a Gymnasium vector environment stepped on the host (src/fragc/algos/host_envs.py);
  `gymnasium_async:CartPole-v1` the same with a worker process per environment;
- `envpool:Pong-v5`: an EnvPool pool stepped on the host (`pip install 'fragc[host]'`);
- `jaxmarl:MPE_simple_spread_v3`, `jaxmarl:SMAX_3m`: JaxMARL's multi-agent environments on the device, an agent
  axis after the environment axis (src/fragc/algos/marl_envs.py; `pip install 'fragc[marl]'`).

Every backend auto-resets and keeps episode statistics the same way: `VecEnv.step` returns the
observation after an automatic reset together with the true next observation (`final_obs`), so an
algorithm can bootstrap a time-limit truncation from the value of the state it really reached; the
algorithms' rollout code is the same for every backend.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import types
from typing import Any

import jax
import numpy as np

from fragc.ir.errors import FragcError

from . import device_suites  # registers craftax, jumanji, brax and playground (each imported when an env is made)  # noqa: F401
from . import board_games  # registers the pgx backend, which single-agent algorithms refuse  # noqa: F401
from . import host_envs  # its host pools register their backends in IMPLEMENTATIONS  # noqa: F401
from . import marl_envs  # registers the jaxmarl backend (jaxmarl itself is imported when an environment is made)  # noqa: F401
from .vec_env import (BACKENDS, IMPLEMENTATIONS, Runner, Step, VecEnv, backend_summary, split_env_name,  # noqa: F401
                      to_gymnax_space)

_RENDERING_ONLY = ("seaborn", "matplotlib.pyplot")
"""What gymnax's environment modules import at the top for their renderers only: about 1 s of every `fragc`
process's start (seaborn brings scipy.stats and pandas), for code that training never runs."""


class _OnFirstUse(types.ModuleType):
    """Stands in for a module while gymnax imports; the real module is imported the first time one of its
    attributes is read (a renderer), and the stand-in takes on its contents. (The standard library's
    `importlib.util.LazyLoader` cannot do this on Python 3.11: the import statement itself reads the
    module's `__spec__`, which loads it.)"""

    def __getattr__(self, attr: str) -> Any:
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
    def obs_shape(self) -> tuple[int, ...]:
        return tuple(self.env.observation_space(self.params).shape) or (1,)

    @property
    def obs_dtype(self) -> np.dtype:
        uint8 = np.dtype(self.env.observation_space(self.params).dtype) == np.uint8
        return np.dtype(np.uint8) if uint8 else np.dtype(np.float32)

    @property
    def max_episode_steps(self) -> int:
        return int(self.params.max_steps_in_episode)

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


IMPLEMENTATIONS["gymnax"] = GymnaxVecEnv


def single_agent_env(name: str, algo: str) -> "VecEnv":
    """`VecEnv(name)` for a single-agent algorithm; a multi-agent environment (jaxmarl:) is refused in one line."""
    env = VecEnv(name)
    if getattr(env, "multi_agent", False):
        raise FragcError(f"{algo} is a single-agent algorithm; {name} has {env.num_agents} agents (use ippo or mappo)")
    return env


def discrete_env(name: str, algo: str, hint: str = "") -> "VecEnv":
    """`VecEnv(name)` for a single-agent algorithm that needs discrete actions; another action space is refused
    in one line naming `algo` (and `hint`, e.g. the algorithm to use instead)."""
    env = single_agent_env(name, algo)
    if not env.is_discrete():
        raise FragcError(f"{algo} supports discrete action spaces; {name} has {type(env.action_space).__name__}{hint}")
    return env
