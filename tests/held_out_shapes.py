"""More held-out user code around fragment calls, as researchers write it (PureJaxRL, CleanRL): a fragment inside
the user's own `jax.jit` or a cached scan body, a flax TrainState fresh from `TrainState.create`, arguments that
pick code (a string, an enum, a function in a config dict), a default left out, a per-environment value computed
between fragments. Each went wrong in the frontend once (issue 42); tests/test_user_shapes.py checks what each
needed, and tests/test_control_flow.py runs them with tests/user_shapes.py's under every policy. The last four
(a `tree_util.Partial` step into a user's jit, a target fragment inside a loss, unrolled loops with nested-dict
metrics, a raw-key runner tuple) the frontend took as written when probed (2026-11-27); they stay so that it goes
on taking them. The last two (one function decorated as two fragments, an actor's batch handed whole to a buffer)
came from the next probe. Kept apart from user_shapes.py, whose line numbers the golden IRs print."""

import dataclasses
import enum
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training.train_state import TrainState

import fragc
from toy_algos import TRUE_W, Data
from user_shapes import Base, State


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


def _sgd(w, x, y, *, lr=0.1):
    return w - lr * fragc.pmean(jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w))


lambda_step = fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=None)(lambda w, x, y: _sgd(w, x, y, lr=0.05))
partial_step = fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=None)(partial(_sgd, lr=0.2))


class LambdaAndPartial(Base):
    """Fragments made by calling `fragc.fragment(...)` on a lambda (named after its role in the IR) and on a
    `functools.partial` whose keyword-only `lr` keeps the value the partial gives it (named after `_sgd`)."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w = partial_step(lambda_step(state.w, data.x, y), data.x, y)
        return self.finish(state, w, data, {"w0": w[0]})


class RunnerTuple(Base):
    """PureJaxRL's loop: the state a tuple `(w, x, rng)`, the key split in the iteration into one key per
    environment for the actor, and `x` a leaf the iteration only writes (the actor makes its next value)."""

    def init(self, key):
        return (Base.init(self, key).w, jnp.zeros((self.num_envs, 3)), key)

    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=0)
    def act(self, w, keys):
        return jax.vmap(lambda k: jax.random.normal(k, (3,)))(keys) + 0.1 * w

    def iteration(self, runner_state):
        w, _, rng = runner_state
        rng, step_rng = jax.random.split(rng)
        x = self.act(w, jax.random.split(step_rng, self.num_envs))
        w, metrics = self.learn(w, x, x @ TRUE_W, self.lr)
        return (w, x, rng), metrics


class Transition(NamedTuple):
    x: jax.Array
    y: jax.Array
    done: jax.Array


class NamedTupleTrajectory(Base):
    """A rollout's `lax.scan` stacking `Transition`s ([T, N]), axes declared as a `Transition` of axes."""

    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(Transition(1, 1, 1), 0))
    def rollout(self, w, data):
        def step(data, _):
            y, data = Base.sample.fn(self, w, data)
            return data, Transition(data.x, y, y > 0)

        data, trajectory = jax.lax.scan(step, data, None, length=4)
        return trajectory, data

    @fragc.fragment(role="learner", in_axes=(None, Transition(1, 1, 1)), out_axes=(None, None))
    def learn_trajectory(self, w, trajectory):
        x, y = trajectory.x.reshape(-1, 3), trajectory.y.reshape(-1)
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - self.lr * fragc.pmean(grad), {"loss": fragc.pmean(loss), "done": fragc.pmean(trajectory.done.mean())}

    def iteration(self, state):
        trajectory, data = self.rollout(state.w, state.data)
        w, metrics = self.learn_trajectory(state.w, trajectory)
        return self.finish(state, w, data, metrics)


def make_train(config):
    """PureJaxRL's `make_train(config)`: fragments are closures over a config dict, the algorithm a small object."""

    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(0, 0))
    def sample(w, data):
        return Base.sample.fn(None, w, data)

    @fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=(None, None))
    def update(w, x, y):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - config["LR"] * fragc.pmean(grad), {"loss": fragc.pmean(loss)}

    class Train:
        def init(self, key):
            return Base().init(key)

        def iteration(self, state):
            y, data = sample(state.w, state.data)
            w = state.w
            for _ in range(config["UPDATE_EPOCHS"]):
                w, metrics = update(w, data.x, y)
            return State(w, state.target, data, state.step + 1), metrics

    return Train()


@dataclasses.dataclass(frozen=True)
class FrozenConfig:
    lr: float = 0.1
    loss: str = "squared"


class StaticMethodsAndConfig(Base):
    """Fragments that are static methods (decorated either side of `staticmethod`), and a frozen dataclass
    config passed as an argument (bound into the body: a hashable non-array value)."""

    config = FrozenConfig()

    @fragc.fragment(role="learner", in_axes=(None, 0, 0, None), out_axes=None)
    @staticmethod
    def step_config(w, x, y, config):
        return _sgd(w, x, y, lr=config.lr)

    @staticmethod
    @fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=None)
    def step(w, x, y):
        return _sgd(w, x, y)

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w = self.step(self.step_config(state.w, data.x, y, self.config), data.x, y)
        return self.finish(state, w, data, {"w0": w[0]})


