"""The reference interpreter against independent computations."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import fragc
from fragc.ir.interpreter import same_values
from fragc.ir.module import FragmentDef
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


def test_replicas_by_role_name_every_role_or_the_rest():
    """A mapping that leaves a role out is refused in one line naming it (it used to run that role with one
    replica without a word); `"*"` gives every role not named a count."""
    algo = Regression(num_envs=8)
    state = algo.init(jax.random.key(2))
    module = fragc.trace(algo)
    with pytest.raises(fragc.FragcError, match=r"replicas names no count for roles \['learner'\]: name every role, "
                                               r"or give the rest one count with '\*'"):
        fragc.interpret(module, state, replicas={"actor": 2})
    got = fragc.interpret(module, state, replicas={"actor": 2, "*": 4})
    assert_trees_close(got, fragc.interpret(module, state, replicas={"actor": 2, "learner": 4}), rtol=0, atol=0)


def test_a_nan_is_the_same_on_every_replica():
    """A replicated result that is NaN on every replica is one value, not a replica mismatch (the interpreter
    compared with ==, under which NaN differs from itself); keys compare by their data."""
    x = jnp.array([[jnp.nan, 1.0], [jnp.nan, 1.0]])
    assert bool(jnp.all(same_values(x, x[:1])))
    assert not bool(jnp.all(same_values(jnp.array([[jnp.nan], [0.0]]), jnp.array([[jnp.nan]]))))
    keys = jax.random.split(jax.random.key(0), 2)
    assert not bool(jnp.all(same_values(keys, keys[:1])))
    assert bool(jnp.all(same_values(keys[:1], keys[:1])))


def test_a_copied_fragment_definition_keeps_its_data_and_caches_its_own_traces():
    """`FragmentDef` holds a host loop part's per-group bodies as a field (data, compared and copied by `replace`);
    its cache of per-replica traces is its own: `replace` used to share the dict, data and cache alike."""
    fdef = fragc.trace(Regression(num_envs=8)).fragments["learn"]
    assert "group_bodies" in {f.name for f in dataclasses.fields(FragmentDef) if f.init}
    assert "_bodies" not in {f.name for f in dataclasses.fields(FragmentDef) if f.init}
    fdef.body_for(2)
    other = fdef.replace(source="elsewhere")
    assert other._bodies is not fdef._bodies and 2 not in other._bodies
    part = fdef.replace(part_of="learn", group_bodies=((2, fdef.body_for(2)),))
    assert part.replace(source="x").body_for(2) is fdef.body_for(2)
    with pytest.raises(fragc.FragcError, match=r"a part of @learn's host loop, cut for \[2\] environment groups, not 4"):
        part.body_for(4)


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
