"""DQN with a target network, epsilon-greedy exploration, and a replay buffer held on device as a fragment.

Three roles: `actor` (act epsilon-greedily, step the environments), `buffer`
(insert a rollout, sample a batch) and `learner` (Q-learning steps). The
buffer (src/fragc/algos/replay.py, shared with SAC) is batched over environments (axis 1),
so a policy can keep it beside the actors or beside the learner, and split it
over replicas like any other batched state. Double DQN is an option. Defaults
follow PureJaxRL's CartPole DQN (10k transitions, batch 128, one update per vector step), with 8 environments (not 10: divisible by every built-in policy's replicas) and lr 2e-4.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

import fragc
from fragc.algos.diagnostics import episode_metrics
from fragc.algos.envs import Runner, VecEnv, discrete_env
from fragc.algos.evaluation import EvalConfig, Evaluator
from fragc.algos import losses, replay
from fragc.algos.networks import QModel, q_of
from fragc.algos.replay import BUFFER_AXES, Buffer, Transition
from fragc.algos.run_length import RunLength
from fragc.ir.errors import FragcError


@dataclasses.dataclass(frozen=True)
class Config(RunLength, EvalConfig):
    env: str = "CartPole-v1"
    """Environment: a gymnax id, or BACKEND:ID for a host backend (fragc envs); discrete actions."""
    num_envs: int = 8
    """Environments stepped in parallel (PureJaxRL: 10; 8 divides by the replicas of every built-in policy)."""
    num_steps: int = 8
    """Vector steps per rollout; the learner takes as many gradient steps per iteration."""
    total_steps: int = 500_000
    """Environment steps over the whole run."""
    buffer_size: int = 10_000
    """Replay capacity in transitions (over all environments)."""
    batch_size: int = 128
    """Transitions per gradient step."""
    learning_starts: int = 10_000
    """Environment steps before learning begins."""
    lr: float = 2e-4
    """Adam learning rate (PureJaxRL: 2.5e-4 with 10 environments; 8 take 10/8 as many updates per env step)."""
    gamma: float = 0.99
    """Discount factor."""
    eps_start: float = 1.0
    """Initial exploration rate."""
    eps_end: float = 0.05
    """Final exploration rate."""
    eps_decay_steps: int = 250_000
    """Environment steps over which epsilon decays linearly."""
    target_update_interval: int = 500
    """Environment steps between target-network copies."""
    double_dqn: bool = False
    """Select the next action with the online network, evaluate it with the target network."""
    hidden: int = 120
    """Width of the Q-network's hidden layers (PureJaxRL: 120, 84)."""
    network: str = "auto"
    """mlp (the layers above, on the flattened observation), nature_cnn (CleanRL's dqn_atari_jax.py: Flax's
    default initialisation) or impala_cnn, each with a linear Q head, or auto: a CNN for frames (nature_cnn
    from 36x36, impala_cnn below), the MLP for vectors (docs/pixels.md)."""

    def __post_init__(self) -> None:
        self.check_fields()
        if self.buffer_size < self.num_envs * self.num_steps:
            raise FragcError("dqn: buffer_size must hold at least one rollout (num_envs * num_steps)")


@struct.dataclass
class Learner:
    params: Any
    target_params: Any
    opt_state: Any
    key: jax.Array  # replicated: sampling
    env_steps: jax.Array


@struct.dataclass
class State:
    learner: Learner
    runner: Runner
    buffer: Buffer


