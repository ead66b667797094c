"""More held-out user code around fragment calls, as researchers write it (PureJaxRL, CleanRL): a fragment inside
the user's own `jax.jit` or a cached scan body, a flax TrainState fresh from `TrainState.create`, arguments that
pick code (a string, an enum, a function in a config dict), a default left out, a per-environment value computed
between fragments. Each went wrong in the frontend once (issue 42); tests/test_user_shapes.py checks what each
needed, and tests/test_control_flow.py runs them with tests/user_shapes.py's under every policy. Kept apart from
user_shapes.py, whose line numbers the golden IRs print."""

import enum
from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training.train_state import TrainState

import fragc
from toy_algos import Data
from user_shapes import Base


class JitMethod(Base):
    """The learner's step in a method the user jitted (`partial(jax.jit, static_argnums=0)`): JAX caches the
    method's jaxpr, which must never be one traced outside fragc (the fragment run as a plain function)."""

    @partial(jax.jit, static_argnums=0)
    def update(self, w, x, y):
        return self.learn(w, x, y, self.lr)

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.update(state.w, data.x, y)
        return self.finish(state, w, data, m)


@fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=(None, None))
def sgd_step(w, x, y):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - 0.1 * fragc.pmean(grad), {"loss": fragc.pmean(loss)}


@jax.jit
def two_sgd_steps(w, x, y):
    """A module-level jitted helper calling a module-level fragment twice: one cache entry for every algorithm."""
    w, _ = sgd_step(w, x, y)
    return sgd_step(w, x, y)


class JitHelper(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = two_sgd_steps(state.w, data.x, y)
        return self.finish(state, w, data, m)


def sgd_trip(w, xy):
    return sgd_step(w, *xy)


class ScanOfFunction(Base):
    """A module-level function as a scan's body: JAX caches the body's jaxpr by function, as it does a jit's."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, ms = jax.lax.scan(sgd_trip, state.w, (jnp.stack([data.x, data.x]), jnp.stack([y, y])))
        return self.finish(state, w, data, {"loss": ms["loss"][-1]})


@struct.dataclass
class TrainerState:
    train: TrainState
    data: Data


class FlaxTrainState(Base):
    """A flax TrainState as `TrainState.create` makes it (its `step` the Python int 0), with an optax.chain."""

    def __init__(self):
        self.tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.05))

    def init(self, key):
        state = super().init(key)
        return TrainerState(TrainState.create(apply_fn=None, params={"w": state.w}, tx=self.tx), state.data)

    @fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=(None, None))
    def update(self, train, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"] - y) ** 2))(train.params)
        return train.apply_gradients(grads=fragc.pmean(grads)), {"loss": fragc.pmean(loss), "step": train.step}

    def iteration(self, state):
        y, data = self.sample(state.train.params["w"], state.data)
        train, m = self.update(state.train, data.x, y)
        return TrainerState(train, data), m


class Loss(enum.Enum):
    SQUARED = "squared"
    HUBER = "huber"


class StaticArguments(Base):
    """Non-array arguments that pick code, bound into the body as jax.jit's static arguments: a string, an enum
    member, a function, and a config dict holding a string beside a number (the number stays an array)."""

    @fragc.fragment(role="learner", in_axes=(None, 0, 0, None, None), out_axes=(None, None))
    def fit(self, w, x, y, loss, config):
        def objective(w):
            err = config["transform"](x @ w - y)
            return jnp.mean(optax.huber_loss(err) if loss in ("huber", Loss.HUBER) else err ** 2)

        value, grad = jax.value_and_grad(objective)(w)
        return w - config["lr"] * fragc.pmean(grad), {config["name"]: fragc.pmean(value)}

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m1 = self.fit(state.w, data.x, y, "huber", {"lr": 0.1, "name": "huber", "transform": jnp.tanh})
        w, m2 = self.fit(w, data.x, y, Loss.SQUARED, {"lr": 0.05, "name": "squared", "transform": jnp.tanh})
        w, m3 = self.fit(w, data.x, y, "huber", {"lr": 0.2, "name": "huber", "transform": jnp.tanh})
        return self.finish(state, w, data, {**m1, **m2, "again": m3["huber"]})


class DefaultLeftOut(Base):
    """A parameter with a default of None, left out of a positional call (a mask that only some callers pass)."""

    @fragc.fragment(role="learner", in_axes=(None, 0, 0, 0), out_axes=(None, None))
    def masked_learn(self, w, x, y, mask=None):
        mask = jnp.ones_like(y) if mask is None else mask
        loss, grad = jax.value_and_grad(lambda w: jnp.mean(mask * (x @ w - y) ** 2))(w)
        return w - self.lr * fragc.pmean(grad), {"loss": fragc.pmean(loss)}

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.masked_learn(state.w, data.x, y)
        w, m_masked = self.masked_learn(w, data.x, y, (y > 0).astype(jnp.float32))
        return self.finish(state, w, data, {**m, "masked": m_masked["loss"]})


HELD_OUT = {
    "jit_method": JitMethod, "jit_helper": JitHelper, "scan_of_function": ScanOfFunction,
    "flax_train_state": FlaxTrainState, "static_arguments": StaticArguments, "default_left_out": DefaultLeftOut,
}
