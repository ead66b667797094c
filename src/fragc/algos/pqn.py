"""PQN: Q-learning without a replay buffer or a target network, as two fragments: `rollout` (actor) and `learn` (learner).

Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning". Many vectorised environments act
epsilon-greedily with the current Q network; the rollout's Q(lambda) returns are the targets of a few epochs of
minibatch regression, as PPO does with its advantages. LayerNorm in the Q network is what keeps the bootstrapped
targets stable without a target network. Defaults are purejaxql's CartPole-v1 configuration
(purejaxql/config/alg/pqn_cartpole.yaml); MinAtar games run the same network on the flattened observation, as
purejaxql's pqn_gymnax.py does.

Under `actor_learner_async` the rollout acts, and computes its Q(lambda) targets, with parameters one iteration old:
Q-learning's target does not depend on the behaviour policy, so acting stale only changes exploration, and
bootstrapping from the previous iteration's Q is a target network one iteration behind (a milder lag than DQN's).
The `-m slow` tests check that program against its pipelined module.
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
from fragc.algos import losses
from fragc.algos.diagnostics import episode_metrics
from fragc.algos.envs import Runner, VecEnv, discrete_env
from fragc.algos.evaluation import EvalConfig, Evaluator
from fragc.algos.minibatches import flatten_steps, shuffled
from fragc.algos.networks import QModel, q_of
from fragc.algos.run_length import RunLength
from fragc.ir.errors import FragcError


@dataclasses.dataclass(frozen=True)
class Config(RunLength, EvalConfig):
    env: str = "CartPole-v1"
    """Environment: a gymnax id, or BACKEND:ID for a host backend (fragc envs); discrete actions."""
    num_envs: int = 32
    """Environments stepped in parallel."""
    num_steps: int = 64
    """Steps per environment in one rollout."""
    total_steps: int = 500_000
    """Environment steps over the whole run; sets the epsilon and learning-rate schedules."""
    lr: float = 1e-4
    """RAdam learning rate (at the start, when decayed)."""
    lr_linear_decay: bool = True
    """Decay the learning rate linearly to zero over the run."""
    num_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 16
    """Minibatches per epoch."""
    gamma: float = 0.99
    """Discount factor."""
    td_lambda: float = 0.95
    """lambda of the Q(lambda) returns (0: one-step Q-learning targets)."""
    reward_scale: float = 0.1
    """Rewards are multiplied by this in the targets (episode_return reports the environment's own)."""
    eps_start: float = 1.0
    """Initial exploration rate."""
    eps_finish: float = 0.2
    """Final exploration rate."""
    eps_decay: float = 0.2
    """Fraction of the run's iterations over which epsilon decays linearly from eps_start to eps_finish."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""
    hidden: int = 256
    """Width of the hidden layers."""
    num_layers: int = 2
    """Hidden layers (each Dense, LayerNorm, relu)."""
    network: str = "auto"
    """mlp (the layers above, on the flattened observation), nature_cnn (purejaxql's pqn_atari.py: LayerNorm
    after every layer, He-normal kernels) or impala_cnn, each with a linear Q head, or auto: a CNN for frames
    (nature_cnn from 36x36, impala_cnn below), the MLP for vectors (docs/pixels.md)."""

    def __post_init__(self) -> None:
        self.check_fields()
        if (self.num_envs * self.num_steps) % self.num_minibatches:
            raise FragcError(f"pqn: num_envs * num_steps ({self.num_envs * self.num_steps}) must divide by "
                             f"num_minibatches ({self.num_minibatches})")


# ---------------------------------------------------------------- state


@struct.dataclass
class Learner:
    params: Any
    opt_state: Any
    key: jax.Array  # replicated: minibatch shuffling
    updates: jax.Array  # iterations done: epsilon's schedule


@struct.dataclass
class State:
    learner: Learner
    runner: Runner


@struct.dataclass
class Transition:
    obs: jax.Array
    action: jax.Array
    target: jax.Array  # the Q(lambda) return of (obs, action)


def lambda_returns(reward: jax.Array, terminated: jax.Array, done: jax.Array, next_q: jax.Array,
                   gamma: float, lam: float) -> jax.Array:
    """Q(lambda) returns over [T, N] arrays, computed backwards over the rollout.

    `next_q` is max_a Q(s_{t+1}, a) of the state each step reached (before any reset). Each return mixes the
    one-step target with the next step's return:
        G_t = r_t + gamma * (1 - terminated_t) * ((1 - lam) * next_q_t + lam * G_{t+1})
    A terminated step does not bootstrap; a truncated one bootstraps from the state it reached; either way the
    trace stops at the episode end (G_t takes next_q_t alone), and at the end of the rollout.
    """
    not_terminated = 1.0 - terminated.astype(jnp.float32)
    keep = 1.0 - done.astype(jnp.float32)

    def backward(future: jax.Array, x: tuple) -> tuple[jax.Array, jax.Array]:
        r, nt, k, q = x
        bootstrap = q + lam * k * (future - q)  # (1 - lam) q + lam G_{t+1} inside an episode, q at its end
        ret = r + gamma * nt * bootstrap
        return ret, ret

    _, returns = jax.lax.scan(backward, next_q[-1], (reward, not_terminated, keep, next_q), reverse=True)
    return returns


# ---------------------------------------------------------------- algorithm


class PQN:
    """Parallelised Q-network (Gallici et al. 2024), purejaxql style."""

    def __init__(self, config: Config = Config()):
        self.config = config
        self.steps_per_iteration = config.steps_per_iteration
        self.evaluator = Evaluator(config.env, self.greedy_action, config.eval_every, config.eval_episodes)

    @functools.cached_property
    def env(self) -> VecEnv:
        return discrete_env(self.config.env, "pqn", " (use ppo_continuous)")

    @functools.cached_property
    def model(self) -> QModel:
        """The Q network `config.network` names: `num_layers` of Dense, LayerNorm, relu, or purejaxql's Atari CNN
        (LayerNorm after every layer, He-normal kernels), each with a linear Q head."""
        c = self.config
        return QModel.of(c.network, self.env, (c.hidden,) * c.num_layers, "he_normal", layer_norm=True)

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """Built where it is used, not cached: a hyperparameter sweep traces it with each member's values."""
        return optax.chain(optax.clip_by_global_norm(self.config.max_grad_norm), optax.radam(self._learning_rate()))

    def _learning_rate(self) -> Any:
        c = self.config
        if not c.lr_linear_decay:
            return c.lr
        return optax.linear_schedule(c.lr, 1e-20, c.iterations * c.num_epochs * c.num_minibatches)  # purejaxql's 1e-20

    def epsilon(self, updates: jax.Array) -> jax.Array:
        """eps_start to eps_finish linearly over the first `eps_decay` of the run's iterations, then eps_finish."""
        c = self.config
        decay = c.eps_decay * c.iterations
        frac = jnp.clip(updates / decay, 0.0, 1.0) if decay > 0 else 1.0
        return c.eps_start + frac * (c.eps_finish - c.eps_start)

    def init(self, key: jax.Array) -> State:
        k_params, k_env, k_learn = jax.random.split(key, 3)
        params = self.model.init(k_params)
        learner = Learner(params, self.optimizer.init(params), k_learn, jnp.int32(0))
        state = State(learner, self.env.reset(k_env, self.config.num_envs))
        return self.evaluator.init(key, state)

    def iteration(self, state: State) -> tuple[State, dict]:
        state, eval_metrics = self.evaluator.maybe_evaluate(state, self.policy_params(state))  # when due
        traj, runner, episode_metrics = self.rollout(state.learner.params, state.learner.updates, state.runner)
        learner, loss_metrics = self.update(state.learner, traj)
        return state.replace(learner=learner, runner=runner), {**episode_metrics, **loss_metrics, **eval_metrics}

    def update(self, learner: Learner, traj: Transition) -> tuple[Learner, dict]:
        """`num_epochs` passes over the rollout, one `learn` call each: a `for` region of the IR, so the
        rollout moves to the learner once and the cost model counts every epoch's gradient all-reduce."""
        learner, metrics = jax.lax.scan(lambda learner, _: self.learn(learner, traj), learner, None,
                                        self.config.num_epochs, unroll=self.model.chosen.unroll)
        return learner.replace(updates=learner.updates + 1), jax.tree.map(jnp.mean, metrics)

    # COLLECT TRAJECTORIES: epsilon-greedy with per-environment keys, and the Q(lambda) targets
    @fragc.fragment(role="actor", in_axes=(None, None, 0), out_axes=(1, 0, None))
    def rollout(self, params: Any, updates: jax.Array, runner: Runner) -> tuple[Transition, Runner, dict]:
        c = self.config
        eps = self.epsilon(updates)

        def step(runner: Runner, _: None) -> tuple[Runner, tuple]:
            keys = jax.vmap(lambda k: jax.random.split(k, 4))(runner.key)  # explore?, random action, env, carried
            action = self.model.epsilon_greedy(params, runner.obs, eps, keys)
            obs = self.model.chosen.observations.frames(runner.obs)  # a CNN's frames stay frames, uint8 ones uint8
            runner, out = self.env.step(runner.replace(key=keys[:, 3]), action, keys[:, 2])
            return runner, (obs, action, out.reward, out.terminated, out.episode_done, out.final_obs)

        runner, (obs, action, reward, terminated, done, next_obs) = jax.lax.scan(step, runner, None, c.num_steps)
        # max_a Q(s_{t+1}, a) for every step at once, with the acting parameters
        next_q = jnp.max(self.model.q_values(params, next_obs), -1)
        target = lambda_returns(c.reward_scale * reward, terminated, done, next_q, c.gamma, c.td_lambda)
        metrics = {**episode_metrics(runner), "epsilon": eps}
        return Transition(obs, action, target), runner, metrics

    # UPDATE NETWORK: one epoch, a pass over the rollout in shuffled minibatches
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, traj: Transition) -> tuple[Learner, dict]:
        c = self.config
        batch = flatten_steps(traj)

        def minibatch_step(learner: Learner, mb: Transition) -> tuple[Learner, dict]:
            return losses.gradient_step(learner, self._loss, (mb,), self.optimizer, self._learning_rate())

        key, perm_key = jax.random.split(learner.key)
        minibatches = shuffled(perm_key, batch, c.num_minibatches)
        learner, metrics = jax.lax.scan(minibatch_step, learner.replace(key=key), minibatches,
                                        unroll=self.model.chosen.unroll)
        return learner, fragc.pmean(jax.tree.map(jnp.mean, metrics))

    def _loss(self, params: Any, mb: Transition) -> tuple[jax.Array, dict]:
        """The squared error of Q(s, a) against the Q(lambda) targets, and it with the mean Q(s, a) of the taken
        actions as metrics."""
        q = q_of(self.model.q_values(params, mb.obs), mb.action)
        loss = 0.5 * jnp.mean((q - mb.target) ** 2)
        return loss, {"loss": loss, "q_value": jnp.mean(q)}

    # THE DETERMINISTIC POLICY: what evaluation episodes and videos act with
    def policy_params(self, state: State) -> Any:
        """The Q network's parameters (the actors' epsilon-greedy policy acts with them)."""
        return state.learner.params

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        return self.model.greedy(params, obs)
