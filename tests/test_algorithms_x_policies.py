"""Every algorithm under every built-in policy, 2 iterations on 8 simulated devices.

Synchronous policies match the reference interpreter with the same replica
counts; the asynchronous one matches the interpreter on its pipelined module;
a population member matches a single run of its seed.
"""

import jax
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close
from fragc.algos import a2c, dqn, impala, ppo, ppo_continuous

ITERATIONS = 2

ALGOS = {
    "ppo": lambda: ppo.PPO(ppo.Config(num_envs=8, num_steps=8, num_minibatches=2, update_epochs=1)),
    "a2c": lambda: a2c.A2C(a2c.Config(num_envs=8, num_steps=8)),
    "dqn": lambda: dqn.DQN(dqn.Config(num_envs=8, num_steps=2, buffer_size=64, batch_size=16, learning_starts=0)),
    "impala": lambda: impala.IMPALA(impala.Config(num_envs=8, num_steps=8)),
    "ppo_continuous": lambda: ppo_continuous.PPOContinuous(
        ppo_continuous.Config(num_envs=8, num_steps=8, num_minibatches=2, update_epochs=1)),
}
SYNC = {"single": 1, "anakin": 8, "gspmd": 1, "actor_learner": 4}


@pytest.fixture(scope="module", params=sorted(ALGOS))
def algo(request):
    return ALGOS[request.param]()


@pytest.mark.parametrize("policy", sorted(SYNC))
def test_synchronous_policy_equals_interpreter(algo, policy):
    prog = fragc.compile(algo, policy, devices=1 if policy == "single" else 8)
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    ref, module = state, fragc.trace(algo)
    for i in range(ITERATIONS):
        ref, metrics = fragc.interpret(module, ref, replicas=SYNC[policy])
        np.testing.assert_allclose(history["episode_return"][i], metrics["episode_return"], rtol=1e-4, atol=1e-4)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


def test_async_policy_equals_pipelined_interpreter(algo):
    prog = fragc.compile(algo, "actor_learner_async", devices=8)
    state = prog.init(0)
    out, _ = prog.run(state, ITERATIONS)
    ref, _ = fragc.run_iterations(prog.pipeline.after("insert_delays"), state, ITERATIONS)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


def test_population_member_equals_single_run(algo):
    prog = fragc.compile(algo, fragc.population("single", 2))
    out, _ = prog.run(prog.init(0), ITERATIONS)
    single = fragc.compile(algo, "single")
    one, _ = single.run(single.init(1), ITERATIONS)
    assert_trees_close(jax.tree.map(lambda x: x[1], out), one, rtol=2e-4, atol=2e-5)
