"""Stages, transfers and schedules as the passes decide them (no XLA compile), and `prog.k`."""

import dataclasses

import pytest

import fragc
from fragc.passes import BUILTIN, default_passes, resolve, run_pipeline
from shared_programs import algo_params, traced
from toy_algos import Regression

DEVICES = 8
K = 4

# (stages, transfers per iteration) under actor_learner / actor_learner_async; every other built-in
# policy runs the iteration as one stage with no transfers.
STAGED = {
    # params to the actors, trajectory to the learner (async: the params go through a delay, still one move)
    "ppo": ((2, 2), (2, 2)),
    "a2c": ((2, 2), (2, 2)),
    "impala": ((2, 2), (2, 2)),
    "ppo_continuous": ((2, 2), (2, 2)),
    "ippo": ((2, 2), (2, 2)),
    "mappo": ((2, 2), (2, 2)),
    # params and env step count to the actors (one move each), transitions to the buffer on the learner;
    # the learner's key split stays on the learner.  Async: params and env steps are delayed together.
    "dqn": ((2, 3), (2, 2)),
    # params and BatchNorm's averages to the actors, the moves' samples to the learner; async: the evaluation (on the
    # actors' devices) plays the current network, self-play the delayed one, a stage each
    "alphazero": ((2, 2), (3, 2)),
    # params to the actors, the trajectory with its targets to the learner
    "muzero": ((2, 2), (2, 2)),
}


@pytest.fixture(scope="module", params=algo_params())
def algo_module(request):
    return request.param, traced(request.param)


def final(module, policy, carrier="device_put"):
    return run_pipeline(module, default_passes(resolve(policy, DEVICES), K, carrier)).final


def counts(module):
    return len(module.stages), sum(n.kind == "transfer" for n in module.graph.nodes)


@pytest.mark.parametrize("policy", sorted(BUILTIN))
def test_stages_and_transfers_of_every_algorithm_under_every_builtin_policy(algo_module, policy):
    name, module = algo_module
    if policy == "agent_learners":  # for agents with parameters of their own (3 agents: 3 learner devices)
        if not any(f.agent_count() and f.role == "learner" for f in module.fragments.values()) or name == "mappo":
            with pytest.raises(fragc.FragcError, match="splits .* over agents"):  # agents that share parameters
                final(module, "agent_learners(actors=4,learners=3)")
            return
        module = final(module, "agent_learners(actors=4,learners=3)")
        assert counts(module) == (2, 2) and [s.group for s in module.stages] == ["actors", "learners"]
        return
    module = final(module, policy)
    if policy.startswith("actor_learner"):
        expected = STAGED[name][policy == "actor_learner_async"]
        assert counts(module) == expected
        assert (module.schedule.executor, module.schedule.iterations_per_dispatch) == ("staged", K)
        assert list(dict.fromkeys(s.group for s in module.stages)) == ["actors", "learner"]  # the actors' first
    else:
        assert counts(module) == (1, 0)
        assert (module.schedule.executor, module.schedule.iterations_per_dispatch) == ("fused", K)


def test_collective_transfers_make_one_spmd_program_of_k_iterations(algo_module):
    _, module = algo_module
    for policy in ("actor_learner", "actor_learner_async"):
        spmd = final(module, policy, "collective")
        assert (spmd.schedule.executor, spmd.schedule.iterations_per_dispatch) == ("spmd", K)
        assert {n.carrier for n in spmd.graph.nodes if n.kind == "transfer"} == {"collective"}
        assert "schedule spmd iterations_per_dispatch=4" in str(spmd)
    assert final(module, "anakin", "collective").schedule.executor == "fused"  # nothing to carry


def test_population_is_a_field_of_the_module():
    module = final(fragc.trace(Regression()), fragc.population("single", 3))
    assert module.population == (0, 1, 2) and module.schedule.executor == "fused"
    assert "population seeds=[0, 1, 2]" in str(module)


def test_a_population_of_a_staged_policy_is_refused_by_the_loop_pass():
    """`population(...)` refuses a policy of several groups itself; a `Policy` made by hand reaches the pass."""
    staged = dataclasses.replace(fragc.passes.actor_learner(2), population=(0, 1))
    with pytest.raises(fragc.FragcError, match=r"pass 'loop\{k=4\}' failed .*population runs need a policy whose "
                                               r"iteration is one stage; this one has 2 stages"):
        final(fragc.trace(Regression()), staged)


def test_prog_k_is_what_was_asked_under_every_transfer_mode():
    algo = Regression()
    for transfers in ("auto", "device_put", "collective"):
        prog = fragc.compile(algo, "actor_learner", devices=2, iterations_per_dispatch=3, transfers=transfers)
        assert prog.k == 3, transfers
        seen = []
        _, history = prog.run(prog.init(0), 5, callback=lambda done, metrics: seen.append(done))
        assert seen == [3, 5] and history["loss"].shape == (5,), transfers
