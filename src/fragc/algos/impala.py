"""IMPALA: actor-critic with V-trace off-policy correction (Espeholt et al. 2018).

The actors may act with older parameters than the learner's (under `actor_learner_async` they are one iteration
stale); V-trace corrects the value targets and the policy gradient with truncated importance weights. Data
collection is the actor-critics' rollout (actor_critic.py) with s_{t+1} kept for the learner, which takes one
gradient step per rollout as A2C does, with V-trace (returns.py) in place of GAE.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

import fragc
from fragc.algos import a2c, losses
from fragc.algos.actor_critic import Categorical, Learner, State, Transition, collect, model_for
from fragc.algos.diagnostics import explained_variance, lr_metric
from fragc.algos.envs import Runner, VecEnv, discrete_env
from fragc.algos.evaluation import Evaluator
from fragc.algos.returns import vtrace
from fragc.algos.validation import algo_name


@dataclasses.dataclass(frozen=True)
class Config(a2c.Config):
    rho_bar: float = 1.0
    """Truncation of the importance weights in the TD errors and the policy gradient."""
    c_bar: float = 1.0
    """Truncation of the trace-cutting importance weights."""
    vtrace_lambda: float = 1.0
    """Lambda of V-trace's traces (1.0: the paper's V-trace)."""


def loss(params: Any, traj: Transition, config: Config, model: Categorical
         ) -> tuple[jax.Array, tuple[dict, jax.Array, jax.Array]]:
    """The loss, and beside it its metrics, the V-trace targets v_s and the values V(x_s) they are compared with (for
    the explained variance, over every replica's batch). The bootstrap values V(x_{t+1}) are the learner's own."""
    c = config
    log_prob, entropy, values = model.evaluate(params, traj.obs, traj.action)  # [T, n] each
    _, next_values = model.apply(params, traj.next_obs)
    targets = vtrace(jax.lax.stop_gradient(log_prob) - traj.log_prob, traj.reward, jax.lax.stop_gradient(values),
                     jax.lax.stop_gradient(next_values), traj.terminated, traj.done, c.gamma, c.rho_bar, c.c_bar,
                     c.vtrace_lambda)
    entropy = jnp.mean(entropy)
    actor_loss = -jnp.mean(log_prob * targets.pg_advantages)
    value_loss = losses.value_loss(values, targets.vs)
    total = actor_loss + c.vf_coef * value_loss - c.ent_coef * entropy
    rhos = jnp.exp(log_prob - traj.log_prob)
    metrics = {"loss": total, "actor_loss": actor_loss, "value_loss": value_loss, "entropy": entropy,
               "mean_rho": jnp.mean(rhos), "rho_clip_fraction": jnp.mean((rhos > c.rho_bar).astype(jnp.float32))}
    return total, (metrics, targets.vs, jax.lax.stop_gradient(values))


class IMPALA:
    """Importance-weighted actor-learner architecture, synchronous or pipelined by the policy."""

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
        """A2C's (its learning rate annealed over the iterations); built where it is used, for sweeps."""
        return a2c.optimizer(self.config)

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

    # COLLECT TRAJECTORIES: s_{t+1} kept, the learner bootstraps under its own parameters
    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None))
    def rollout(self, params: Any, runner: Runner) -> tuple[Transition, Runner, dict]:
        return collect(self.model, self.env, params, runner, self.config.num_steps, keep_next_obs=True)

    # UPDATE NETWORK: one step on the rollout, V-trace's targets
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, traj: Transition) -> tuple[Learner, dict]:
        rollout_loss = functools.partial(loss, config=self.config, model=self.model)
        grads, (metrics, targets, values) = jax.grad(rollout_loss, has_aux=True)(learner.params, traj)
        grads = fragc.pmean(grads)
        diagnostics = {**lr_metric(a2c.learning_rate(self.config), learner.opt_state),
                       "explained_variance": explained_variance(targets, values)}
        learner = losses.apply_gradients(learner, grads, self.optimizer)
        return learner, {**fragc.pmean(metrics), **diagnostics}

    # THE DETERMINISTIC POLICY: what evaluation episodes and videos act with
    def policy_params(self, state: State) -> Any:
        return state.learner.params

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        return self.model.greedy(params, obs)
