"""JaxMARL's multi-agent environments as a vector environment: `jaxmarl:MPE_simple_spread_v3`, `jaxmarl:SMAX_3m`.

Stepped on the device as gymnax environments are, with JaxMARL's dicts of agents stacked over an **agent axis** after
the environment axis: `runner.obs` is [N, A, D], each agent's row its observation, then the world state where asked
(MAPPO's critic), then the available actions (SMAX), as `AgentLayout` says; actions, rewards and flags are [N, A],
episode statistics per agent, with SMAX's win flag. Auto-reset as JaxMARL's `MultiAgentEnv.step` (when every agent
is done), the observation reached kept as `final_obs`. docs/marl.md has the layout and the episode rules; `jaxmarl`
is an extra (`pip install 'fragc[marl]'`), imported when an environment is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fragc.algos.vec_env import IMPLEMENTATIONS, Runner, Step, VecEnv, split_env_name
from fragc.ir.errors import FragcError

SMAX_OPTIONS = {"see_enemy_actions": True, "walls_cause_death": True, "attack_mode": "closest"}
"""JaxMARL's SMAX baselines' environment settings (baselines/IPPO/config/ippo_rnn_smax.yaml, ENV_KWARGS)."""


@contextlib.contextmanager
def _quiet_stdout() -> Any:
    """Standard output closed at the descriptor (jaxmarl 0.2.0 prints two lines about its submodules when imported,
    past `contextlib.redirect_stdout`), and Python's stream objects kept: importing jaxmarl sets `sys.stdout` back to
    `sys.__stdout__`, which took a caller's redirect (pytest's capture, a notebook's) away for good."""
    sys.stdout.flush()
    streams = sys.stdout, sys.stderr
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        sys.stdout, sys.stderr = streams


def _import_jaxmarl() -> Any:
    try:
        with _quiet_stdout():
            import jaxmarl
    except ImportError as err:
        raise FragcError("jaxmarl: environments need the jaxmarl package: pip install 'fragc[marl]'") from err
    return jaxmarl


def make_marl(env_id: str) -> Any:
    """A JaxMARL environment by id: `SMAX_<map>` is JaxMARL's heuristic-enemy SMAX on that map (`SMAX_3m`), any
    other id goes to `jaxmarl.make` (`MPE_simple_spread_v3`)."""
    jaxmarl = _import_jaxmarl()
    from jaxmarl.registration import registered_envs

    if env_id.startswith("SMAX_"):
        from jaxmarl.environments.smax import map_name_to_scenario

        try:
            scenario = map_name_to_scenario(env_id[len("SMAX_"):])
        except (KeyError, ValueError) as err:
            raise FragcError(f"jaxmarl: unknown SMAX map in '{env_id}' (e.g. SMAX_3m, SMAX_2s3z)") from err
        return jaxmarl.make("HeuristicEnemySMAX", scenario=scenario, **SMAX_OPTIONS)
    if env_id not in registered_envs:
        mpe = [e for e in registered_envs if e.startswith("MPE_")]
        raise FragcError(f"jaxmarl: unknown environment '{env_id}'; known: SMAX_<map> (SMAX_3m), {', '.join(mpe)}")
    return jaxmarl.make(env_id)


@dataclasses.dataclass(frozen=True)
class AgentLayout:
    """Where each part of an agent's row of `runner.obs` lies: [obs_size | world_size | num_actions if masked]."""

    obs_size: int
    world_size: int
    num_actions: int
    masked: bool

    @property
    def size(self) -> int:
        return self.obs_size + self.world_size + (self.num_actions if self.masked else 0)

    def own(self, rows: jax.Array) -> jax.Array:
        return rows[..., :self.obs_size]

    def world(self, rows: jax.Array) -> jax.Array:
        return rows[..., self.obs_size:self.obs_size + self.world_size]

    def mask(self, rows: jax.Array) -> jax.Array | None:
        """The available actions (bool), or None where every action always is."""
        return rows[..., self.obs_size + self.world_size:] > 0.5 if self.masked else None


@struct.dataclass
class AgentsRunner(Runner):
    """`Runner` with its statistics per agent ([N, A]) and, per environment, whether the last episode was won."""

    last_won: jax.Array


