"""How often `fragc.compile` -> `init` -> the first iteration traces the algorithm's own functions
(bench/trace_counts.py): a change that traces one of them again shows here, not only as a slower start."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from fragc.algos import ppo

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import trace_counts  # noqa: E402


def _small_ppo() -> ppo.PPO:
    return ppo.PPO(ppo.Config(num_envs=4, num_steps=8, num_minibatches=2, update_epochs=1, hidden=8))


def test_ppo_under_single_traces_each_function_once_and_the_replica_check_once_more():
    """init once (the frontend's `eval_shape` and `Program.init`'s jit share JAX's trace of one function), the
    iteration once, each fragment once at one replica and once at two (the replica check, which warns under
    `single` what a policy with several replicas refuses: tests/test_frontend_errors.py); nothing after compile."""
    algo = _small_ppo()
    counts, prog = trace_counts.count(lambda: algo, "single", devices=1, iterations_per_dispatch=1)
    assert counts["compile"]["calls"] == {"init": 1, "iteration": 1, "rollout": 2, "learn": 2}
    assert counts["init"]["calls"] == {}
    assert counts["first_iteration"]["calls"] == {}
    # the state Program.init made from the reused trace is the algorithm's own init
    prog_state = prog.init(3)
    want = jax.jit(lambda: algo.init(jax.random.key(3)))()
    for got, expected in zip(jax.tree.leaves(prog_state), jax.tree.leaves(want)):
        if jax.dtypes.issubdtype(expected.dtype, jax.dtypes.prng_key):
            got, expected = jax.random.key_data(got), jax.random.key_data(expected)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_the_counter_sees_a_second_trace():
    """The harness itself: tracing the iteration again by hand shows as a second call of its fragments."""
    algo = _small_ppo()
    targets = trace_counts.algorithm_functions(algo)
    assert sorted(targets) == ["evaluator.evaluate", "init", "iteration", "learn", "rollout"]
    counter = trace_counts.Counter(targets)
    with counter.counting():
        state = jax.eval_shape(algo.init, jax.random.key(0))
        jax.eval_shape(algo.iteration, state)  # outside fragc.trace a fragment is its plain function
    assert counter.snapshot()["calls"] == {"init": 1, "iteration": 1, "rollout": 1, "learn": 1}


# ---------------------------------------------------------------- JAX's tracing cache across traces (src/fragc/ir/frontend.py)


def _regression_calling(helper, inner_fragment=None):
    """toy_algos.Regression whose learner passes its gradient through `helper` (a `jax.jit` of the test's); with
    `inner_fragment`, the iteration also calls `helper` itself, on a value the fragment made."""
    from toy_algos import Regression, State

    class Helped(Regression):
        @fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=(None, None))
        def learn(self, w, x, y):
            loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
            return w - self.lr * helper(fragc.pmean(grad)), {"loss": fragc.pmean(loss)}

        def iteration(self, state):
            y, data = self.sample(state.data)
            if inner_fragment is not None:
                helper(y)  # the helper traced at the iteration's level first, where it calls a fragment
            w, metrics = self.learn(state.w, data.x, y)
            return State(w, data, state.step + 1), metrics

    return Helped()


def assert_refused_inside_learn(algo):
    """Tracing `algo` refuses fragment 'scale' called inside fragment 'learn', in one line."""
    with pytest.raises(fragc.FragcError, match="fragment 'scale' is called inside fragment 'learn'") as err:
        fragc.trace(algo)
    assert "\n" not in str(err.value)


class _Scaler:
    @fragc.fragment(role="actor", in_axes=(None,), out_axes=None)
    def scale(self, g):
        return 2 * g


_SCALER = _Scaler()


@jax.jit
def _via_a_fragment(g):
    return _SCALER.scale(g)


def test_a_helper_that_calls_a_fragment_is_refused_inside_a_body_after_a_plain_run_traced_it():
    """A plain `jax.jit` of the iteration (a user's reference run) traces the helper, the fragment inside it as its
    plain function: a fragc trace after it still refuses the fragment called inside another's body (with one scope
    for every trace's bodies, the plain run's cached trace let it through as the learner's own code)."""
    algo = _regression_calling(_via_a_fragment)
    jax.jit(algo.iteration)(algo.init(jax.random.key(0)))
    assert_refused_inside_learn(algo)


def test_a_jitted_method_made_in_init_follows_a_config_replaced_between_compiles_under_every_policy():
    """`self.update = jax.jit(self._update)` reads the config; the same instance compiled, its config replaced,
    compiled again under `single` and `anakin`: both follow the new config, as the plain loop by hand does."""
    from toy_algos import JittedUpdateRegression, RegressionConfig, regression_by_hand

    algo = JittedUpdateRegression()
    fragc.compile(algo, "single").run(algo.init(jax.random.key(0)), 1)
    algo.config = RegressionConfig(lr=0.02)
    for policy, devices in (("single", 1), ("anakin", 8)):
        prog = fragc.compile(algo, policy, devices=devices)
        state = prog.init(0)
        out, _ = prog.run(state, 2)
        ref = jax.device_get(state)
        for _ in range(2):
            ref, _ = regression_by_hand(ref, devices, lr=0.02)
        np.testing.assert_allclose(np.asarray(out.w), np.asarray(ref.w), rtol=1e-5, err_msg=policy)


def test_a_helper_that_calls_a_fragment_is_refused_inside_a_body_after_the_iteration_traced_it():
    """The iteration's level keeps a scope per trace: a jitted helper whose jaxpr there holds a fragment call is
    traced again inside a body, where calling that fragment is refused, not taken from the cache as glue."""
    holder = {}

    @jax.jit
    def via_fragment(y):
        return holder["algo"].scale(y)

    class Scaled:
        @fragc.fragment(role="actor", in_axes=(0,), out_axes=0)
        def scale(self, y):
            return 2 * y

    algo = _regression_calling(via_fragment, inner_fragment=True)
    holder["algo"] = Scaled()
    assert_refused_inside_learn(algo)
