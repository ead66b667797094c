"""SAC: soft actor-critic with twin Q networks and an automatic entropy temperature, three roles (actor, buffer,
learner).

Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications". The actors act with a tanh-squashed
Gaussian policy (uniform random actions before `learning_starts`) and hand their transitions to the replay
buffer (src/fragc/algos/replay.py, DQN's buffer: batched over environments, so a policy may keep it beside the actors
or the learner). The learner samples `utd_ratio` gradient steps per environment step; each step updates
  - the twin critics towards r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s')), a' ~ pi(s'),
    with Q' the target critics;
  - the actor to minimise alpha log pi(a|s) - min_i Q_i(s, a), a ~ pi(s) reparameterised, with the new critics;
  - the temperature: log alpha descends -alpha (log pi(a|s) + target_entropy), target_entropy = -|A|,
    so alpha grows while the policy's entropy is below the target and shrinks above it;
  - the target critics by Polyak averaging, Q' <- tau Q + (1 - tau) Q'.
Actor, critics and temperature have optimizers of their own. Defaults are CleanRL's sac_continuous_action.py (its
256x256 networks, learning rates, tau, 5000 random steps and 1e6 buffer; the Config's fields say where they differ),
with the actor updated at every critic step (the paper's schedule; CleanRL's policy_frequency 2 makes two actor
steps every second critic step).

It runs under every built-in policy. SAC is off-policy: under `actor_learner_async` the actors act with
parameters one iteration old, which only changes which transitions reach the buffer. With R learner replicas
each replica samples its share of every batch from its own environments' columns and draws its own noise
(the replica index is folded into the learner's key); gradients are averaged with `fragc.pmean`.
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
from fragc.algos.diagnostics import episode_metrics
from fragc.algos.envs import Runner, VecEnv, single_agent_env
from fragc.algos.evaluation import EvalConfig, Evaluator
from fragc.algos import replay
from fragc.algos.replay import BUFFER_AXES, Buffer, Transition
from fragc.algos.run_length import RunLength
from fragc.algos.validation import FRACTION, NON_NEGATIVE, POSITIVE
from fragc.ir.errors import FragcError

RANGES = {"tau": FRACTION, "policy_lr": POSITIVE, "q_lr": POSITIVE, "alpha_lr": POSITIVE, "alpha": NON_NEGATIVE,
          "utd_ratio": POSITIVE}
"""SAC's own fields' ranges (validation.RANGES has the shared ones: gamma, learning_starts, hidden)."""


@dataclasses.dataclass(frozen=True)
class Config(RunLength, EvalConfig):
    env: str = "Pendulum-v1"
    """Environment: a gymnax id, or BACKEND:ID for a host backend (fragc envs); continuous (Box) actions."""
    num_envs: int = 8
    """Environments stepped in parallel (CleanRL: 1; 8 divides by the replicas of every built-in policy)."""
    num_steps: int = 1
    """Vector steps per iteration; the actors act with the parameters of the iteration's start."""
    total_steps: int = 20_000
    """Environment steps over the whole run (RL Baselines3 Zoo's Pendulum-v1 budget; CleanRL's MuJoCo: 1e6)."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions (over all environments)."""
    batch_size: int = 256
    """Transitions per gradient step (over all replicas)."""
    learning_starts: int = 5_000
    """Environment steps taken with uniform random actions before the actor acts and learning begins."""
    utd_ratio: float = 1.0
    """Update-to-data ratio: gradient steps per environment step (num_envs * num_steps * utd_ratio per
    iteration, a whole number)."""
    policy_lr: float = 3e-4
    """Adam learning rate of the actor."""
    q_lr: float = 1e-3
    """Adam learning rate of the twin critics."""
    alpha_lr: float = 1e-3
    """Adam learning rate of log alpha, the entropy temperature (CleanRL uses q_lr)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak averaging coefficient of the target critics (1: copy the critics every step)."""
    alpha: float = 0.2
    """Entropy temperature when autotune is off (with autotune, alpha starts at 1: log alpha from 0)."""
    autotune: bool = True
    """Tune alpha towards the target entropy -|A| (Haarnoja et al. 2018, section 5)."""
    hidden: int = 256
    """Width of the two hidden layers of the actor and of each critic."""
    unroll: int = 0
    """Gradient steps unrolled in the learner's loop (`lax.scan`'s `unroll`; the numbers agree to rounding).
    0 picks by JAX's default backend: all of an iteration's steps on a GPU, where the rolled loop ran at 0.80 of
    the unrolled one's speed (an H100, docs/benchmarks.md), and 1 elsewhere (on the CPU the unrolled loop takes
    about 1.6 times as long to compile)."""

    def __post_init__(self) -> None:
        self.check_fields()
        for name, allowed in RANGES.items():
            value = getattr(self, name)
            if not allowed.holds(value):
                raise FragcError(f"sac: {name} must be {allowed}, got {value:g}")
        updates = self.utd_ratio * self.steps_per_iteration
        if updates < 1 or updates != int(updates):
            raise FragcError(f"sac: utd_ratio * num_envs * num_steps ({updates:g}) must be a whole number of gradient "
                             "steps per iteration, at least 1")
        if self.buffer_size < self.steps_per_iteration:
            raise FragcError("sac: buffer_size must hold at least one rollout (num_envs * num_steps)")

    @property
    def gradient_steps(self) -> int:
        return int(self.utd_ratio * self.steps_per_iteration)


