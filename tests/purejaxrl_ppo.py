"""PureJaxRL's PPO (purejaxrl/ppo.py, CartPole-v1) ported to fragc, as a user's own file.

Run it like a built-in algorithm; its config's fields are the options:

    fragc run tests/purejaxrl_ppo.py:PPO --total-steps 500000 --json
    fragc bench tests/purejaxrl_ppo.py:PPO --policies single,anakin --devices 8
    fragc launch -n 2 -- fragc run tests/purejaxrl_ppo.py:PPO --policy anakin --devices 4 --num-envs 8

docs/porting.md walks through the port step by step. The changes from
PureJaxRL's `make_train`: the config is a dataclass; `train`'s closures become
methods and the runner state a pytree with one PRNG key per environment; the
rollout and the update are fragments with axis declarations; sizes inside a
fragment come from its arguments' shapes, not from the config; the gradient
and the advantage statistics are averaged over replicas with `fragc.pmean`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.linen.initializers import constant, orthogonal
from flax.training.train_state import TrainState
from gymnax.wrappers.purerl import LogWrapper

import fragc


@dataclasses.dataclass(frozen=True)
class Config:
    env_name: str = "CartPole-v1"
    """gymnax environment id (discrete actions)."""
    num_envs: int = 4
    """Environments stepped in parallel."""
    num_steps: int = 128
    """Steps per environment in one rollout."""
    total_steps: int = 500_000
    """Environment steps over the whole run (PureJaxRL's TOTAL_TIMESTEPS)."""
    lr: float = 2.5e-4
    """Adam learning rate."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to zero."""
    update_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_eps: float = 0.2
    """PPO ratio clip."""
    ent_coef: float = 0.01
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    activation: str = "tanh"
    """Hidden-layer activation: tanh or relu."""

    @property
    def steps_per_iteration(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def iterations(self) -> int:
        """PureJaxRL's NUM_UPDATES; `fragc run` trains this many iterations."""
        return self.total_steps // self.steps_per_iteration


class ActorCritic(nn.Module):
    action_dim: int
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        act = nn.relu if self.activation == "relu" else nn.tanh
        actor = act(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x))
        actor = act(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(actor))
        logits = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01), bias_init=constant(0.0))(actor)
        critic = act(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x))
        critic = act(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(critic))
        value = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(critic)
        return logits, jnp.squeeze(value, axis=-1)


@struct.dataclass
class Transition:
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array


@struct.dataclass
class Runner:
    """Per-environment state (axis 0 is the environment): PureJaxRL's (env_state, last_obs, rng),
    with one key per environment, so that every replica draws its own noise."""

    env_state: Any
    obs: jax.Array
    key: jax.Array


@struct.dataclass
class State:
    train_state: TrainState
    runner: Runner
    key: jax.Array  # replicated: minibatch shuffling