class DQN:
    """Deep Q-learning (Mnih et al. 2015), optionally double (van Hasselt et al. 2016)."""

    def __init__(self, config: Config = Config()):
        self.config = config
        self.steps_per_iteration = config.steps_per_iteration
        self.evaluator = Evaluator(config.env, self.greedy_action, config.eval_every, config.eval_episodes)

    @functools.cached_property
    def env(self) -> VecEnv:
        return discrete_env(self.config.env, "dqn", " (use ppo_continuous)")

    @functools.cached_property
    def model(self) -> QModel:
        """The Q network `config.network` names: PureJaxRL's MLP, or CleanRL's dqn_atari_jax.py CNN (Flax's default
        initialisation)."""
        return QModel.of(self.config.network, self.env, (self.config.hidden, 84), "lecun_normal", layer_norm=False)

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """Built where it is used, not cached: a hyperparameter sweep traces it with each member's values."""
        return optax.adam(self.config.lr)

    def init(self, key: jax.Array) -> State:
        c = self.config
        k_params, k_env, k_learn = jax.random.split(key, 3)
        params = self.model.init(k_params)
        learner = Learner(params, params, self.optimizer.init(params), k_learn, jnp.int32(0))
        runner = self.env.reset(k_env, c.num_envs)
        obs = self.model.chosen.observations.struct(c.num_envs)
        scalar = lambda dtype: jax.ShapeDtypeStruct((c.num_envs,), dtype)  # noqa: E731
        step = Transition(obs, scalar(jnp.int32), scalar(jnp.float32), obs, scalar(bool))
        state = State(learner, runner, replay.empty(step, c.buffer_size, c.num_envs))
        return self.evaluator.init(key, state)

    def iteration(self, state: State) -> tuple[State, dict]:
        state, eval_metrics = self.evaluator.maybe_evaluate(state, self.policy_params(state))  # when due
        traj, runner, metrics = self.rollout(state.learner.params, state.learner.env_steps, state.runner)
        buffer = self.insert(state.buffer, traj)
        key, sample_key = jax.random.split(state.learner.key)
        batch = self.sample(buffer, sample_key)
        learner, losses = self.learn(state.learner.replace(key=key), batch)
        # SYNC THE TARGET NETWORK when the env steps pass a multiple of target_update_interval (an `if` region)
        interval = self.config.target_update_interval
        copy = learner.env_steps // interval > state.learner.env_steps // interval
        target = jax.lax.cond(copy, self.sync_target, lambda params, target: target,
                              learner.params, learner.target_params)
        state = state.replace(learner=learner.replace(target_params=target), runner=runner, buffer=buffer)
        return state, {**metrics, **losses, **eval_metrics}

    def epsilon(self, env_steps: jax.Array) -> jax.Array:
        c = self.config
        frac = jnp.clip(env_steps / c.eps_decay_steps, 0.0, 1.0)
        return c.eps_start + frac * (c.eps_end - c.eps_start)

    # COLLECT TRAJECTORIES
    @fragc.fragment(role="actor", in_axes=(None, None, 0), out_axes=(1, 0, None))
    def rollout(self, params: Any, env_steps: jax.Array, runner: Runner) -> tuple[Transition, Runner, dict]:
        eps = self.epsilon(env_steps)

        def step(runner: Runner, _: None) -> tuple[Runner, Transition]:
            keys = jax.vmap(lambda k: jax.random.split(k, 3))(runner.key)  # explore?, random action, carried
            action = self.model.epsilon_greedy(params, runner.obs, eps, keys)
            frames = self.model.chosen.observations.frames  # a CNN's frames stay frames, uint8 ones uint8
            obs = frames(runner.obs)
            runner, out = self.env.step(runner.replace(key=keys[:, 2]), action)
            return runner, Transition(obs, action, out.reward, frames(out.final_obs), out.terminated)

        runner, traj = jax.lax.scan(step, runner, None, self.config.num_steps)
        metrics = {**episode_metrics(runner), "epsilon": eps}
        return traj, runner, metrics

    # REPLAY BUFFER (replay.py): a rollout in, one batch per vector step out
    @fragc.fragment(role="buffer", in_axes=(BUFFER_AXES, 1), out_axes=BUFFER_AXES)
    def insert(self, buffer: Buffer, traj: Transition) -> Buffer:
        return replay.insert(buffer, traj)

    @fragc.fragment(role="buffer", in_axes=(BUFFER_AXES, None), out_axes=1)
    def sample(self, buffer: Buffer, key: jax.Array) -> Transition:
        c = self.config
        return replay.sample(buffer, key, c.num_steps, c.batch_size, c.num_envs)

    # UPDATE NETWORK
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, batches: Transition) -> tuple[Learner, dict]:
        c = self.config
        env_steps = learner.env_steps + c.steps_per_iteration
        started = env_steps >= c.learning_starts

        def update(learner: Learner, batch: Transition) -> tuple[Learner, dict]:
            (loss, q_value), grads = jax.value_and_grad(self._td, has_aux=True)(learner.params, learner.target_params,
                                                                                 batch)
            grads = fragc.pmean(grads)
            new = losses.apply_gradients(learner, grads, self.optimizer)
            return (jax.tree.map(lambda a, b: jnp.where(started, a, b), new, learner),
                    fragc.pmean({"loss": loss, "q_value": q_value}))

        learner, metrics = jax.lax.scan(update, learner, batches, unroll=self.model.chosen.unroll)
        return learner.replace(env_steps=env_steps), jax.tree.map(jnp.mean, metrics)

    @fragc.fragment(role="learner", in_axes=(None, None), out_axes=None)
    def sync_target(self, params: Any, target_params: Any) -> Any:
        """The target network's new parameters: the online network's (Mnih et al.'s hard update)."""
        return jax.tree.map(lambda p, t: p.astype(t.dtype), params, target_params)

    def _loss(self, params: Any, target_params: Any, batch: Transition) -> jax.Array:
        """The TD loss: the mean squared error of Q(s, a) against r + gamma (1 - terminated) Q'(s', a'), a'
        the target network's argmax (the online network's with double_dqn)."""
        return self._td(params, target_params, batch)[0]

    def _td(self, params: Any, target_params: Any, batch: Transition) -> tuple[jax.Array, jax.Array]:
        """The TD loss, and the mean Q(s, a) of the batch's actions under the online network (CleanRL's q_values)."""
        q_next_target = self.model.q_values(target_params, batch.next_obs)
        if self.config.double_dqn:
            q_next = q_of(q_next_target, self.model.greedy(params, batch.next_obs))
        else:
            q_next = jnp.max(q_next_target, -1)
        target = batch.reward + self.config.gamma * (1.0 - batch.terminated) * jax.lax.stop_gradient(q_next)
        q = q_of(self.model.q_values(params, batch.obs), batch.action)
        return jnp.mean((q - target) ** 2), jnp.mean(q)

    # THE DETERMINISTIC POLICY: what evaluation episodes and videos act with
    def policy_params(self, state: State) -> Any:
        """The online Q-network's parameters (the actors' epsilon-greedy policy acts with them)."""
        return state.learner.params

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        return self.model.greedy(params, obs)
