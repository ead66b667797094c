"""A2C: synchronous advantage actor-critic (Mnih et al. 2016), discrete actions.

Data collection is the actor-critics' rollout (actor_critic.py), as PPO's; learning is one gradient step per rollout
on the GAE advantages (lambda = 1 gives n-step returns), averaged over learner replicas with `fragc.pmean`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

import fragc
from fragc.algos import actor_critic, losses
from fragc.algos.actor_critic import Categorical, Learner, State, Transition, collect, model_for
from fragc.algos.diagnostics import explained_variance, lr_metric
from fragc.algos.envs import Runner, VecEnv, discrete_env
from fragc.algos.evaluation import Evaluator
from fragc.algos.minibatches import flatten_steps
from fragc.algos.returns import gae
from fragc.algos.validation import algo_name


@dataclasses.dataclass(frozen=True)
class Config(actor_critic.NetworkConfig):
    """The actor-critics' fields (actor_critic.py) at A2C's values."""

    num_envs: int = 8
    num_steps: int = 8
    """Steps per environment in one rollout (the n of n-step returns). A2C takes one gradient step per
    rollout, so small rollouts mean many steps: 8 x 8 gives 15,625 steps in 1e6 env steps (16 x 32 gave
    1,953, and 6 of 10 seeds stalled near a return of 200)."""
    total_steps: int = 1_000_000
    lr: float = 7e-4
    gae_lambda: float = 0.95
    """GAE lambda; 1.0 gives plain n-step returns."""
    ent_coef: float = 0.0
    """Entropy bonus weight (0, as RL Baselines3 Zoo's CartPole A2C: 0.01 kept the policy's entropy near
    0.5 nats of at most 0.69, and returns drifted down late in training)."""


def learning_rate(config: Config) -> Any:
    """Adam's learning rate: annealed linearly to zero over the run's iterations (one step each), or constant."""
    return optax.linear_schedule(config.lr, 0.0, config.iterations) if config.anneal_lr else config.lr


def optimizer(config: Config) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(learning_rate(config), eps=1e-5))


def loss(params: Any, traj: Transition, advantages: jax.Array, targets: jax.Array, config: Config,
         model: Categorical) -> tuple[jax.Array, dict]:
    log_prob, entropy, value = model.evaluate(params, traj.obs, traj.action)
    entropy = jnp.mean(entropy)
    actor_loss = losses.policy_gradient(log_prob, advantages)
    value_loss = losses.value_loss(value, targets)
    total = actor_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    return total, {"loss": total, "actor_loss": actor_loss, "value_loss": value_loss, "entropy": entropy}


class A2C:
    """Advantage actor-critic, synchronous: one gradient step on each rollout."""

    Config = Config

    def __init__(self, config: Config | None = None):
        self.config = c = self.Config() if config is None else config
        self.steps_per_iteration = c.steps_per_iteration
        self.evaluator = Evaluator(c.env, self.greedy_action, c.eval_every, c.eval_episodes)

    @functools.cached_property
    def env(self) -> VecEnv:
        return discrete_env(self.config.env, algo_name(self.config), " (for continuous actions: ppo_continuous or sac)")

    @functools.cached_property
    def model(self) -> Categorical:
        """The network and its action distribution (actor_critic.py)."""
        return model_for(self.config, self.env)

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """Built where it is used, not cached: a hyperparameter sweep traces it with each member's values."""
        return optimizer(self.config)

    def init(self, key: jax.Array) -> State:
        k_params, k_env, k_learn = jax.random.split(key, 3)
        params = self.model.init(k_params)
        learner = Learner(params, self.optimizer.init(params), k_learn)
        state = State(learner, self.env.reset(k_env, self.config.num_envs))
        return self.evaluator.init(key, state)

    def iteration(self, state: State) -> tuple[State, dict]:
        state, eval_metrics = self.evaluator.maybe_evaluate(state, self.policy_params(state))  # when due
        traj, runner, episode_metrics = self.rollout(state.learner.params, state.runner)
        learner, loss_metrics = self.learn(state.learner, traj)
        return state.replace(learner=learner, runner=runner), {**episode_metrics, **loss_metrics, **eval_metrics}

    # COLLECT TRAJECTORIES: the learner bootstraps from V(s_{t+1}), which the rollout computes
    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None))
    def rollout(self, params: Any, runner: Runner) -> tuple[Transition, Runner, dict]:
        return collect(self.model, self.env, params, runner, self.config.num_steps, keep_next_obs=False)

    # UPDATE NETWORK: one step on the whole rollout
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, traj: Transition) -> tuple[Learner, dict]:
        c = self.config
        advantages, targets = gae(traj, c.gamma, c.gae_lambda)
        rollout_loss = functools.partial(loss, config=c, model=self.model)
        batch = flatten_steps((traj, advantages, targets))  # [T * N, ...]: one batch of every step
        grads, metrics = jax.grad(rollout_loss, has_aux=True)(learner.params, *batch)
        grads = fragc.pmean(grads)
        diagnostics = {**lr_metric(learning_rate(c), learner.opt_state),
                       "explained_variance": explained_variance(targets, traj.value)}
        learner = losses.apply_gradients(learner, grads, self.optimizer)
        return learner, {**fragc.pmean(metrics), **diagnostics}

    # THE DETERMINISTIC POLICY: what evaluation episodes and videos act with
    def policy_params(self, state: State) -> Any:
        return state.learner.params

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        return self.model.greedy(params, obs)