class PPO:
    Config = Config  # how fragc finds the config class (an annotation of __init__'s parameter works too)

    def __init__(self, config: Config = Config()):
        self.config = config
        env, self.env_params = gymnax.make(config.env_name)
        self.env = LogWrapper(env)
        self.network = ActorCritic(self.env.action_space(self.env_params).n, config.activation)
        lr = self._schedule if config.anneal_lr else config.lr
        # built once: a TrainState carries its optimizer as a static field, and the state's type
        # must be the same each time init builds one
        self.tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(lr, eps=1e-5))

    @property
    def steps_per_iteration(self) -> int:
        return self.config.steps_per_iteration

    def _schedule(self, count: jax.Array) -> jax.Array:
        c = self.config
        frac = 1.0 - (count // (c.num_minibatches * c.update_epochs)) / c.iterations
        return c.lr * frac

    # INIT
    def init(self, key: jax.Array) -> State:
        c = self.config
        key, net_key, reset_key, env_key = jax.random.split(key, 4)
        obs_shape = self.env.observation_space(self.env_params).shape
        params = self.network.init(net_key, jnp.zeros(obs_shape))
        train_state = TrainState.create(apply_fn=self.network.apply, params=params, tx=self.tx)
        obs, env_state = jax.vmap(self.env.reset, in_axes=(0, None))(jax.random.split(reset_key, c.num_envs),
                                                                   self.env_params)
        return State(train_state, Runner(env_state, obs, jax.random.split(env_key, c.num_envs)), key)

    def iteration(self, state: State) -> tuple[State, dict]:
        traj, last_value, runner, metrics = self.rollout(state.train_state.params, state.runner)
        train_state, key, losses = self.update(state.train_state, state.key, traj, last_value)
        return State(train_state, runner, key), {**metrics, **losses}

    # COLLECT TRAJECTORIES
    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, 0, None))
    def rollout(self, params: Any, runner: Runner) -> tuple[Transition, jax.Array, Runner, dict]:
        def env_step(runner: Runner, _: None) -> tuple[Runner, Transition]:
            keys = jax.vmap(lambda k: jax.random.split(k, 3))(runner.key)  # per environment
            logits, value = self.network.apply(params, runner.obs)
            action = jax.vmap(jax.random.categorical)(keys[:, 1], logits)
            log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
            obs, env_state, reward, terminated, truncated, _ = jax.vmap(
                self.env.step, in_axes=(0, 0, 0, None))(keys[:, 2], runner.env_state, action, self.env_params)
            done = jnp.logical_or(terminated, truncated)
            return Runner(env_state, obs, keys[:, 0]), Transition(done, action, value, reward, log_prob, runner.obs)

        runner, traj = jax.lax.scan(env_step, runner, None, self.config.num_steps)
        _, last_value = self.network.apply(params, runner.obs)
        log = runner.env_state  # gymnax's LogWrapper state: the last finished episode's return per env
        finished = fragc.psum(jnp.sum(log.returned_episode_valid))
        returns = fragc.psum(jnp.sum(log.returned_episode_returns * log.returned_episode_valid))
        return traj, last_value, runner, {"episode_return": returns / jnp.maximum(finished, 1)}

    # UPDATE NETWORK
    @fragc.fragment(role="learner", in_axes=(None, None, 1, 0), out_axes=(None, None, None))
    def update(self, train_state: TrainState, key: jax.Array, traj: Transition,
               last_value: jax.Array) -> tuple[TrainState, jax.Array, dict]:
        c = self.config
        advantages, targets = self._gae(traj, last_value)

        def update_minibatch(train_state: TrainState, batch: Any) -> tuple[TrainState, dict]:
            grads, losses = jax.grad(self._loss, has_aux=True)(train_state.params, *batch)
            return train_state.apply_gradients(grads=fragc.pmean(grads)), losses

        def update_epoch(carry: tuple, _: None) -> tuple[tuple, dict]:
            train_state, key = carry
            key, perm_key = jax.random.split(key)
            batch_size = advantages.size  # this replica's share of the batch: from the data, not the config
            permutation = jax.random.permutation(perm_key, batch_size)
            batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), (traj, advantages, targets))
            minibatches = jax.tree.map(
                lambda x: jnp.take(x, permutation, axis=0).reshape((c.num_minibatches, -1) + x.shape[1:]), batch)
            train_state, losses = jax.lax.scan(update_minibatch, train_state, minibatches)
            return (train_state, key), losses

        (train_state, key), losses = jax.lax.scan(update_epoch, (train_state, key), None, c.update_epochs)
        return train_state, key, jax.tree.map(lambda x: fragc.pmean(jnp.mean(x)), losses)

    # CALCULATE ADVANTAGE
    def _gae(self, traj: Transition, last_value: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = self.config

        def get_advantages(carry: tuple, transition: Transition) -> tuple[tuple, jax.Array]:
            gae, next_value = carry
            not_done = 1.0 - transition.done
            delta = transition.reward + c.gamma * next_value * not_done - transition.value
            gae = delta + c.gamma * c.gae_lambda * not_done * gae
            return (gae, transition.value), gae

        _, advantages = jax.lax.scan(get_advantages, (jnp.zeros_like(last_value), last_value), traj, reverse=True)
        return advantages, advantages + traj.value

    def _loss(self, params: Any, traj: Transition, gae: jax.Array, targets: jax.Array) -> tuple[jax.Array, dict]:
        c = self.config
        logits, value = self.network.apply(params, traj.obs)
        log_probs = jax.nn.log_softmax(logits)
        log_prob = jnp.take_along_axis(log_probs, traj.action[:, None], axis=-1)[:, 0]

        value_clipped = traj.value + (value - traj.value).clip(-c.clip_eps, c.clip_eps)
        value_loss = 0.5 * jnp.maximum(jnp.square(value - targets), jnp.square(value_clipped - targets)).mean()

        ratio = jnp.exp(log_prob - traj.log_prob)
        # the minibatch's statistics over every replica's share of it, as on one device
        mean = fragc.pmean(gae.mean())
        std = jnp.sqrt(fragc.pmean(jnp.square(gae - mean).mean()))
        gae = (gae - mean) / (std + 1e-8)
        actor_loss = -jnp.minimum(ratio * gae, jnp.clip(ratio, 1.0 - c.clip_eps, 1.0 + c.clip_eps) * gae).mean()
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1).mean()

        total_loss = actor_loss + c.vf_coef * value_loss - c.ent_coef * entropy
        return total_loss, {"loss": total_loss, "value_loss": value_loss, "actor_loss": actor_loss,
                            "entropy": entropy}
