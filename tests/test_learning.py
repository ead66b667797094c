"""PPO learns CartPole: a short run in the default suite, the full threshold marked slow."""

import numpy as np
import pytest

import fragc
from fragc.algos import ppo


def _train(total_steps: int, seed: int = 0) -> np.ndarray:
    algo = ppo.PPO(ppo.Config(total_steps=total_steps))
    prog = fragc.compile(algo, "single", iterations_per_dispatch=32)
    _, history = prog.run(prog.init(seed), algo.config.iterations)
    return history["episode_return"]


def test_short_run_return_rises():
    returns = _train(60_000)  # 117 iterations, a few seconds
    early, late = returns[:10].mean(), returns[-10:].mean()
    assert early < 40, early  # a random CartPole policy lasts about 20 steps
    assert late > 2 * early and late > 60, (early, late)


@pytest.mark.slow
def test_full_run_reaches_475():
    returns = _train(500_000)
    assert returns[-1] >= 475, returns[-10:]
