"""Small algorithms for tests: not PPO, so the semantics are tested on their own."""

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

import fragc


@struct.dataclass
class Data:
    x: jax.Array  # [n, 3]
    key: jax.Array  # [n] per-environment keys


@struct.dataclass
class State:
    w: jax.Array  # [3]
    data: Data
    step: jax.Array


TRUE_W = jnp.array([1.0, -2.0, 0.5])


class Regression:
    """An 'actor' samples noisy linear data per environment; a 'learner' takes an SGD step."""

    def __init__(self, num_envs: int = 8, lr: float = 0.1):
        self.num_envs, self.lr = num_envs, lr

    def init(self, key):
        k_w, k_x, k_env = jax.random.split(key, 3)
        data = Data(jax.random.normal(k_x, (self.num_envs, 3)), jax.random.split(k_env, self.num_envs))
        return State(jax.random.normal(k_w, (3,)), data, jnp.int32(0))

    @fragc.fragment(role="actor", in_axes=(0,), out_axes=(0, 0))
    def sample(self, data):
        keys = jax.vmap(jax.random.split)(data.key)
        x = jax.vmap(lambda k: jax.random.normal(k, (3,)))(keys[:, 0])
        y = x @ TRUE_W + 0.1 * jax.vmap(lambda k: jax.random.normal(k))(keys[:, 1])
        return y, Data(x, keys[:, 0])

    @fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=(None, None))
    def learn(self, w, x, y):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        grad = fragc.pmean(grad)
        return w - self.lr * grad, {"loss": fragc.pmean(loss)}

    def iteration(self, state):
        y, data = self.sample(state.data)
        w, metrics = self.learn(state.w, data.x, y)
        return State(w, data, state.step + 1), metrics


def regression_by_hand(state, replicas, lr=0.1):
    """The same iteration written with plain split + vmap + mean, no fragc."""
    keys = jax.vmap(jax.random.split)(state.data.key)
    x = jax.vmap(lambda k: jax.random.normal(k, (3,)))(keys[:, 0])
    y = x @ TRUE_W + 0.1 * jax.vmap(lambda k: jax.random.normal(k))(keys[:, 1])
    xs = x.reshape(replicas, -1, 3)
    ys = y.reshape(replicas, -1)
    losses, grads = jax.vmap(jax.value_and_grad(lambda w, x, y: jnp.mean((x @ w - y) ** 2)), in_axes=(None, 0, 0))(
        state.w, xs, ys)
    w = state.w - lr * grads.mean(0)
    return State(w, Data(x, keys[:, 0]), state.step + 1), {"loss": losses.mean()}


@dataclasses.dataclass(frozen=True)
class RegressionConfig:
    lr: float = 0.1
    num_envs: int = 8


class UsersRegression(Regression):
    """A user's algorithm in the documented pattern: hyperparameters in `self.config`, read where used."""

    def __init__(self, config: RegressionConfig = RegressionConfig()):
        self.num_envs, self.config = config.num_envs, config

    @property
    def lr(self):  # Regression.learn reads self.lr inside the fragment: here, the config's value
        return self.config.lr


class JittedUpdateRegression(UsersRegression):
    """The user's learner applies its step through a `jax.jit` of a bound method, made once in `__init__`, that
    reads the config."""

    def __init__(self, config: RegressionConfig = RegressionConfig()):
        super().__init__(config)
        self.update = jax.jit(self._update)

    def _update(self, w, grad):
        return w - self.config.lr * grad

    @fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=(None, None))
    def learn(self, w, x, y):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return self.update(w, fragc.pmean(grad)), {"loss": fragc.pmean(loss)}
