"""A2C: the same rollout fragment as PPO with its own learner; checked against the reference semantics."""

import pytest

from conftest import assert_return_rises, train_returns
from fragc.algos import a2c


@pytest.mark.slow  # a learning run; A2C's programs against the reference interpreter: test_algorithms_x_policies.py
def test_a2c_short_run_return_rises():
    assert_return_rises(train_returns(a2c.A2C(a2c.Config(total_steps=60_000))))


@pytest.mark.slow
def test_a2c_full_run_reaches_400():
    returns = train_returns(a2c.A2C(a2c.Config()))
    assert returns[-1] >= 400, returns[-10:]
