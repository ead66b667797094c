"""What the on-policy actor-critics (PPO, A2C, IMPALA, IPPO, MAPPO) call: their states, their trajectory, the
model that acts (a network with its action distribution) and the rollout.

An algorithm holds a model (`model_for`) and calls `collect` from its `rollout` fragment; its learner reads the
`Transition` that `collect` returns. The returns (GAE, V-trace) are in returns.py, the losses in losses.py, the
minibatches in minibatches.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

import fragc
from fragc.algos.diagnostics import episode_metrics
from fragc.algos.evaluation import EvalConfig
from fragc.algos.networks import ActorCritic, ChosenNetwork, GaussianActorCritic, PixelActorCritic, torso
from fragc.algos.run_length import RunLength
from fragc.algos.validation import algo_name
from fragc.algos.vec_env import Runner
from fragc.ir.errors import FragcError


@dataclasses.dataclass(frozen=True)
class Config(RunLength, EvalConfig):
    """The fields every actor-critic's config has, at PureJaxRL's CartPole values (PPO's)."""

    env: str = "CartPole-v1"
    """Environment: a gymnax id, or BACKEND:ID for a host backend (fragc envs); discrete actions."""
    num_envs: int = 4
    """Environments stepped in parallel."""
    num_steps: int = 128
    """Steps per environment in one rollout."""
    total_steps: int = 500_000
    """Environment steps over the whole run; sets the learning-rate schedule and the CLI's run length."""
    lr: float = 2.5e-4
    """Adam learning rate (at the start, when annealed)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to zero over `total_steps`."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    ent_coef: float = 0.01
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    hidden: int = 64
    """Width of the two hidden layers of the actor and of the critic."""

    def __post_init__(self) -> None:
        self.check_fields()


@dataclasses.dataclass(frozen=True)
class NetworkConfig(Config):
    """An actor-critic whose network is `model_for`'s: PureJaxRL's MLPs or CleanRL's CNNs."""

    activation: str = "tanh"
    """Hidden-layer activation: "tanh" (PureJaxRL's CartPole network) or "relu" (its MinAtar one)."""
    network: str = "auto"
    """mlp (the two MLPs above, on the flattened observation), nature_cnn or impala_cnn (CleanRL's Atari
    actor-critic: one CNN torso, a policy and a value head), or auto: a CNN for frames (nature_cnn from 36x36,
    impala_cnn below), the MLP for vectors (docs/pixels.md)."""


@struct.dataclass
class Learner:
    params: Any
    opt_state: Any
    key: jax.Array  # replicated: minibatch shuffling


@struct.dataclass
class State:
    learner: Learner
    runner: Runner


@struct.dataclass
class Transition:
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    next_obs: jax.Array | None  # s_{t+1}: the observation reached, before any reset; None where the learner does
    # not read it (`collect`'s `keep_next_obs`)
    next_value: jax.Array  # V(s_{t+1}) under the acting parameters
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array  # terminated or truncated


# ---------------------------------------------------------------- the model: a network and its action distribution


def log_prob_of(log_probs: jax.Array, action: jax.Array) -> jax.Array:
    return jnp.take_along_axis(log_probs, action[..., None], -1)[..., 0]


@dataclasses.dataclass(frozen=True)
class Categorical:
    """A network's logits as a categorical policy, beside its value. With `agents` > 0 the parameters are stacked
    over that many agents (IPPO's own parameters): each agent's network acts on its own rows [..., A, D]."""

    network: nn.Module
    chosen: ChosenNetwork
    agents: int = 0

    @property
    def observations(self) -> Any:
        return self.chosen.observations

    @property
    def unroll(self) -> bool:
        return self.chosen.unroll

    def one_agent(self) -> "Categorical":
        """The model of one agent's parameters (what IPPO's per-agent learner runs PPO's update with)."""
        return dataclasses.replace(self, agents=0)

    def init(self, key: jax.Array) -> Any:
        init_one = lambda k: self.network.init(k, self.observations.zeros(1))  # noqa: E731
        return jax.vmap(init_one)(jax.random.split(key, self.agents)) if self.agents else init_one(key)

    def apply(self, params: Any, obs: jax.Array, **kwargs: Any) -> Any:
        """The network on observations as the environment gives them (flattened) or as the trajectory keeps them
        (frames)."""
        apply_one = lambda p, o: self.network.apply(p, self.observations.frames(o), **kwargs)  # noqa: E731
        if not self.agents:
            return apply_one(params, obs)
        out_axes = -1 if kwargs.get("method") == "value" else (-2, -1)
        return jax.vmap(apply_one, in_axes=(0, -2), out_axes=out_axes)(params, obs)

    def act(self, params: Any, obs: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Sample one action per observation (one key each) -> (action, log-probability, value)."""
        logits, value = self.apply(params, obs)
        action = jax.vmap(jax.random.categorical)(keys, logits)
        return action, log_prob_of(jax.nn.log_softmax(logits), action), value

    def evaluate(self, params: Any, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(log-probability of `action`, entropy, value) per observation, any leading shape."""
        logits, value = self.apply(params, obs)
        log_probs = jax.nn.log_softmax(logits)
        return log_prob_of(log_probs, action), -jnp.sum(jnp.exp(log_probs) * log_probs, -1), value

    def value(self, params: Any, obs: jax.Array) -> jax.Array:
        """The critic alone: V(obs), any leading shape."""
        return self.apply(params, obs, method="value")

    def env_action(self, action: jax.Array) -> jax.Array:
        """What the environment receives for a sampled action."""
        return action

    def greedy(self, params: Any, obs: jax.Array) -> jax.Array:
        """The most probable action for each of `obs[n, obs_size]`, as the environment's step takes it."""
        logits, _ = self.apply(params, obs)
        return self.env_action(jnp.argmax(logits, -1))


def gaussian_log_prob(mean: jax.Array, log_std: jax.Array, x: jax.Array) -> jax.Array:
    z = (x - mean) / jnp.exp(log_std)
    return jnp.sum(-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), -1)


@dataclasses.dataclass(frozen=True)
class Gaussian(Categorical):
    """A diagonal Gaussian policy with a state-independent log standard deviation, for Box actions. Sampled actions
    are kept unclipped (their log-probabilities are exact) and clipped to the action space's bounds only for the
    environment."""

    env: Any = None  # its action space read where used: a gymnax space made inside a trace holds that trace's arrays

    def act(self, params: Any, obs: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        (mean, log_std), value = self.apply(params, obs)
        noise = jax.vmap(lambda k, m: jax.random.normal(k, m.shape))(keys, mean)
        action = mean + jnp.exp(log_std) * noise
        return action, gaussian_log_prob(mean, log_std, action), value

    def evaluate(self, params: Any, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        (mean, log_std), value = self.apply(params, obs)
        entropy = jnp.sum(log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e), -1)
        return gaussian_log_prob(mean, log_std, action), entropy, value

    def env_action(self, action: jax.Array) -> jax.Array:
        space = self.env.action_space
        return jnp.clip(action, space.low, space.high).reshape((action.shape[0],) + tuple(space.shape))

    def greedy(self, params: Any, obs: jax.Array) -> jax.Array:
        """The Gaussian's mean for each of `obs[n, obs_size]`, clipped to the action space as `env_action` does."""
        (mean, _), _ = self.apply(params, obs)
        return self.env_action(mean)


def model_for(config: Any, env: Any) -> Categorical:
    """The model a config's `network`, `hidden` and `activation` name for `env`'s observations and actions: a
    categorical policy on PureJaxRL's MLPs or CleanRL's CNN actor-critic, or a Gaussian on the MLPs."""
    chosen = ChosenNetwork.of(config.network, env)
    if env.is_discrete():
        if chosen.name == "mlp":
            return Categorical(ActorCritic(env.action_space.n, config.hidden, config.activation), chosen)
        return Categorical(PixelActorCritic(torso(chosen.name, env.obs_shape), env.action_space.n), chosen)
    if chosen.name != "mlp":
        raise FragcError(f"{algo_name(config)}: network must be auto or mlp (no pixel network for continuous actions), "
                         f"got {config.network!r}")
    dims = int(np.prod(env.action_space.shape))
    return Gaussian(GaussianActorCritic(dims, config.hidden, config.activation), chosen, env=env)


# ---------------------------------------------------------------- the rollout


def count_episodes(done: jax.Array) -> jax.Array:
    """How many episodes the rollout's steps ended (`done` [T, N]), over every replica."""
    return fragc.psum(jnp.sum(done))


def collect(model: Categorical, env: Any, params: Any, runner: Runner, num_steps: int, keep_next_obs: bool,
            episode_stats: Callable[[Runner], dict] = episode_metrics,
            episodes_ended: Callable[[jax.Array], jax.Array] = count_episodes) -> tuple[Transition, Runner, dict]:
    """`num_steps` steps of every environment, acting with `params`, per-environment keys from the runner (acting,
    stepping, carried) -> (trajectory [T, N, ...], runner, episode metrics). The values V(s_{t+1}) of the states
    reached, before any reset, come from one batched critic pass over the trajectory: a truncated episode bootstraps
    from them. The trajectory carries s_{t+1} itself only where `keep_next_obs` (a learner that reads it: with
    Atari's frames, half the bytes that cross)."""
    frames = model.observations.frames  # a CNN's frames stay frames, uint8 ones uint8

    def step(runner: Runner, _: None) -> tuple[Runner, tuple]:
        keys = jax.vmap(lambda k: jax.random.split(k, 3))(runner.key)  # acting, environment step, carried
        obs = frames(runner.obs)
        action, log_prob, value = model.act(params, obs, keys[:, 0])
        runner, out = env.step(runner.replace(key=keys[:, 2]), model.env_action(action), keys[:, 1])
        return runner, (obs, action, log_prob, value, frames(out.final_obs), out.reward, out.terminated,
                        out.episode_done)

    runner, (obs, action, log_prob, value, next_obs, reward, terminated, done) = jax.lax.scan(
        step, runner, None, num_steps)
    next_value = model.value(params, next_obs)
    traj = Transition(obs, action, log_prob, value, next_obs if keep_next_obs else None, next_value, reward,
                      terminated, done)
    return traj, runner, {**episode_stats(runner), "episodes": episodes_ended(traj.done)}
