"""The reference interpreter against independent computations."""

import jax
import pytest

import fragc
from conftest import assert_trees_close
from toy_algos import Regression, regression_by_hand


def test_interpret_one_replica_equals_jit_of_iteration(ppo_algo):
    state = ppo_algo.init(jax.random.key(0))
    module = fragc.trace(ppo_algo)
    expected = jax.jit(ppo_algo.iteration)(state)
    got = fragc.interpret(module, state, replicas=1)
    assert_trees_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_interpret_replicas_equal_split_vmap_mean(replicas):
    algo = Regression(num_envs=8)
    state = algo.init(jax.random.key(1))
    module = fragc.trace(algo)
    for _ in range(3):
        expected = regression_by_hand(state, replicas)
        state, metrics = fragc.interpret(module, state, replicas=replicas)
        assert_trees_close((state, metrics), expected, rtol=1e-5, atol=1e-6)


def test_replicas_by_role():
    algo = Regression(num_envs=8)
    state = algo.init(jax.random.key(2))
    module = fragc.trace(algo)
    got = fragc.interpret(module, state, replicas={"actor": 2, "learner": 4})
    expected = regression_by_hand(state, 4)
    assert_trees_close(got, expected, rtol=1e-5, atol=1e-6)


def test_direct_call_runs_one_replica():
    algo = Regression(num_envs=8)
    state = algo.init(jax.random.key(3))
    assert_trees_close(algo.iteration(state), regression_by_hand(state, 1), rtol=1e-5, atol=1e-6)
