"""A rewrite: PPO written the way PureJaxRL writes it (purejaxrl/ppo.py), independently of fragc's PPO. It is not
PureJaxRL's code, and measured about 1.4x slower than the file it imitates: speed goals are set against PureJaxRL's
own ppo.py (bench/ppo_reference.py). It stays as a second row and as a port on fragc (bench/lowering.py): closures over one `make_train`,
a flax `TrainState`, one PRNG key split per step, gymnax's `LogWrapper` for
episode statistics, GAE that treats every episode end as terminal (PureJaxRL
ignores truncation), and the whole per-step info dict returned as metrics.
Nothing here comes from `fragc.algos`: only the hyperparameters are read
from a `ppo.Config`, so both sides train the same configuration.

`make_train(config)` returns `Train`: `init(key)` gives the runner state,
`update_step(runner_state, _)` one PPO iteration (rollout, GAE, epochs x
minibatches) in `lax.scan`'s convention, as PureJaxRL's `train` scans it;
`rollout` and `learn` are its two halves. `FragcPort` is the same code as
fragc fragments (what a user porting PureJaxRL to fragc writes), for
comparing fragc's lowering with plain `jax.jit` of the same iteration.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

import fragc


class ActorCritic(nn.Module):
    action_dim: int
    hidden: int = 64

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        orth, zeros = nn.initializers.orthogonal, nn.initializers.constant(0.0)
        actor = nn.tanh(nn.Dense(self.hidden, kernel_init=orth(np.sqrt(2)), bias_init=zeros)(x))
        actor = nn.tanh(nn.Dense(self.hidden, kernel_init=orth(np.sqrt(2)), bias_init=zeros)(actor))
        logits = nn.Dense(self.action_dim, kernel_init=orth(0.01), bias_init=zeros)(actor)
        critic = nn.tanh(nn.Dense(self.hidden, kernel_init=orth(np.sqrt(2)), bias_init=zeros)(x))
        critic = nn.tanh(nn.Dense(self.hidden, kernel_init=orth(np.sqrt(2)), bias_init=zeros)(critic))
        critic = nn.Dense(1, kernel_init=orth(1.0), bias_init=zeros)(critic)
        return logits, jnp.squeeze(critic, axis=-1)


class Transition(NamedTuple):
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array
    info: Any


def categorical_log_prob(logits: jax.Array, action: jax.Array) -> jax.Array:
    return jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]


def categorical_entropy(logits: jax.Array) -> jax.Array:
    log_p = jax.nn.log_softmax(logits)
    return -jnp.sum(jnp.exp(log_p) * log_p, -1)


class Train(NamedTuple):
    init: Callable
    rollout: Callable  # (params, env_state, obs, rng) -> (traj, env_state, obs, rng)
    learn: Callable  # (train_state, traj, last_obs, rng) -> (train_state, rng)
    update_step: Callable  # (runner_state, _) -> (runner_state, info)


def make_train(config: Any, reduce_grads: Callable = lambda grads: grads) -> Train:
    """PureJaxRL's `make_train`, split into its parts (see the module docstring).

    reduce_grads: applied to each minibatch's gradients (the fragc port averages them over replicas).
    """
    from gymnax.wrappers.purerl import FlattenObservationWrapper, LogWrapper
    import gymnax

    c = config
    num_updates = c.total_steps // c.num_steps // c.num_envs
    minibatch_size = c.num_envs * c.num_steps // c.num_minibatches
    env, env_params = gymnax.make(c.env)
    env = LogWrapper(FlattenObservationWrapper(env))
    network = ActorCritic(env.action_space(env_params).n, c.hidden)

    def linear_schedule(count: jax.Array) -> jax.Array:
        frac = 1.0 - (count // (c.num_minibatches * c.update_epochs)) / num_updates
        return c.lr * frac

    tx = optax.chain(
        optax.clip_by_global_norm(c.max_grad_norm),
        optax.adam(learning_rate=linear_schedule if c.anneal_lr else c.lr, eps=1e-5),
    )

    def init(rng: jax.Array) -> tuple:
        rng, _rng = jax.random.split(rng)
        params = network.init(_rng, jnp.zeros(env.observation_space(env_params).shape))
        train_state = TrainState.create(apply_fn=network.apply, params=params, tx=tx)
        rng, _rng = jax.random.split(rng)
        obsv, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(_rng, c.num_envs), env_params)
        return train_state, env_state, obsv, rng

    # COLLECT TRAJECTORIES
    def rollout(params: Any, env_state: Any, obs: jax.Array, rng: jax.Array) -> tuple:
        def _env_step(runner_state: tuple, unused: Any) -> tuple[tuple, Transition]:
            env_state, last_obs, rng = runner_state
            rng, _rng = jax.random.split(rng)
            logits, value = network.apply(params, last_obs)
            action = jax.random.categorical(_rng, logits)
            log_prob = categorical_log_prob(logits, action)
            rng, _rng = jax.random.split(rng)
            rng_step = jax.random.split(_rng, c.num_envs)
            obsv, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                rng_step, env_state, action, env_params)
            done = jnp.logical_or(terminated, truncated)
            transition = Transition(done, action, value, reward, log_prob, last_obs, info)
            return (env_state, obsv, rng), transition

        (env_state, obs, rng), traj_batch = jax.lax.scan(_env_step, (env_state, obs, rng), None, c.num_steps)
        return traj_batch, env_state, obs, rng

    def learn(train_state: TrainState, traj_batch: Transition, last_obs: jax.Array, rng: jax.Array) -> tuple:
        # CALCULATE ADVANTAGE
        _, last_val = network.apply(train_state.params, last_obs)

        def _get_advantages(gae_and_next_value: tuple, transition: Transition) -> tuple[tuple, jax.Array]:
            gae, next_value = gae_and_next_value
            done, value, reward = transition.done, transition.value, transition.reward
            delta = reward + c.gamma * next_value * (1 - done) - value
            gae = delta + c.gamma * c.gae_lambda * (1 - done) * gae
            return (gae, value), gae

        _, advantages = jax.lax.scan(_get_advantages, (jnp.zeros_like(last_val), last_val), traj_batch,
                                     reverse=True, unroll=16)
        targets = advantages + traj_batch.value

        # UPDATE NETWORK
        def _update_epoch(update_state: tuple, unused: Any) -> tuple[tuple, Any]:
            def _update_minbatch(train_state: TrainState, batch_info: tuple) -> tuple[TrainState, Any]:
                traj_batch, advantages, targets = batch_info

                def _loss_fn(params: Any, traj_batch: Transition, gae: jax.Array, targets: jax.Array) -> tuple:
                    logits, value = network.apply(params, traj_batch.obs)
                    log_prob = categorical_log_prob(logits, traj_batch.action)
                    value_pred_clipped = traj_batch.value + (value - traj_batch.value).clip(-c.clip_eps, c.clip_eps)
                    value_losses = jnp.square(value - targets)
                    value_losses_clipped = jnp.square(value_pred_clipped - targets)
                    value_loss = 0.5 * jnp.maximum(value_losses, value_losses_clipped).mean()
                    ratio = jnp.exp(log_prob - traj_batch.log_prob)
                    gae = (gae - gae.mean()) / (gae.std() + 1e-8)
                    loss_actor1 = ratio * gae
                    loss_actor2 = jnp.clip(ratio, 1.0 - c.clip_eps, 1.0 + c.clip_eps) * gae
                    loss_actor = -jnp.minimum(loss_actor1, loss_actor2).mean()
                    entropy = categorical_entropy(logits).mean()
                    total_loss = loss_actor + c.vf_coef * value_loss - c.ent_coef * entropy
                    return total_loss, (value_loss, loss_actor, entropy)

                grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)
                total_loss, grads = grad_fn(train_state.params, traj_batch, advantages, targets)
                train_state = train_state.apply_gradients(grads=reduce_grads(grads))
                return train_state, total_loss

            train_state, traj_batch, advantages, targets, rng = update_state
            rng, _rng = jax.random.split(rng)
            batch_size = minibatch_size * c.num_minibatches
            permutation = jax.random.permutation(_rng, batch_size)
            batch = (traj_batch, advantages, targets)
            batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), batch)
            shuffled_batch = jax.tree.map(lambda x: jnp.take(x, permutation, axis=0), batch)
            minibatches = jax.tree.map(lambda x: jnp.reshape(x, [c.num_minibatches, -1] + list(x.shape[1:])),
                                       shuffled_batch)
            train_state, total_loss = jax.lax.scan(_update_minbatch, train_state, minibatches)
            return (train_state, traj_batch, advantages, targets, rng), total_loss

        update_state = (train_state, traj_batch, advantages, targets, rng)
        update_state, loss_info = jax.lax.scan(_update_epoch, update_state, None, c.update_epochs)
        return update_state[0], update_state[-1]

    def update_step(runner_state: tuple, unused: Any) -> tuple[tuple, Any]:
        train_state, env_state, last_obs, rng = runner_state
        traj_batch, env_state, last_obs, rng = rollout(train_state.params, env_state, last_obs, rng)
        train_state, rng = learn(train_state, traj_batch, last_obs, rng)
        metric = traj_batch.info
        return (train_state, env_state, last_obs, rng), metric

    return Train(init, rollout, learn, update_step)


def fused(config: Any, iterations: int) -> tuple[Any, Any]:
    """(init, jitted k-iteration train): PureJaxRL's `jax.jit(train)` with `iterations` updates a call."""
    train = make_train(config)
    return train.init, jax.jit(lambda state: jax.lax.scan(train.update_step, state, None, iterations),
                               donate_argnums=0)