# ---------------------------------------------------------------- networks

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
TORCH_INIT = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
"""PyTorch's default nn.Linear weights, which CleanRL keeps: uniform in +-1/sqrt(fan_in) (biases start at 0 here)."""


def dense(features: int) -> nn.Dense:
    return nn.Dense(features, kernel_init=TORCH_INIT)


class Actor(nn.Module):
    """Two relu layers, then the Gaussian's mean and log std (tanh-squashed into [LOG_STD_MIN, LOG_STD_MAX])."""

    action_dim: int
    hidden: int = 256

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = nn.relu(dense(self.hidden)(obs))
        x = nn.relu(dense(self.hidden)(x))
        mean = dense(self.action_dim)(x)
        log_std = jnp.tanh(dense(self.action_dim)(x))
        return mean, LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)


class QNetwork(nn.Module):
    """Q(s, a): the observation and action concatenated, two relu layers, one output."""

    hidden: int = 256

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs, action], -1)
        x = nn.relu(dense(self.hidden)(x))
        x = nn.relu(dense(self.hidden)(x))
        return dense(1)(x)[..., 0]


def polyak(online: Any, target: Any, tau: jax.Array | float) -> Any:
    """The target parameters moved a fraction `tau` of the way to the online ones."""
    return jax.tree.map(lambda p, t: tau * p + (1.0 - tau) * t, online, target)


# ---------------------------------------------------------------- state


@struct.dataclass
class Learner:
    actor: Any
    critic: Any  # the twin critics' parameters, stacked: every leaf [2, ...]
    target_critic: Any
    log_alpha: jax.Array
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any
    key: jax.Array  # replicated: batches' noise (each replica folds its index in)
    env_steps: jax.Array


@struct.dataclass
class State:
    learner: Learner
    runner: Runner
    buffer: Buffer


# ---------------------------------------------------------------- algorithm


