"""How often `fragc.compile` -> `init` -> the first iteration traces the algorithm's own functions
(bench/trace_counts.py): a change that traces one of them again shows here, not only as a slower start."""

import os
import sys

import jax
import numpy as np

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
