"""What researchers write around fragment calls: constants, keyword calls, and control flow (scan, fori_loop,
while_loop, cond, switch, nested) around fragments. Each class is a whole algorithm, written as a user would, not in the
shape of the built-ins; tests/test_control_flow.py traces, compiles and checks each against the reference."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

import fragc
from toy_algos import TRUE_W, Data


@struct.dataclass
class State:
    w: jax.Array  # [3]
    target: jax.Array  # [3]: a slow copy of w
    data: Data
    step: jax.Array


class Base:
    """An actor samples noisy linear data per environment; a learner takes SGD steps on it."""

    num_envs = 8
    lr = 0.1

    def init(self, key):
        k_w, k_x, k_env = jax.random.split(key, 3)
        data = Data(jax.random.normal(k_x, (self.num_envs, 3)), jax.random.split(k_env, self.num_envs))
        w = jax.random.normal(k_w, (3,))
        return State(w, w, data, jnp.int32(0))

    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(0, 0))
    def sample(self, w, data):
        """Data drawn with the learner's weights in it, as a policy's would be."""
        keys = jax.vmap(jax.random.split)(data.key)
        x = jax.vmap(lambda k: jax.random.normal(k, (3,)))(keys[:, 0]) + 0.1 * w
        y = x @ TRUE_W + 0.1 * jax.vmap(lambda k: jax.random.normal(k))(keys[:, 1])
        return y, Data(x, keys[:, 0])

    @fragc.fragment(role="learner", in_axes=(None, 0, 0, None), out_axes=(None, None))
    def learn(self, w, x, y, lr):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - lr * fragc.pmean(grad), {"loss": fragc.pmean(loss)}

    @fragc.fragment(role="learner", in_axes=(None, None), out_axes=None)
    def polyak(self, target, w):
        return 0.5 * target + 0.5 * w

    def finish(self, state, w, data, metrics, target=None):
        target = state.target if target is None else target
        return State(w, target, data, state.step + 1), metrics


class ConstFloat(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, 0.05)  # a Python float
        return self.finish(state, w, data, m)


class JnpScalar(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, jnp.float32(self.lr))  # a jnp literal
        return self.finish(state, w, data, m)


class NumpyScalar(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, np.float32(self.lr))
        return self.finish(state, w, data, m)


class ConstMetric(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, self.lr)
        return self.finish(state, w, data, {**m, "const": 1.0, "lr": jnp.float32(self.lr)})


class IntMetric(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, self.lr)
        return self.finish(state, w, data, {**m, "step": state.step, "envs": self.num_envs})


class Keywords(Base):
    def iteration(self, state):
        y, data = self.sample(data=state.data, w=state.w)
        w, m = self.learn(state.w, y=y, x=data.x, lr=self.lr)
        return self.finish(state, w, data, m)


class TwoCalls(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, _ = self.learn(state.w, data.x, y, self.lr)
        w, m = self.learn(w, data.x, y, self.lr)
        return self.finish(state, w, data, m)


class Scan(Base):
    """Three SGD steps an iteration, as a scan over a learner fragment."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)

        def step(w, _):
            return self.learn(w, data.x, y, self.lr)

        w, ms = jax.lax.scan(step, state.w, None, length=3)
        return self.finish(state, w, data, jax.tree.map(jnp.mean, ms))


class ForiLoop(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w = jax.lax.fori_loop(0, 3, lambda i, w: self.learn(w, data.x, y, self.lr)[0], state.w)
        return self.finish(state, w, data, {"w0": w[0]})


class CondSync(Base):
    """A target synced every second iteration (DQN's target network)."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, self.lr)
        target = jax.lax.cond(state.step % 2 == 0, lambda: self.polyak(state.target, w), lambda: state.target)
        return self.finish(state, w, data, m, target)


class Switch(Base):
    """One of three updates, by the iteration counter."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        branches = [lambda w: self.learn(w, data.x, y, 0.1)[0],
                    lambda w: self.learn(w, data.x, y, 0.01)[0],
                    lambda w: self.polyak(w, state.target)]
        w = jax.lax.switch(state.step % 3, branches, state.w)
        return self.finish(state, w, data, {"w0": w[0]})