class JaxMARLVecEnv(VecEnv):
    """A JaxMARL environment vectorised over `num_envs` copies, an agent axis after the environment axis."""

    multi_agent = True

    def __init__(self, name: str, world_state: bool = True):
        """world_state: whether each agent's row holds the world state (a centralised critic's input)."""
        self.name = name
        _, self.env_id = split_env_name(name)
        with jax.ensure_compile_time_eval():  # made on first use, maybe inside a trace (envs.py's GymnaxVecEnv)
            self.env = make_marl(self.env_id)
        self.agents = tuple(self.env.agents)
        spaces = [self.env.action_space(a) for a in self.agents]
        shapes = {tuple(self.env.observation_space(a).shape) for a in self.agents}
        if len({int(s.n) for s in spaces}) != 1 or len(shapes) != 1 or not hasattr(spaces[0], "n"):
            raise FragcError(f"{name}: the agents' observation or action spaces differ; the jaxmarl backend stacks "
                             "agents over one axis and takes agents of one discrete action space and one "
                             "observation shape")
        self.smax = self.env_id.startswith("SMAX_")
        obs_size = int(np.prod(shapes.pop()))
        world = self.num_agents * obs_size if world_state else 0
        if self.smax and world_state:
            state = jax.eval_shape(lambda k: self.env.reset(k)[1], jax.random.key(0))
            world = int(np.prod(jax.eval_shape(self.env.get_world_state, state).shape))
        self.layout = AgentLayout(obs_size, world, int(spaces[0].n), masked=self.smax)

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def action_space(self) -> Any:
        from gymnax.environments import spaces  # gymnax starts JAX's backend when imported (vec_env.py)

        return spaces.Discrete(self.layout.num_actions)

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return (self.layout.size,)

    @property
    def max_episode_steps(self) -> int:
        return int(self.env.max_steps)

    def _rows(self, obs: dict, state: Any) -> jax.Array:
        """One environment's observation dict -> [A, layout.size]."""
        own = jnp.stack([obs[a].reshape(-1) for a in self.agents]).astype(jnp.float32)
        parts = [own]
        if self.layout.world_size:
            world = self.env.get_world_state(state) if self.smax else own.reshape(-1)
            parts.append(jnp.broadcast_to(world.astype(jnp.float32), (self.num_agents, self.layout.world_size)))
        if self.layout.masked:
            avail = self.env.get_avail_actions(state)
            parts.append(jnp.stack([avail[a] for a in self.agents]).astype(jnp.float32))
        return jnp.concatenate(parts, -1)

    def _reset_one(self, key: jax.Array) -> tuple[jax.Array, Any]:
        obs, state = self.env.reset(key)
        return self._rows(obs, state), state

    def reset_each(self, keys: jax.Array, index: jax.Array | None = None) -> Runner:
        reset_keys, carry_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
        obs, env_state = jax.vmap(self._reset_one)(reset_keys)
        base = self._new_runner(env_state, obs, carry_keys)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Runner)}
        for name in ("episode_return", "last_return", "has_return", "episode_length", "last_length"):  # per agent
            fields[name] = jnp.zeros(fields[name].shape + (self.num_agents,), fields[name].dtype)
        return AgentsRunner(**fields, last_won=jnp.zeros(obs.shape[:1], jnp.float32))

    def _step_one(self, key: jax.Array, state: Any, action: jax.Array) -> tuple:
        """One environment's step with JaxMARL's auto-reset (`MultiAgentEnv.step`), keeping the rows reached."""
        key, reset_key = jax.random.split(key)
        obs, reached, reward, dones, _ = self.env.step_env(key, state, {a: action[i] for i, a in enumerate(self.agents)})
        final = self._rows(obs, reached)
        fresh_obs, fresh = self._reset_one(reset_key)
        over = dones["__all__"]
        state = jax.tree.map(lambda r, s: jax.lax.select(over, r, s), fresh, reached)
        rewards = jnp.stack([reward[a] for a in self.agents])
        done = jnp.stack([dones[a] for a in self.agents])
        return jnp.where(over, fresh_obs, final), state, rewards, done, over, final

    def step(self, runner: Runner, action: jax.Array, step_keys: jax.Array | None = None) -> tuple[Runner, Step]:
        step_keys, carry_keys = self._keys(runner, step_keys)
        obs, env_state, reward, done, over, final = jax.vmap(self._step_one)(step_keys, runner.env_state, action)
        done = done | over[:, None]
        terminated, truncated = (done, jnp.zeros_like(done)) if self.smax else (jnp.zeros_like(done), done)
        ended = jnp.broadcast_to(over[:, None], done.shape)
        base, out = self._advance(runner, env_state, obs, carry_keys, reward, terminated, truncated, final,
                                  game_over=ended)
        won = (reward.max(-1) >= 1.0).astype(jnp.float32) if self.smax else jnp.zeros_like(runner.last_won)
        return AgentsRunner(**{f.name: getattr(base, f.name) for f in dataclasses.fields(Runner)},
                            last_won=jnp.where(over, won, runner.last_won)), out


IMPLEMENTATIONS["jaxmarl"] = JaxMARLVecEnv
