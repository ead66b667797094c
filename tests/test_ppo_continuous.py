"""PPO with a Gaussian policy on Pendulum-v1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from fragc.algos import actor_critic, ppo, ppo_continuous as pc


def test_gaussian_log_prob_matches_scipy_formula():
    mean, log_std, x = jnp.array([[0.5, -1.0]]), jnp.array([[0.1, -0.3]]), jnp.array([[0.2, 0.4]])
    std = np.exp(np.asarray(log_std))
    expected = np.sum(-0.5 * ((np.asarray(x) - np.asarray(mean)) / std) ** 2 - np.log(std * np.sqrt(2 * np.pi)))
    np.testing.assert_allclose(actor_critic.gaussian_log_prob(mean, log_std, x)[0], expected, rtol=1e-6)


def test_actions_are_clipped_for_the_environment_only():
    algo = pc.PPOContinuous(pc.Config(num_envs=2, num_steps=4, num_minibatches=2))
    assert float(jnp.max(algo.model.env_action(jnp.array([[5.0], [-7.0]])))) == 2.0
    state = algo.init(jax.random.key(0))
    assert state.learner.params["params"]["log_std"].shape == (1,)


def test_value_loss_is_clipped_only_when_asked():
    """The value loss against numpy: plain squared error for ppo_continuous's default, PureJaxRL's clipped
    form (PPO's default) with `clip_value`."""
    assert not pc.Config().clip_value and ppo.Config().clip_value
    obs = np.asarray(jax.random.normal(jax.random.key(1), (8, 3)))
    zeros = np.zeros(8, np.float32)
    for clip_value in (False, True):
        algo = pc.PPOContinuous(pc.Config(num_envs=2, num_steps=4, num_minibatches=2, clip_value=clip_value))
        params = algo.init(jax.random.key(0)).learner.params
        value = np.asarray(algo.model.value(params, obs))
        old_value = value + np.linspace(-1, 1, 8, dtype=np.float32)  # the rollout's values, up to 1 away
        targets = value + np.linspace(3, -3, 8, dtype=np.float32)
        traj = ppo.Transition(obs, np.zeros((8, 1), np.float32), zeros, old_value, obs, zeros, zeros, zeros, zeros)
        _, metrics = ppo.loss(params, traj, zeros, targets, algo.config, algo.model)
        expected = (value - targets) ** 2
        if clip_value:
            clipped = old_value + np.clip(value - old_value, -0.2, 0.2)
            expected = np.maximum(expected, (clipped - targets) ** 2)
        np.testing.assert_allclose(metrics["value_loss"], 0.5 * expected.mean(), rtol=1e-5)


@pytest.mark.slow  # a learning run (12 s); the fast suite checks the Gaussian policy's maths and the policies
def test_short_run_return_rises():
    algo = pc.PPOContinuous(pc.Config(total_steps=100_000))
    prog = fragc.compile(algo, "single", iterations_per_dispatch=8)
    _, history = prog.run(prog.init(0), algo.config.iterations)
    returns = history["episode_return"]
    early = returns[2:6].mean()  # the first episodes end at step 200
    late = returns[-5:].mean()
    assert early < -900 and late > early + 300, (early, late)


def test_discrete_environment_is_refused():
    with pytest.raises(fragc.FragcError, match="ppo_continuous supports continuous .* CartPole-v1 is discrete"):
        fragc.trace(pc.PPOContinuous(pc.Config(env="CartPole-v1")))
