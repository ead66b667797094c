"""PPO's GAE against a plain Python loop, with terminations and truncations."""

import chex
import jax.numpy as jnp
import numpy as np

from fragc.algos.ppo import Transition, gae


def gae_loop(rewards, values, next_values, terminated, truncated, gamma, lam):
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            done = terminated[t, n] or truncated[t, n]
            bootstrap = 0.0 if terminated[t, n] else next_values[t, n]
            delta = rewards[t, n] + gamma * bootstrap - values[t, n]
            running = delta + (0.0 if done else gamma * lam * running)
            adv[t, n] = running
    return adv, adv + values


def test_gae_matches_python_loop():
    rng = np.random.default_rng(0)
    T, N = 37, 5
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    next_values = rng.normal(size=(T, N)).astype(np.float32)
    terminated = rng.random((T, N)) < 0.1
    truncated = (rng.random((T, N)) < 0.1) & ~terminated
    assert terminated.any() and truncated.any()
    traj = Transition(
        obs=jnp.zeros((T, N, 1)), action=jnp.zeros((T, N), jnp.int32), log_prob=jnp.zeros((T, N)),
        value=jnp.asarray(values), next_obs=jnp.zeros((T, N, 1)), next_value=jnp.asarray(next_values),
        reward=jnp.asarray(rewards),
        terminated=jnp.asarray(terminated), done=jnp.asarray(terminated | truncated),
    )
    adv, targets = gae(traj, 0.99, 0.95)
    chex.assert_shape([adv, targets], (T, N))
    ref_adv, ref_targets = gae_loop(rewards, values, next_values, terminated, truncated, 0.99, 0.95)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(targets, ref_targets, rtol=1e-4, atol=1e-4)


def test_truncation_bootstraps_and_termination_does_not():
    one = lambda x: jnp.asarray([[x]], jnp.float32)  # noqa: E731
    base = dict(obs=jnp.zeros((1, 1, 1)), action=jnp.zeros((1, 1), jnp.int32), log_prob=one(0.0),
                value=one(0.0), next_obs=jnp.zeros((1, 1, 1)), next_value=one(10.0), reward=one(1.0))
    truncated = Transition(**base, terminated=jnp.asarray([[False]]), done=jnp.asarray([[True]]))
    terminated = Transition(**base, terminated=jnp.asarray([[True]]), done=jnp.asarray([[True]]))
    assert float(gae(truncated, 0.5, 0.9)[0][0, 0]) == 1.0 + 0.5 * 10.0
    assert float(gae(terminated, 0.5, 0.9)[0][0, 0]) == 1.0
