"""PPO with discrete actions, as two fragments: `rollout` (actor) and `learn` (learner).

Defaults are PureJaxRL's CartPole-v1 configuration. The algorithm is written
only against fragc's public API and runs unchanged under every policy: batch
randomness comes from per-environment keys in the runner, and the learner's
gradient is averaged over replicas with `fragc.pmean`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

import fragc
from fragc.algos.diagnostics import approx_kl, clip_fraction, episode_metrics, explained_variance, lr_metric
from fragc.algos.envs import Runner, VecEnv, discrete_env
from fragc.algos.evaluation import EvalConfig, Evaluator, EvaluatorState
from fragc.algos.networks import NetworkChoice, PixelActorCritic, torso
from fragc.algos.run_length import RunLength
from fragc.algos.validation import algo_name
from fragc.ir.errors import FragcError


ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


@dataclasses.dataclass(frozen=True)
class Config(RunLength, EvalConfig):
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
    clip_value: bool = True
    """Also clip each value update to `clip_eps` around the rollout's values (PureJaxRL's value loss)."""
    ent_coef: float = 0.01
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    hidden: int = 64
    """Width of the two hidden layers of the actor and of the critic."""
    activation: str = "tanh"
    """Hidden-layer activation: "tanh" (PureJaxRL's CartPole network) or "relu" (its MinAtar one)."""
    network: str = "auto"
    """mlp (the two MLPs above, on the flattened observation), nature_cnn or impala_cnn (CleanRL's Atari
    actor-critic: one CNN torso, a policy and a value head), or auto: a CNN for frames (nature_cnn from 36x36,
    impala_cnn below), the MLP for vectors (docs/pixels.md)."""

    def __post_init__(self) -> None:
        self.check_fields()
        if self.activation not in ACTIVATIONS:
            raise FragcError(f"{algo_name(self)}: activation must be one of {', '.join(ACTIVATIONS)}, got "
                             f"{self.activation!r}")
        if (self.num_envs * self.num_steps) % self.num_minibatches:
            raise FragcError(f"{algo_name(self)}: num_envs * num_steps ({self.num_envs * self.num_steps}) must "
                             f"divide by num_minibatches ({self.num_minibatches})")


# ---------------------------------------------------------------- network


def dense(n: int, scale: float) -> nn.Dense:
    return nn.Dense(n, kernel_init=nn.initializers.orthogonal(scale), bias_init=nn.initializers.zeros)


class MLP(nn.Module):
    """Two hidden layers and a linear head, orthogonal init."""

    hidden: int
    out: int
    out_scale: float
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        x = act(dense(self.hidden, np.sqrt(2))(x))
        x = act(dense(self.hidden, np.sqrt(2))(x))
        return dense(self.out, self.out_scale)(x)


class ActorCritic(nn.Module):
    """Separate MLPs for the policy logits and the value.

    `value` runs the critic alone: the rollout bootstraps from V(s_{t+1}) with
    one batched critic pass over the whole trajectory instead of a second
    actor-and-critic pass per step.
    """

    num_actions: int
    hidden: int = 64
    activation: str = "tanh"

    def setup(self) -> None:
        self.actor = MLP(self.hidden, self.num_actions, 0.01, self.activation)
        self.critic = MLP(self.hidden, 1, 1.0, self.activation)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        return self.actor(obs), self.value(obs)

    def value(self, obs: jax.Array) -> jax.Array:
        return jnp.squeeze(self.critic(obs), -1)


# ---------------------------------------------------------------- state


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
class EvalState(State):
    """The state with evaluation on (`eval_every` > 0)."""

    evaluator: EvaluatorState  # the evaluator's own (src/fragc/algos/evaluation.py)


@struct.dataclass
class Transition:
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    next_obs: jax.Array | None  # s_{t+1}: the observation reached, before any reset; None when the learner does not
    # read it (`PPO.learner_reads_next_obs`)
    next_value: jax.Array  # V(s_{t+1}) under the acting parameters
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array  # terminated or truncated


def gae(traj: Transition, gamma: float, lam: float) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets over [T, N] arrays.

    A terminated step does not bootstrap; a truncated one bootstraps from the
    value of the state it reached; either way the trace stops at the episode end.
    """
    not_terminated = 1.0 - traj.terminated.astype(jnp.float32)
    not_done = 1.0 - traj.done.astype(jnp.float32)
    deltas = traj.reward + gamma * traj.next_value * not_terminated - traj.value

    def backward(carry: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        delta, keep = x
        carry = delta + gamma * lam * keep * carry
        return carry, carry

    # [T, N]: unrolled 16 steps a trip, as PureJaxRL's: the same operations and bits, an eighth of the loop's trips.
    # The agents' [T, N, A] keep the loop: unrolled, XLA fuses their multiply-adds otherwise and the last bits move.
    unroll = 16 if deltas.ndim == 2 else 1
    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, not_done), reverse=True, unroll=unroll)
    return advantages, advantages + traj.value


# ---------------------------------------------------------------- algorithm


def action_log_prob(log_probs: jax.Array, action: jax.Array) -> jax.Array:
    return jnp.take_along_axis(log_probs, action[..., None], -1)[..., 0]


class PPO(NetworkChoice):
    """Proximal policy optimisation (Schulman et al. 2017), PureJaxRL style.

    The environment is made on first use, so that constructing the algorithm
    does not start JAX (which would fix the number of simulated devices).
    """

    def __init__(self, config: Config = Config()):
        self.config = config
        self.steps_per_iteration = config.steps_per_iteration
        self.evaluator = Evaluator(config.env, self.greedy_action, config.eval_every, config.eval_episodes)

    @functools.cached_property
    def env(self) -> VecEnv:
        return discrete_env(self.config.env, algo_name(self.config), " (for continuous actions: ppo_continuous or sac)")

    @functools.cached_property
    def network(self) -> nn.Module:
        if self.network_name == "mlp":
            return ActorCritic(self.env.action_space.n, self.config.hidden, self.config.activation)
        return PixelActorCritic(torso(self.network_name, self.env.obs_shape), self.env.action_space.n)

    def apply_network(self, params: Any, obs: jax.Array, **kwargs: Any) -> Any:
        """The network on observations as the environment gives them (flattened) or as the trajectory keeps
        them (`observations.frames`)."""
        return self.network.apply(params, self.observations.frames(obs), **kwargs)

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """Built where it is used, not cached: a hyperparameter sweep traces it with each member's values."""
        return optax.chain(
            optax.clip_by_global_norm(self.config.max_grad_norm),
            optax.adam(self._learning_rate(), eps=1e-5),
        )

    def _learning_rate(self) -> Any:
        c = self.config
        if not c.anneal_lr:
            return c.lr
        updates = c.iterations * c.update_epochs * c.num_minibatches
        return optax.linear_schedule(c.lr, 0.0, updates)

    def learning_rate(self, opt_state: Any) -> dict[str, jax.Array]:
        """`{"learning_rate": ...}`: the optimizer's next update's (the schedule's value at its step count), or
        nothing where the optimizer (a user's own) keeps no schedule state."""
        return lr_metric(self._learning_rate(), opt_state)

    def init(self, key: jax.Array) -> State:
        k_params, k_env, k_learn = jax.random.split(key, 3)
        params = self.init_params(k_params)
        learner = Learner(params, self.optimizer.init(params), k_learn)
        state = State(learner, self.env.reset(k_env, self.config.num_envs))
        return self.evaluator.init(key, state, EvalState)

    def init_params(self, key: jax.Array) -> Any:
        return self.network.init(key, self.observations.zeros(1))

    def iteration(self, state: State) -> tuple[State, dict]:
        state, eval_metrics = self.evaluator.maybe_evaluate(state, self.policy_params(state))  # when due
        traj, runner, episode_metrics = self.rollout(state.learner.params, state.runner)
        learner, loss_metrics = self.update(state.learner, traj)
        return state.replace(learner=learner, runner=runner), {**episode_metrics, **loss_metrics, **eval_metrics}

    def update(self, learner: Learner, traj: Transition) -> tuple[Learner, dict]:
        """One `learn` call: the advantages once from the rollout's values, then `update_epochs` passes over it."""
        return self.learn_fragment()(learner, traj)

    def learn_fragment(self) -> Any:
        """The fragment of the update (IPPO's agents with parameters of their own have another)."""
        return self.learn

    def episode_metrics(self, runner: Runner) -> dict:
        """The rollout's episode statistics (IPPO's add the agents' own)."""
        return episode_metrics(runner)

    def episodes_ended(self, done: jax.Array) -> jax.Array:
        """How many episodes the rollout's steps ended (`done` [T, N]; IPPO's count environments', not agents')."""
        return fragc.psum(jnp.sum(done))

    # POLICY: a categorical distribution over the network's logits
    def act(self, params: Any, obs: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Sample one action per observation (one key each) -> (action, log-probability, value)."""
        logits, value = self.apply_network(params, obs)
        action = jax.vmap(jax.random.categorical)(keys, logits)
        return action, action_log_prob(jax.nn.log_softmax(logits), action), value

    def evaluate(self, params: Any, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(log-probability of `action`, entropy, value) per observation, any leading shape."""
        logits, value = self.apply_network(params, obs)
        log_probs = jax.nn.log_softmax(logits)
        return action_log_prob(log_probs, action), -jnp.sum(jnp.exp(log_probs) * log_probs, -1), value

    def value(self, params: Any, obs: jax.Array) -> jax.Array:
        """The critic alone: V(obs), any leading shape."""
        return self.apply_network(params, obs, method="value")

    def env_action(self, action: jax.Array) -> jax.Array:
        """What the environment receives for a sampled action."""
        return action

    learner_skips_next_obs = True
    """Set in the body of a class whose `learn`, `update` and `_loss` never read `Transition.next_obs`."""

    def learner_reads_next_obs(self) -> bool:
        """Whether the trajectory carries s_{t+1} to the learner. PPO's learner uses V(s_{t+1}), which the rollout
        computes, so its trajectory holds no `next_obs` (None): with Atari frames, half the bytes that cross. A
        subclass whose `learn`, `update` or `_loss` is its own (IMPALA's learn, a user's) keeps it, unless that
        class's body sets `learner_skips_next_obs = True`."""
        def skips(method: str) -> bool:
            owner = next(c for c in type(self).__mro__ if method in c.__dict__)
            return owner.__dict__.get("learner_skips_next_obs", False)

        return not all(skips(m) for m in ("learn", "update", "_loss"))

    # COLLECT TRAJECTORIES
    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None))
    def rollout(self, params: Any, runner: Runner) -> tuple[Transition, Runner, dict]:
        def step(runner: Runner, _: None) -> tuple[Runner, tuple]:
            keys = jax.vmap(lambda k: jax.random.split(k, 3))(runner.key)  # acting, environment step, carried
            obs = self.observations.frames(runner.obs)  # a CNN's frames stay frames, uint8 ones uint8
            action, log_prob, value = self.act(params, obs, keys[:, 0])
            runner, out = self.env.step(runner.replace(key=keys[:, 2]), self.env_action(action), keys[:, 1])
            return runner, (obs, action, log_prob, value, self.observations.frames(out.final_obs), out.reward,
                            out.terminated, out.episode_done)

        runner, (obs, action, log_prob, value, next_obs, reward, terminated, done) = jax.lax.scan(
            step, runner, None, self.config.num_steps)
        # V(s_{t+1}) for every step at once: a truncated episode bootstraps from the state it reached
        next_value = self.value(params, next_obs)
        if not self.learner_reads_next_obs():  # the learner needs V(s_{t+1}) only: frames cross once
            next_obs = None
        traj = Transition(obs, action, log_prob, value, next_obs, next_value, reward, terminated, done)
        metrics = {**self.episode_metrics(runner), "episodes": self.episodes_ended(traj.done)}
        return traj, runner, metrics

    # UPDATE NETWORK: the advantages once, then `update_epochs` passes over the rollout in shuffled minibatches
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, traj: Transition) -> tuple[Learner, dict]:
        c = self.config
        advantages, targets = gae(traj, c.gamma, c.gae_lambda)  # from the rollout's values: the same every epoch
        batch = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), (traj, advantages, targets))

        def minibatch_step(learner: Learner, mb: Any) -> tuple[Learner, dict]:
            grads, metrics = jax.grad(self._loss, has_aux=True)(learner.params, *mb)
            grads = fragc.pmean(grads)
            metrics = {**metrics, **self.learning_rate(learner.opt_state)}
            updates, opt_state = self.optimizer.update(grads, learner.opt_state, learner.params)
            params = optax.apply_updates(learner.params, updates)
            return learner.replace(params=params, opt_state=opt_state), metrics

        def epoch(learner: Learner, _: None) -> tuple[Learner, dict]:
            key, perm_key = jax.random.split(learner.key)
            perm = jax.random.permutation(perm_key, advantages.shape[0] * advantages.shape[1])  # T x N steps (of all agents)
            shuffled = jax.tree.map(lambda x: x[perm].reshape((c.num_minibatches, -1) + x.shape[1:]), batch)
            learner, metrics = jax.lax.scan(minibatch_step, learner.replace(key=key), shuffled, unroll=self.unroll)
            return learner, fragc.pmean(jax.tree.map(jnp.mean, metrics))

        learner, metrics = jax.lax.scan(epoch, learner, None, c.update_epochs, unroll=self.unroll)
        metrics = jax.tree.map(jnp.mean, metrics)  # over epochs
        return learner, {**metrics, "explained_variance": explained_variance(targets, traj.value)}

    def _loss(self, params: Any, traj: Transition, advantages: jax.Array, targets: jax.Array) -> tuple[jax.Array, dict]:
        c = self.config
        log_prob, entropy, value = self.evaluate(params, traj.obs, traj.action)
        entropy = jnp.mean(entropy)

        if c.clip_value:
            value_clipped = traj.value + jnp.clip(value - traj.value, -c.clip_eps, c.clip_eps)
            value_loss = 0.5 * jnp.mean(jnp.maximum((value - targets) ** 2, (value_clipped - targets) ** 2))
        else:
            value_loss = 0.5 * jnp.mean((value - targets) ** 2)

        log_ratio = log_prob - traj.log_prob
        ratio = jnp.exp(log_ratio)
        adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        actor_loss = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - c.clip_eps, 1 + c.clip_eps) * adv))

        loss = actor_loss + c.vf_coef * value_loss - c.ent_coef * entropy
        return loss, {"loss": loss, "actor_loss": actor_loss, "value_loss": value_loss, "entropy": entropy,
                      "approx_kl": approx_kl(log_ratio), "clip_fraction": clip_fraction(ratio, c.clip_eps)}

    # THE DETERMINISTIC POLICY: what evaluation episodes and videos act with
    def policy_params(self, state: State) -> Any:
        """The parameters the actors act with."""
        return state.learner.params

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        """The most probable action for each of `obs[n, obs_size]`, as the environment's step takes it."""
        logits, _ = self.apply_network(params, obs)
        return self.env_action(jnp.argmax(logits, -1))