class SAC:
    """Soft actor-critic (Haarnoja et al. 2018) for continuous actions, CleanRL style."""

    def __init__(self, config: Config = Config()):
        self.config = config
        self.steps_per_iteration = config.steps_per_iteration
        self.evaluator = Evaluator(config.env, self.greedy_action, config.eval_every, config.eval_episodes)

    @functools.cached_property
    def env(self) -> VecEnv:
        env = single_agent_env(self.config.env, "sac")
        if env.is_discrete():
            raise FragcError(f"sac supports continuous (Box) action spaces; {self.config.env} is discrete "
                             "(use dqn, pqn or ppo)")
        return env

    @functools.cached_property
    def action_dim(self) -> int:
        return int(np.prod(self.env.action_space.shape))

    @functools.cached_property
    def actor(self) -> Actor:
        return Actor(self.action_dim, self.config.hidden)

    @functools.cached_property
    def critic(self) -> QNetwork:
        return QNetwork(self.config.hidden)

    # Optimizers are built where they are used, from the config of the moment (a sweep traces it per member).
    def actor_optimizer(self) -> optax.GradientTransformation:
        return optax.adam(self.config.policy_lr)

    def critic_optimizer(self) -> optax.GradientTransformation:
        return optax.adam(self.config.q_lr)

    def alpha_optimizer(self) -> optax.GradientTransformation:
        return optax.adam(self.config.alpha_lr)

    @property
    def target_entropy(self) -> float:
        return -float(self.action_dim)

    def init(self, key: jax.Array) -> State:
        c = self.config
        k_actor, k_critic, k_env, k_learn = jax.random.split(key, 4)
        obs = jnp.zeros((1, self.env.obs_size))
        actor = self.actor.init(k_actor, obs)
        critic = jax.vmap(self.critic.init, in_axes=(0, None, None))(
            jax.random.split(k_critic), obs, jnp.zeros((1, self.action_dim)))
        log_alpha = jnp.zeros((), jnp.float32)
        learner = Learner(actor, critic, critic, log_alpha, self.actor_optimizer().init(actor),
                          self.critic_optimizer().init(critic), self.alpha_optimizer().init(log_alpha), k_learn,
                          jnp.int32(0))
        runner = self.env.reset(k_env, c.num_envs)
        obs = jax.ShapeDtypeStruct((c.num_envs, self.env.obs_size), jnp.float32)
        scalar = lambda dtype: jax.ShapeDtypeStruct((c.num_envs,), dtype)  # noqa: E731
        step = Transition(obs, jax.ShapeDtypeStruct((c.num_envs, self.action_dim), jnp.float32), scalar(jnp.float32),
                          obs, scalar(bool))
        state = State(learner, runner, replay.empty(step, c.buffer_size, c.num_envs))
        return self.evaluator.init(key, state)

    def iteration(self, state: State) -> tuple[State, dict]:
        state, eval_metrics = self.evaluator.maybe_evaluate(state, self.policy_params(state))  # when due
        traj, runner, metrics = self.rollout(state.learner.actor, state.learner.env_steps, state.runner)
        buffer = self.insert(state.buffer, traj)
        key, sample_key = jax.random.split(state.learner.key)
        batches = self.sample(buffer, sample_key)
        learner, losses = self.learn(state.learner.replace(key=key), batches)
        state = state.replace(learner=learner, runner=runner, buffer=buffer)
        return state, {**metrics, **losses, **eval_metrics}

    # REPLAY BUFFER (replay.py): a rollout in, one batch per gradient step out
    @fragc.fragment(role="buffer", in_axes=(BUFFER_AXES, 1), out_axes=BUFFER_AXES)
    def insert(self, buffer: Buffer, traj: Transition) -> Buffer:
        return replay.insert(buffer, traj)

    @fragc.fragment(role="buffer", in_axes=(BUFFER_AXES, None), out_axes=1)
    def sample(self, buffer: Buffer, key: jax.Array) -> Transition:
        c = self.config
        return replay.sample(buffer, key, c.gradient_steps, c.batch_size, c.num_envs)

    # THE POLICY: a tanh-squashed Gaussian, scaled to the action space's bounds
    def squashed_gaussian(self, actor: Any, obs: jax.Array, noise: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(actions [n, |A|] within the bounds, their log-probabilities [n]) for standard normal `noise`
        [n, |A|]: a = tanh(mean + std * noise) * scale + bias, reparameterised (differentiable in `actor`)."""
        mean, log_std = self.actor.apply(actor, obs)
        x = mean + jnp.exp(log_std) * noise
        y = jnp.tanh(x)
        scale, bias = self.action_scale()
        gaussian = -0.5 * noise**2 - log_std - 0.5 * jnp.log(2 * jnp.pi)  # log N(x; mean, std)
        log_prob = jnp.sum(gaussian - jnp.log(scale * (1 - y**2) + 1e-6), -1)  # minus log |da/dx| (CleanRL's 1e-6)
        return y * scale + bias, log_prob

    def action_scale(self) -> tuple[jax.Array, jax.Array]:
        space = self.env.action_space
        low = jnp.broadcast_to(jnp.asarray(space.low, jnp.float32), space.shape).reshape(-1)
        high = jnp.broadcast_to(jnp.asarray(space.high, jnp.float32), space.shape).reshape(-1)
        return (high - low) / 2.0, (high + low) / 2.0

    def env_action(self, action: jax.Array) -> jax.Array:
        """[n, |A|] actions in the action space's shape."""
        return action.reshape((action.shape[0],) + tuple(self.env.action_space.shape))

    # COLLECT TRAJECTORIES: uniform random actions before learning_starts, then the stochastic policy
    @fragc.fragment(role="actor", in_axes=(None, None, 0), out_axes=(1, 0, None))
    def rollout(self, actor: Any, env_steps: jax.Array, runner: Runner) -> tuple[Transition, Runner, dict]:
        c = self.config
        scale, bias = self.action_scale()

        def step(runner: Runner, _: None) -> tuple[Runner, Transition]:
            keys = jax.vmap(lambda k: jax.random.split(k, 4))(runner.key)  # noise, random action, env, carried
            noise = jax.vmap(lambda k: jax.random.normal(k, (self.action_dim,)))(keys[:, 0])
            policy_action, _ = self.squashed_gaussian(actor, runner.obs, noise)
            uniform = jax.vmap(lambda k: jax.random.uniform(k, (self.action_dim,), minval=-1.0, maxval=1.0))(keys[:, 1])
            action = jnp.where(env_steps < c.learning_starts, uniform * scale + bias, policy_action)
            obs = runner.obs
            runner, out = self.env.step(runner.replace(key=keys[:, 3]), self.env_action(action), keys[:, 2])
            return runner, Transition(obs, action, out.reward, out.final_obs, out.terminated)

        runner, traj = jax.lax.scan(step, runner, None, c.num_steps)
        metrics = episode_metrics(runner)
        return traj, runner, metrics

    # UPDATE NETWORKS: `gradient_steps` steps of critics, actor, temperature and target critics
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, batches: Transition) -> tuple[Learner, dict]:
        c = self.config
        env_steps = learner.env_steps + c.steps_per_iteration
        none = {name: 0.0 for name in ("qf_loss", "actor_loss", "alpha_loss", "entropy", "qf1_value", "qf2_value")}
        learner, metrics = jax.lax.cond(
            env_steps > c.learning_starts,
            lambda learner: jax.lax.scan(self.update, learner, batches, unroll=self.unrolled_steps),
            lambda learner: (learner, jax.tree.map(lambda x: jnp.zeros(c.gradient_steps), none)),
            learner)
        metrics = fragc.pmean(jax.tree.map(jnp.mean, metrics))
        return learner.replace(env_steps=env_steps), {**metrics, "alpha": self.alpha(learner.log_alpha)}

    @property
    def unrolled_steps(self) -> int:
        """Gradient steps the learner's loop unrolls: `Config.unroll`, its 0 resolved by the default backend."""
        c = self.config
        if c.unroll:
            return min(c.unroll, c.gradient_steps)
        return c.gradient_steps if jax.default_backend() == "gpu" else 1

    def alpha(self, log_alpha: jax.Array) -> jax.Array:
        return jnp.exp(log_alpha) if self.config.autotune else jnp.asarray(self.config.alpha, jnp.float32)

    def update(self, learner: Learner, batch: Transition) -> tuple[Learner, dict]:
        """One gradient step on a batch ([per replica batch, ...] leaves)."""
        c = self.config
        key, noise_key = jax.random.split(learner.key)
        replica = jax.lax.axis_index(fragc.REPLICA)  # each replica its own noise for its share of the batch
        next_noise, actor_noise, alpha_noise = jax.random.normal(jax.random.fold_in(noise_key, replica),
                                                                 (3,) + batch.action.shape)
        alpha = self.alpha(learner.log_alpha)

        # the twin critics, towards the soft Bellman target of the target critics
        (qf_loss, q), grads = jax.value_and_grad(self.critic_loss, has_aux=True)(
            learner.critic, learner.target_critic, learner.actor, alpha, batch, next_noise)
        updates, critic_opt = self.critic_optimizer().update(fragc.pmean(grads), learner.critic_opt, learner.critic)
        critic = optax.apply_updates(learner.critic, updates)

        # the actor, against the updated critics
        (actor_loss, log_prob), grads = jax.value_and_grad(self.actor_loss, has_aux=True)(
            learner.actor, critic, alpha, batch.obs, actor_noise)
        updates, actor_opt = self.actor_optimizer().update(fragc.pmean(grads), learner.actor_opt, learner.actor)
        actor = optax.apply_updates(learner.actor, updates)

        # the temperature, from the updated actor's log-probabilities
        log_alpha, alpha_opt, alpha_loss = learner.log_alpha, learner.alpha_opt, jnp.float32(0.0)
        if c.autotune:
            _, log_prob_new = self.squashed_gaussian(actor, batch.obs, alpha_noise)
            alpha_loss, grad = jax.value_and_grad(self.alpha_loss)(learner.log_alpha, log_prob_new)
            updates, alpha_opt = self.alpha_optimizer().update(fragc.pmean(grad), learner.alpha_opt, learner.log_alpha)
            log_alpha = optax.apply_updates(learner.log_alpha, updates)

        learner = learner.replace(actor=actor, critic=critic, target_critic=polyak(critic, learner.target_critic, c.tau),
                                  log_alpha=log_alpha, actor_opt=actor_opt, critic_opt=critic_opt,
                                  alpha_opt=alpha_opt, key=key)
        metrics = {"qf_loss": qf_loss, "actor_loss": actor_loss, "alpha_loss": alpha_loss,
                   "entropy": -jnp.mean(log_prob), "qf1_value": jnp.mean(q[0]), "qf2_value": jnp.mean(q[1])}
        return learner, metrics

    def q_values(self, critic: Any, obs: jax.Array, action: jax.Array) -> jax.Array:
        """[2, n]: both critics' Q(obs, action)."""
        return jax.vmap(self.critic.apply, in_axes=(0, None, None))(critic, obs, action)

    def soft_target(self, target_critic: Any, actor: Any, alpha: jax.Array, batch: Transition,
                    noise: jax.Array) -> jax.Array:
        """r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s')), a' ~ pi(s') (no gradient)."""
        next_action, next_log_prob = self.squashed_gaussian(actor, batch.next_obs, noise)
        next_q = jnp.min(self.q_values(target_critic, batch.next_obs, next_action), 0) - alpha * next_log_prob
        target = batch.reward + self.config.gamma * (1.0 - batch.terminated) * next_q
        return jax.lax.stop_gradient(target)

    def critic_loss(self, critic: Any, target_critic: Any, actor: Any, alpha: jax.Array, batch: Transition,
                    noise: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Both critics' mean squared errors, summed (CleanRL's qf1_loss + qf2_loss), and their Q(s, a) [2, n]."""
        target = self.soft_target(target_critic, actor, alpha, batch, noise)
        q = self.q_values(critic, batch.obs, batch.action)
        return jnp.sum(jnp.mean((q - target) ** 2, -1)), q

    def actor_loss(self, actor: Any, critic: Any, alpha: jax.Array, obs: jax.Array,
                   noise: jax.Array) -> tuple[jax.Array, jax.Array]:
        """mean(alpha log pi(a|s) - min_i Q_i(s, a)), a ~ pi(s) reparameterised, and the log-probabilities."""
        action, log_prob = self.squashed_gaussian(actor, obs, noise)
        q = jnp.min(self.q_values(critic, obs, action), 0)
        return jnp.mean(alpha * log_prob - q), log_prob

    def alpha_loss(self, log_alpha: jax.Array, log_prob: jax.Array) -> jax.Array:
        """mean(-alpha (log pi + target_entropy)): its gradient raises alpha while the entropy -log pi is below
        the target entropy, and lowers it above."""
        return jnp.mean(-jnp.exp(log_alpha) * (jax.lax.stop_gradient(log_prob) + self.target_entropy))

    # THE DETERMINISTIC POLICY: what evaluation episodes and videos act with
    def policy_params(self, state: State) -> Any:
        return state.learner.actor

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        """The squashed Gaussian's mean for each of `obs[n, obs_size]`: tanh(mean) * scale + bias."""
        mean, _ = self.actor.apply(params, obs)
        scale, bias = self.action_scale()
        return self.env_action(jnp.tanh(mean) * scale + bias)
