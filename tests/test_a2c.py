"""A2C: the same rollout fragment as PPO with its own learner; checked against the reference semantics."""

import numpy as np
import pytest

import fragc
from conftest import assert_trees_close
from fragc.algos import a2c


@pytest.fixture(scope="module")
def algo():
    return a2c.A2C(a2c.Config(num_envs=8, num_steps=8))


@pytest.mark.parametrize("policy,replicas", [("single", 1), ("anakin", 8), ("actor_learner", {"actor": 4, "learner": 4})])
def test_a2c_under_policies_equals_interpreter(algo, policy, replicas):
    prog = fragc.compile(algo, policy, devices=1 if policy == "single" else 8)
    state = prog.init(0)
    out, history = prog.run(state, 3)
    ref, module = state, fragc.trace(algo)
    for i in range(3):
        ref, metrics = fragc.interpret(module, ref, replicas=replicas)
        np.testing.assert_allclose(history["loss"][i], metrics["loss"], rtol=1e-4, atol=1e-5)
    assert_trees_close(out, ref, rtol=1e-4, atol=1e-5)


def test_a2c_short_run_return_rises():
    algo = a2c.A2C(a2c.Config(total_steps=150_000))
    prog = fragc.compile(algo, "single", iterations_per_dispatch=32)
    _, history = prog.run(prog.init(0), algo.config.iterations)
    returns = history["episode_return"]
    early, late = returns[:10].mean(), returns[-10:].mean()
    assert early < 40 and late > 2 * early and late > 60, (early, late)


@pytest.mark.slow
def test_a2c_full_run_reaches_400():
    algo = a2c.A2C(a2c.Config())
    prog = fragc.compile(algo, "single", iterations_per_dispatch=32)
    _, history = prog.run(prog.init(0), algo.config.iterations)
    assert history["episode_return"][-1] >= 400, history["episode_return"][-10:]
