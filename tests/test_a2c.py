"""A2C: the same rollout fragment as PPO with its own learner; checked against the reference semantics."""

import pytest

import fragc
from fragc.algos import a2c


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
