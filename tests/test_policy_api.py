"""Policies as data: a user's own policy, cost accounting, and clear errors.

Built-in policies' programs are shared with test_policies.py (tests/shared_programs.py).
"""

import jax
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close, traced_module
from fragc.algos import ppo
from shared_programs import ppo_algo, ppo_program
from toy_algos import Regression


@pytest.fixture(scope="module")
def algo():
    """12 environments: 6 actor replicas divide them, 8 do not."""
    return ppo.PPO(ppo.Config(num_envs=12, num_steps=8, num_minibatches=2, update_epochs=2, total_steps=960))


def test_a_policy_written_in_a_test_trains_ppo(algo):
    """Actors on 6 devices, learner on 2: not built in, no change to algos/."""
    six_two = fragc.Policy(
        name="six_two",
        groups={"actors": tuple(range(6)), "learner": (6, 7)},
        roles={"actor": fragc.RolePlacement("actors"), "learner": fragc.RolePlacement("learner")},
    )
    prog = fragc.compile(algo, six_two, devices=8)
    assert "on @actors shard_map replicas=6" in prog.ir() and "on @learner shard_map replicas=2" in prog.ir()
    state = prog.init(0)
    out, history = prog.run(state, 4)
    assert np.isfinite(history["loss"]).all()
    ref, module = state, traced_module(prog)
    for _ in range(4):
        ref, _ = fragc.interpret(module, ref, replicas={"actor": 6, "learner": 2})
    assert_trees_close(out, ref, rtol=1e-4, atol=1e-5)


def _param_bytes(algo):
    params = jax.eval_shape(algo.init, jax.random.key(0)).learner.params
    return sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(params))


def test_anakin_collectives_are_one_gradient_allreduce_per_minibatch_plus_metrics():
    algo, prog = ppo_algo(), ppo_program("anakin")
    c = algo.config
    r = prog.pipeline.final.fragments["learn"].placement.replicas
    assert r == len(prog.devices)

    def received(elements):  # per device: a reduce-scatter and an all-gather of ceil(n/R) 4-byte values from R-1 others
        return 2 * (r - 1) * -(-elements // r) * 4

    # learn: each epoch's metrics in one pmean, and once a call explained variance's three psums (element count,
    # means, variances); rollout: completed episodes, their return and length sums, episodes done
    scalars = c.update_epochs + 3 + 4
    grads = _param_bytes(algo) // 4
    expected = c.update_epochs * c.num_minibatches * received(grads) + scalars * received(1)
    cost = prog.cost()
    assert cost["total"]["collective_bytes"] == expected
    assert cost["total"]["transfer_bytes"] == 0
    assert cost["iteration"]["flops"] > 0


def test_single_moves_nothing():
    cost = ppo_program("single", 1).cost()
    moved = {k: v for k, v in cost["total"].items() if k.endswith("_bytes")}
    assert moved == {"collective_bytes": 0.0, "transfer_bytes": 0.0, "device_to_host_bytes": 0.0,
                     "host_to_device_bytes": 0.0}


def test_actor_learner_transfers_trajectory_and_parameters():
    algo, prog = ppo_algo(), ppo_program("actor_learner")
    module = prog.pipeline.final
    traj_bytes = module.fragments["rollout"].out_types[0].nbytes
    c = algo.config
    obs = 4
    per_step = c.num_envs * c.num_steps
    # obs, action, log_prob, value, next_value, reward, terminated, done: no next_obs, since PPO's learner needs
    # V(s_{t+1}) only, which the actors compute
    assert traj_bytes == per_step * (obs * 4 + 4 + 4 + 4 + 4 + 4 + 1 + 1)
    assert prog.cost()["total"]["transfer_bytes"] == traj_bytes + _param_bytes(algo)
    pipelined = ppo_program("actor_learner_async")
    assert pipelined.cost()["total"]["transfer_bytes"] == traj_bytes + _param_bytes(algo)  # the delay adds no move


def test_env_count_the_replicas_do_not_divide(algo):
    with pytest.raises(fragc.FragcError, match=r"fragment 'rollout' \(algos/ppo.py:\d+\), argument 'runner\..*': axis 0 has length 12, which 8 replicas do not divide"):
        fragc.compile(algo, "anakin", devices=8)


def test_policy_naming_a_role_the_algorithm_lacks():
    policy = fragc.Policy("buffered", {"a": (0,), "b": (1,)},
                          {"actor": fragc.RolePlacement("a"), "learner": fragc.RolePlacement("b"),
                           "buffer": fragc.RolePlacement("b")})
    with pytest.raises(fragc.FragcError, match=r"policy 'buffered' places role\(s\) \['buffer'\] that the algorithm lacks"):
        fragc.compile(Regression(), policy, devices=2)


def test_policy_with_an_unknown_group():
    with pytest.raises(fragc.FragcError, match=r"role 'actor' names unknown device group 'nowhere'"):
        fragc.Policy("bad", {"a": (0,)}, {"actor": fragc.RolePlacement("nowhere")})


def test_population_of_a_staged_policy_is_refused():
    with pytest.raises(fragc.FragcError, match=r"^population\(actor_learner,\.\.\.\): a population vectorises one "
                                               r"program over its members, and actor_learner splits the iteration "
                                               r"over 2 device groups; use population\(single,S\)"):
        fragc.compile(Regression(), fragc.population("actor_learner", 2), devices=2)


def test_stages_and_hlo_per_stage():
    prog = ppo_program("actor_learner")
    assert prog.stages == prog.executables == ["actors", "learner"]  # staged: one executable per stage
    assert "stablehlo" in prog.hlo("learner")
    assert "all-gather" in prog.hlo("learner", optimized=True)
    with pytest.raises(fragc.FragcError, match="no stage or executable 'iteration'; stages: actors, learner; "
                                               "executables: actors, learner"):
        prog.hlo("iteration")
