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


def test_same_named_fragments_with_same_inputs_in_two_traces_keep_their_own_outputs():
    """JAX caches abstract evaluation by primitive params and input types; a fragment of a second
    trace with the same name and inputs but other outputs (here: rollout length) must not get the first's."""
    from fragc.algos import ppo

    short = fragc.trace(ppo.PPO(ppo.Config(num_envs=8, num_steps=8)))
    long = fragc.trace(ppo.PPO(ppo.Config(num_envs=8, num_steps=16)))
    assert short.fragments["rollout"].out_types[0].leaves[0].shape[0] == 8
    assert long.fragments["rollout"].out_types[0].leaves[0].shape[0] == 16
    assert long.fragments["learn"].in_types[1].leaves[0].shape[0] == 16
