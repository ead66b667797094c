"""PPO (Schulman et al. 2017) as PureJaxRL writes it, in two fragments: `rollout` (actor) and `learn` (learner).

Defaults are PureJaxRL's CartPole-v1 configuration. The algorithm is written only against fragc's public API and
runs unchanged under every policy: batch randomness comes from per-environment keys in the runner, and the learner's
gradient is averaged over replicas with `fragc.pmean`. The pieces it shares with the other actor-critics are
functions it calls: the model and the rollout (actor_critic.py), GAE (returns.py), the losses (losses.py) and the
minibatches (minibatches.py). ppo_continuous is this algorithm with a Gaussian policy (its config); IPPO and MAPPO
call `update` for their agents.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

import fragc
from fragc.algos import actor_critic, losses
from fragc.algos.actor_critic import Categorical, Learner, State, Transition, collect, model_for
from fragc.algos.diagnostics import explained_variance
from fragc.algos.envs import Runner, VecEnv, discrete_env, single_agent_env
from fragc.algos.evaluation import Evaluator
from fragc.algos.minibatches import flatten_steps, shuffled
from fragc.algos.returns import gae
from fragc.algos.validation import algo_name
from fragc.ir.errors import FragcError


@dataclasses.dataclass(frozen=True)
class Config(actor_critic.NetworkConfig):
    """The actor-critics' fields (actor_critic.py) and PPO's own, at PureJaxRL's CartPole values."""

    actions: ClassVar[str] = "discrete"
    """The action spaces taken: discrete (a categorical policy); ppo_continuous's config says continuous (a
    Gaussian)."""
    update_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    clip_eps: float = 0.2
    """PPO ratio clip."""
    clip_value: bool = True
    """Also clip each value update to `clip_eps` around the rollout's values (PureJaxRL's value loss)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.num_envs * self.num_steps) % self.num_minibatches:
            raise FragcError(f"{algo_name(self)}: num_envs * num_steps ({self.num_envs * self.num_steps}) must "
                             f"divide by num_minibatches ({self.num_minibatches})")


# ---------------------------------------------------------------- the update: IPPO and MAPPO call it too


def learning_rate(config: Config) -> Any:
    """Adam's learning rate: annealed linearly to zero over every minibatch step of the run, or constant."""
    if not config.anneal_lr:
        return config.lr
    return optax.linear_schedule(config.lr, 0.0, config.iterations * config.update_epochs * config.num_minibatches)


def optimizer(config: Config) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(learning_rate(config), eps=1e-5))


def update(learner: Learner, traj: Transition, config: Config, model: Categorical,
           tx: optax.GradientTransformation) -> tuple[Learner, dict]:
    """The advantages once from the rollout's values, then `update_epochs` passes over the rollout in shuffled
    minibatches, the gradients averaged over the learner's replicas."""
    advantages, targets = gae(traj, config.gamma, config.gae_lambda)  # from the rollout's values: the same every epoch
    batch = flatten_steps((traj, advantages, targets))

    def minibatch_step(learner: Learner, mb: Any) -> tuple[Learner, dict]:
        minibatch_loss = functools.partial(loss, config=config, model=model)
        return losses.gradient_step(learner, minibatch_loss, mb, tx, learning_rate(config))

    def epoch(learner: Learner, _: None) -> tuple[Learner, dict]:
        key, perm_key = jax.random.split(learner.key)
        minibatches = shuffled(perm_key, batch, config.num_minibatches)  # T x N steps (of all agents)
        learner, metrics = jax.lax.scan(minibatch_step, learner.replace(key=key), minibatches, unroll=model.unroll)
        return learner, fragc.pmean(jax.tree.map(jnp.mean, metrics))

    learner, metrics = jax.lax.scan(epoch, learner, None, config.update_epochs, unroll=model.unroll)
    metrics = jax.tree.map(jnp.mean, metrics)  # over epochs
    return learner, {**metrics, "explained_variance": explained_variance(targets, traj.value)}


def loss(params: Any, traj: Transition, advantages: jax.Array, targets: jax.Array, config: Config,
         model: Categorical) -> tuple[jax.Array, dict]:
    """The clipped surrogate, the (clipped) value loss and the entropy bonus on one minibatch."""
    log_prob, entropy, value = model.evaluate(params, traj.obs, traj.action)
    entropy = jnp.mean(entropy)
    value_loss = losses.value_loss(value, targets, traj.value, config.clip_eps if config.clip_value else None)
    actor_loss, diagnostics = losses.clipped_surrogate(log_prob, traj.log_prob, advantages, config.clip_eps)
    total = actor_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    return total, {"loss": total, "actor_loss": actor_loss, "value_loss": value_loss, "entropy": entropy,
                   **diagnostics}


# ---------------------------------------------------------------- the algorithm


class PPO:
    """Proximal policy optimisation, PureJaxRL style.

    The environment is made on first use, so that constructing the algorithm does not start JAX (which would fix
    the number of simulated devices).
    """

    Config = Config

    def __init__(self, config: Config | None = None):
        self.config = c = self.Config() if config is None else config
        self.steps_per_iteration = c.steps_per_iteration
        self.evaluator = Evaluator(c.env, self.greedy_action, c.eval_every, c.eval_episodes)

    @functools.cached_property
    def env(self) -> VecEnv:
        name, algo = self.config.env, algo_name(self.config)
        if self.config.actions == "discrete":
            return discrete_env(name, algo, " (for continuous actions: ppo_continuous or sac)")
        env = single_agent_env(name, algo)
        if env.is_discrete():
            raise FragcError(f"{algo} supports continuous (Box) action spaces; {name} is discrete; use ppo")
        return env

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

    # COLLECT TRAJECTORIES: the learner bootstraps from V(s_{t+1}), which the rollout computes, so s_{t+1} itself does
    # not cross (with Atari frames, half the bytes)
    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None))
    def rollout(self, params: Any, runner: Runner) -> tuple[Transition, Runner, dict]:
        return collect(self.model, self.env, params, runner, self.config.num_steps, keep_next_obs=False)

    # UPDATE NETWORK
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, traj: Transition) -> tuple[Learner, dict]:
        return update(learner, traj, self.config, self.model, self.optimizer)

    # THE DETERMINISTIC POLICY: what evaluation episodes and videos act with
    def policy_params(self, state: State) -> Any:
        return state.learner.params

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        """The most probable action (the Gaussian's mean) for each of `obs[n, obs_size]`, as the environment's step
        takes it."""
        return self.model.greedy(params, obs)