def final_return(metric: dict) -> float:
    """PureJaxRL's reported figure: the mean return of the episodes completed in the last iteration."""
    done = np.asarray(metric["returned_episode"])[-1]
    returns = np.asarray(metric["returned_episode_returns"])[-1]
    return float(returns[done].mean()) if done.any() else float("nan")


class FragcPort:
    """PureJaxRL's PPO as a fragc algorithm: its rollout and learn closures as fragments, its
    `(train_state, env_state, obs, rng)` runner state as the state, its info dict as the metrics.

    The rollout draws from one replicated key, as PureJaxRL does, so the port is for one-replica
    policies (`single`); that is all the lowering comparison needs.
    """

    def __init__(self, config: Any):
        self.config = config
        self.train = make_train(config, reduce_grads=fragc.pmean)
        self.steps_per_iteration = config.num_envs * config.num_steps

    def init(self, key: jax.Array) -> tuple:
        return self.train.init(key)

    @fragc.fragment(role="actor", in_axes=(None, 0, 0, None), out_axes=(1, 0, 0, None))
    def rollout(self, params: Any, env_state: Any, obs: jax.Array, rng: jax.Array) -> tuple:
        return self.train.rollout(params, env_state, obs, rng)

    @fragc.fragment(role="learner", in_axes=(None, 1, 0, None), out_axes=(None, None))
    def learn(self, train_state: TrainState, traj: Transition, last_obs: jax.Array, rng: jax.Array) -> tuple:
        return self.train.learn(train_state, traj, last_obs, rng)

    def iteration(self, state: tuple) -> tuple[tuple, dict]:
        train_state, env_state, obs, rng = state
        traj, env_state, obs, rng = self.rollout(train_state.params, env_state, obs, rng)
        train_state, rng = self.learn(train_state, traj, obs, rng)
        return (train_state, env_state, obs, rng), traj.info
