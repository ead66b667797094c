"""A state that does not match a program's state type: the error names the leaf or static field.

PureJaxRL builds its optimizer inside `train` (`tx = optax.chain(...)`); ported into `init`, every call
of `init` makes a new `optax.chain`, a static field of the `TrainState`, so each state has a new type.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState

import fragc


class FreshChain:
    """A learner whose `init` builds its optimizer afresh, as PureJaxRL's `train` does."""

    def apply(self, params, x):
        return x @ params["w"]

    def init(self, key):
        tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))
        train = TrainState.create(apply_fn=self.apply, params={"w": jnp.ones(3)}, tx=tx)
        return {"train": train, "x": jax.random.normal(key, (8, 3))}

    @fragc.fragment(role="learner", in_axes=(None, 0), out_axes=(None, 0, None))
    def learn(self, train, x):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean(train.apply_fn(p, x) ** 2))(train.params)
        return train.apply_gradients(grads=fragc.pmean(grads)), x * 0.5, {"loss": fragc.pmean(loss)}

    def iteration(self, state):
        train, x, metrics = self.learn(state["train"], state["x"])
        return {"train": train, "x": x}, metrics


@pytest.fixture(scope="module")
def prog():
    return fragc.compile(FreshChain(), policy="single", devices=1, iterations_per_dispatch=2)


def test_program_init_accepts_a_fresh_optimizer_and_runs_as_plain_jax(prog):
    algo = FreshChain()
    state, history = prog.run(prog.init(0), 2)
    ref = algo.init(jax.random.key(0))
    ref_losses = []
    for _ in range(2):
        ref, metrics = jax.jit(algo.iteration)(ref)
        ref_losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(state["train"].params["w"], ref["train"].params["w"], rtol=1e-5)
    np.testing.assert_allclose(history["loss"], ref_losses, rtol=1e-5)


def test_a_state_with_another_optimizer_object_names_the_static_field(prog):
    made_elsewhere = prog.algo.init(jax.random.key(0))  # the same algorithm, another call of init
    for call, name in ((lambda s: prog.run(s, 1), "run"), (prog.place_state, "place_state")):
        with pytest.raises(fragc.FragcError, match=rf"{name}: the state does not match the program's state type: "
                                                   r"state\['train'\]\.tx, a static field .* here but .* in "
                                                   r"the program's state type\. .*optax\.chain.*build it once, "
                                                   r"in __init__"):
            call(made_elsewhere)


@pytest.mark.parametrize("change, message", [
    (lambda s: {**s, "x": jnp.zeros((8, 4))}, r"state\['x'\] is f32\[8,4\] here, f32\[8,3\] in the program's"),
    (lambda s: {**s, "x": s["x"].astype(jnp.int32)}, r"state\['x'\] is i32\[8,3\] here, f32\[8,3\]"),
    (lambda s: {"train": s["train"], "y": s["x"]}, r"state is a dict with keys \['train', 'y'\] here, a dict with "
                                                   r"keys \['train', 'x'\]"),
])
def test_a_state_of_another_type_names_the_first_difference(prog, change, message):
    with pytest.raises(fragc.FragcError, match=rf"place_state: the state does not match .*: {message}"):
        prog.place_state(change(prog.init(0)))