class PerEnvironmentConstant(Base):
    """A NumPy array of one value per environment passed to the actor (a constant of the graph with an axis)."""

    @fragc.fragment(role="actor", in_axes=(None, 0, 0), out_axes=(0, 0))
    def sample_offset(self, w, data, offsets):
        y, data = Base.sample.fn(self, w, data)
        return y + offsets, data

    def iteration(self, state):
        y, data = self.sample_offset(state.w, state.data, np.linspace(-0.1, 0.1, self.num_envs, dtype=np.float32))
        w, metrics = self.learn(state.w, data.x, y, self.lr)
        return self.finish(state, w, data, metrics)


@jax.jit
def two_steps(step_fn, w, x, y):
    """A user's jitted helper taking the step as a `jax.tree_util.Partial` (a pytree, so jit traces through it)."""
    w, _ = step_fn(w, x, y)
    return step_fn(w, x, y)


class TreePartialStep(Base):
    """The learner's step bound with `jax.tree_util.Partial` and passed into the user's own `jax.jit` helper."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, metrics = two_steps(jax.tree_util.Partial(self.learn, lr=jnp.float32(0.05)), state.w, data.x, y)
        return self.finish(state, w, data, metrics)


class TargetInsideLoss(Base):
    """DQN's way: a target network's fragment called inside the user's loss, under `jax.value_and_grad`, its result
    behind `stop_gradient`; the gradient step itself is the user's plain JAX between fragments."""

    @fragc.fragment(role="learner", in_axes=(None, 0), out_axes=0)
    def target_q(self, target, x):
        return x @ target

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)

        def loss_fn(w):
            target = jax.lax.stop_gradient(0.5 * y + 0.5 * self.target_q(state.target, data.x))
            return jnp.mean((data.x @ w - target) ** 2)

        loss, grad = jax.value_and_grad(loss_fn)(state.w)
        w = state.w - self.lr * grad
        return self.finish(state, w, data, {"loss": loss}, self.polyak(state.target, w))


class UnrolledAndScoped(Base):
    """Loops unrolled (`fori_loop(unroll=2)`, `scan(unroll=True)`) inside `jax.named_scope`s, and metrics as nested
    dicts (history keys `loss.mse`, `grad.norm`)."""

    @fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=(None, None))
    def learn_nested(self, w, x, y):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        grad = fragc.pmean(grad)
        return w - 0.05 * grad, {"loss": {"mse": fragc.pmean(loss)}, "grad": {"norm": jnp.linalg.norm(grad)}}

    def iteration(self, state):
        with jax.named_scope("rollout"):
            y, data = self.sample(state.w, state.data)
        with jax.named_scope("update"):
            w = jax.lax.fori_loop(0, 3, lambda i, w: self.learn(w, data.x, y, self.lr)[0], state.w, unroll=2)
            w, ms = jax.lax.scan(lambda w, _: self.learn_nested(w, data.x, y), w, None, length=2, unroll=True)
        return self.finish(state, w, data, jax.tree.map(lambda v: v[-1], ms))


class RawKeyTuple(RunnerTuple):
    """RunnerTuple's loop with a raw uint32 key (`jax.random.PRNGKey`'s) in place of a typed one."""

    def init(self, key):
        w, x, key = super().init(key)
        return w, x, jax.random.key_data(key)


def advantage(w, x):
    """A Q-like forward pass less its batch mean: what it computes depends on the batch its body sees."""
    q = x @ w
    return q - q.mean()


behaviour_advantage = fragc.fragment(role="actor", in_axes=(None, 0), out_axes=0)(advantage)
target_advantage = fragc.fragment(role="learner", in_axes=(None, None), out_axes=None)(advantage)


class SameFunctionTwoRoles(Base):
    """One plain function decorated twice, as DQN's Q-network forward pass is the actor's (batch-split) and the
    learner's target (the whole batch): two fragments, each with its own role and axes (once one, silently)."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        a_behaviour = behaviour_advantage(state.w, data.x)
        a_target = target_advantage(state.target, data.x)  # the actor's per-environment x, taken whole
        w, m = self.learn(state.w, data.x, y + 0.1 * a_target, self.lr)
        return self.finish(state, w, data, {**m, "behaviour": jnp.abs(a_behaviour).mean()})


class WholeBatchToBuffer(Base):
    """An actor's per-environment output passed straight to a fragment that declares it whole (`in_axes` None), as
    a replay buffer's `add(buffer, transitions)` takes the batch (once refused by the IR verifier)."""

    @fragc.fragment(role="buffer", in_axes=(None, None), out_axes=None)
    def add(self, target, x):
        return 0.5 * target + 0.5 * jnp.mean(x, 0)

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        target = self.add(state.target, data.x)
        w, m = self.learn(state.w, data.x, y, self.lr)
        return self.finish(state, w, data, m, target)


HELD_OUT = {
    "jit_method": JitMethod, "jit_helper": JitHelper, "scan_of_function": ScanOfFunction,
    "flax_train_state": FlaxTrainState, "static_arguments": StaticArguments, "default_left_out": DefaultLeftOut,
    "lambda_and_partial": LambdaAndPartial, "runner_tuple": RunnerTuple, "named_tuple_trajectory": NamedTupleTrajectory,
    "make_train": lambda: make_train({"LR": 0.1, "UPDATE_EPOCHS": 2}), "static_methods_and_config": StaticMethodsAndConfig,
    "per_environment_constant": PerEnvironmentConstant, "tree_partial_step": TreePartialStep,
    "target_inside_loss": TargetInsideLoss, "unrolled_and_scoped": UnrolledAndScoped, "raw_key_tuple": RawKeyTuple,
    "same_function_two_roles": SameFunctionTwoRoles, "whole_batch_to_buffer": WholeBatchToBuffer,
}