class Nested(Base):
    """A cond inside a scan: a Polyak update after every second of four SGD steps."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)

        def step(carry, i):
            w, target = carry
            w, m = self.learn(w, data.x, y, self.lr)
            target = jax.lax.cond(i % 2 == 1, lambda: self.polyak(target, w), lambda: target)
            return (w, target), m["loss"]

        (w, target), losses = jax.lax.scan(step, (state.w, state.target), jnp.arange(4))
        return self.finish(state, w, data, {"loss": losses[-1], "first": losses[0]}, target)


class ActorLearnerScan(Base):
    """A scan whose body samples (actor) and learns (learner): under actor_learner it spans both groups."""

    def iteration(self, state):
        def step(carry, _):
            w, data = carry
            y, data = self.sample(w, data)
            w, m = self.learn(w, data.x, y, self.lr)
            return (w, data), m

        (w, data), ms = jax.lax.scan(step, (state.w, state.data), None, length=3)
        return self.finish(state, w, data, {"loss": ms["loss"][-1]})


class ScanMinibatches(Base):
    """A reversed scan over minibatches of the sampled data (xs with an environment axis) and the trip index."""

    num_envs = 16  # minibatches of 8: one environment for each of 8 replicas

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        xs = (data.x.reshape(2, self.num_envs // 2, 3), y.reshape(2, self.num_envs // 2), jnp.arange(2.0))

        def step(w, mb):
            x, y, i = mb
            w, m = self.learn(w, x, y, 0.1 / (1.0 + i))
            return w, m["loss"]

        w, losses = jax.lax.scan(step, state.w, xs, reverse=True)
        return self.finish(state, w, data, {"loss": losses[0]})


class SpanningCond(Base):
    """Branches on two groups under actor_learner: an evaluation-like sample in one, a learner step in the other."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, self.lr)

        def evaluate():
            y_eval, _ = self.sample(w, data)
            return jnp.mean(y_eval)

        def extra_step():
            return self.learn(w, data.x, y, 0.01)[1]["loss"]

        score = jax.lax.cond(state.step % 2 == 0, evaluate, extra_step)
        return self.finish(state, w, data, {**m, "score": score})


class WhileLoss(Base):
    """SGD steps until the loss falls under a bound, at most five: a while_loop around a learner fragment (its
    trip count is data, "update until the KL passes a bound")."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)

        def cond(carry):
            _, loss, n = carry
            return (loss > 0.5) & (n < 5)

        def body(carry):
            w, _, n = carry
            w, m = self.learn(w, data.x, y, self.lr)
            return w, m["loss"], n + 1

        w, loss, n = jax.lax.while_loop(cond, body, (state.w, jnp.float32(jnp.inf), jnp.int32(0)))
        return self.finish(state, w, data, {"loss": loss, "updates": n})


class WhileSpanning(Base):
    """A while_loop whose body samples (actor) and learns (learner), two or three trips by the iteration counter
    (its condition reads a constant of its own): under actor_learner it spans both groups."""

    def iteration(self, state):
        trips = 2 + state.step % 2

        def cond(carry):
            return carry[2] < trips

        def body(carry):
            w, data, n, _ = carry
            y, data = self.sample(w, data)
            w, m = self.learn(w, data.x, y, self.lr)
            return w, data, n + 1, m["loss"]

        w, data, n, loss = jax.lax.while_loop(cond, body, (state.w, state.data, jnp.int32(0), jnp.float32(0)))
        return self.finish(state, w, data, {"loss": loss, "trips": n})


class SwitchSpanning(Base):
    """A three-way switch on the actor's result (how many environments drew a positive reward), whose cases span
    both groups under actor_learner: one calls no fragment (it passes the learner's step through), one samples on
    the actors, one takes another learner step."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, self.lr)
        case = jnp.sum(y > 0) % 3

        def keep():
            return w, m["loss"]

        def evaluate():
            y_eval, _ = self.sample(w, data)
            return w, jnp.mean(y_eval)

        def extra_step():
            w_extra, m_extra = self.learn(w, data.x, y, 0.01)
            return w_extra, m_extra["loss"]

        w, score = jax.lax.switch(case, [keep, evaluate, extra_step])
        return self.finish(state, w, data, {**m, "score": score, "case": case})


SHAPES = {
    "const_float": ConstFloat, "jnp_scalar": JnpScalar, "numpy_scalar": NumpyScalar, "const_metric": ConstMetric,
    "int_metric": IntMetric, "keywords": Keywords, "two_calls": TwoCalls, "scan": Scan, "fori_loop": ForiLoop,
    "cond": CondSync, "switch": Switch, "nested": Nested, "actor_learner_scan": ActorLearnerScan,
    "scan_minibatches": ScanMinibatches, "spanning_cond": SpanningCond, "while_loss": WhileLoss,
    "while_spanning": WhileSpanning, "switch_spanning": SwitchSpanning,
}
