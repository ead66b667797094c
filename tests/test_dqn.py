"""DQN: the replay buffer fragment (wrap-around, written slots only), policies, learning."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from conftest import assert_return_rises, assert_trees_close, traced_module, train_returns
from fragc.algos import dqn


def small(**kw):
    base = dict(num_envs=8, num_steps=3, buffer_size=40, batch_size=16, learning_starts=0)
    return dqn.DQN(dqn.Config(**{**base, **kw}))


def _traj(step, num_steps=3, num_envs=8):
    """Transitions whose reward encodes (insert call, time step, env)."""
    r = np.array([[100 * step + 10 * t + e for e in range(num_envs)] for t in range(num_steps)], np.float32)
    zeros = jnp.zeros((num_steps, num_envs, 4))
    return dqn.Transition(zeros, jnp.zeros((num_steps, num_envs), jnp.int32), jnp.asarray(r), zeros,
                          jnp.zeros((num_steps, num_envs), bool))


def test_insert_wraps_around_like_a_ring_buffer():
    algo = small()
    buffer = algo.init(jax.random.key(0)).buffer
    capacity = buffer.data.reward.shape[0]
    assert capacity == 5
    ring = [None] * capacity
    position = 0
    for step in range(4):
        traj = _traj(step)
        buffer = algo.insert(buffer, traj)
        for t in range(3):
            ring[position] = np.asarray(traj.reward[t])
            position = (position + 1) % capacity
    np.testing.assert_array_equal(np.asarray(buffer.data.reward), np.stack(ring))
    assert int(buffer.position) == position and int(buffer.size) == capacity


def test_sampling_never_returns_unwritten_slots():
    algo = small(buffer_size=80)  # capacity 10 per env, 3 written
    buffer = algo.init(jax.random.key(0)).buffer
    buffer = buffer.replace(data=buffer.data.replace(reward=jnp.full_like(buffer.data.reward, -1.0)))
    buffer = algo.insert(buffer, _traj(1))
    sample = jax.jit(algo.sample)  # one compile, not one per operation per draw
    batches = [sample(buffer, jax.random.key(seed)) for seed in range(20)]
    for batch in batches:
        chex.assert_shape([batch.reward, batch.action], (3, 16))
        chex.assert_shape([batch.obs, batch.next_obs], (3, 16, 4))
        assert float(batch.reward.min()) >= 0.0
    seen = {float(x) for batch in batches for x in np.asarray(batch.reward).ravel()}
    assert len(seen) > 12  # draws cover many written slots, not one


@pytest.mark.parametrize("name", ["dqn", "sac"])
def test_each_replica_samples_its_own_indices(name):
    """The sampling key is replicated (one for every learner replica); each replica folds in its index, so two
    replicas draw different slots of their own environments. One replica draws what it always drew."""
    from fragc.algos import sac
    from fragc.algos.replay import Buffer

    algo = small() if name == "dqn" else sac.SAC(sac.Config(num_envs=8, buffer_size=64, batch_size=16))
    replicas, envs, capacity = 2, 8, 5
    slot_ids = np.array([[1000 * t + e for e in range(envs)] for t in range(capacity)], np.float32)
    buffer = Buffer({"id": jnp.asarray(slot_ids)}, jnp.int32(0), jnp.int32(capacity))
    key = jax.random.key(3)

    split = Buffer({"id": buffer.data["id"].reshape(capacity, replicas, envs // replicas)}, buffer.position,
                   buffer.size)
    draws = jax.vmap(algo.sample.fn, in_axes=(Buffer(1, None, None), None), axis_name=fragc.REPLICA)(split, key)
    ids = np.asarray(draws["id"])  # [replica, batches, per replica]
    local = [(ids[r] // 1000, ids[r] % 1000 - r * envs // replicas) for r in range(replicas)]
    assert not all(np.array_equal(a, b) for a, b in zip(local[0], local[1])), "both replicas drew the same slots"

    k_time, k_env = jax.random.split(key)  # one replica: the key as given, the draws of before
    batches = algo.config.num_steps if name == "dqn" else algo.config.gradient_steps  # one a step of either
    shape = (batches, algo.config.batch_size)
    expected = slot_ids[np.asarray(jax.random.randint(k_time, shape, 0, capacity)),
                        np.asarray(jax.random.randint(k_env, shape, 0, envs))]
    np.testing.assert_array_equal(np.asarray(algo.sample(buffer, key)["id"]), expected)


def test_buffer_beside_the_actors():
    """A policy places the buffer fragment with the actors: the sampled batch, not the buffer, crosses groups."""
    algo = small()
    policy = fragc.Policy("buffer_with_actors", {"actors": (0, 1, 2, 3), "learner": (4, 5, 6, 7)},
                          {"actor": fragc.RolePlacement("actors"), "buffer": fragc.RolePlacement("actors"),
                           "learner": fragc.RolePlacement("learner")})
    prog = fragc.compile(algo, policy, devices=8)
    text = prog.ir()
    assert "%buffer = run @insert" in text and "transfer %transition1 @actors -> @learner" in text
    state = prog.init(0)
    out, _ = prog.run(state, 2)
    ref, module = state, traced_module(prog)
    for _ in range(2):
        ref, _ = fragc.interpret(module, ref, replicas=4)
    assert_trees_close(out, ref, rtol=1e-4, atol=1e-5)


def test_continuous_action_space_is_refused():
    with pytest.raises(fragc.FragcError, match="dqn supports discrete action spaces; Pendulum-v1 has Box"):
        fragc.trace(dqn.DQN(dqn.Config(env="Pendulum-v1")))


@pytest.mark.parametrize("double_dqn", [False, True])
def test_the_loss_is_the_squared_td_error_to_the_max_or_the_double_target(double_dqn):
    """Against numpy on made-up Q-values: DQN's target takes the target network's max over the next actions;
    double DQN's evaluates the online network's argmax with the target network (van Hasselt et al. 2016)."""
    algo = small(double_dqn=double_dqn)
    params = algo.init(jax.random.key(0)).learner.params
    target_params = jax.tree.map(lambda p: p * 0.5 + 0.01, params)  # a target network that disagrees
    rng = np.random.default_rng(0)
    batch = dqn.Transition(jnp.asarray(rng.normal(size=(32, 4)), jnp.float32), jnp.asarray(rng.integers(0, 2, 32)),
                           jnp.asarray(rng.normal(size=32), jnp.float32),
                           jnp.asarray(rng.normal(size=(32, 4)), jnp.float32), jnp.asarray(rng.random(32) < 0.3))
    q = np.asarray(algo.model.network.apply(params, batch.obs), np.float64)
    q_next_online = np.asarray(algo.model.network.apply(params, batch.next_obs), np.float64)
    q_next_target = np.asarray(algo.model.network.apply(target_params, batch.next_obs), np.float64)
    rows = np.arange(32)
    if double_dqn:
        q_next = q_next_target[rows, q_next_online.argmax(-1)]
    else:
        q_next = q_next_target.max(-1)
    assert (q_next_online.argmax(-1) != q_next_target.argmax(-1)).any()  # the two targets differ on this batch
    target = np.asarray(batch.reward) + algo.config.gamma * (1.0 - np.asarray(batch.terminated)) * q_next
    want = np.mean((q[rows, np.asarray(batch.action)] - target) ** 2)
    np.testing.assert_allclose(float(algo._loss(params, target_params, batch)), want, rtol=1e-5)


@pytest.mark.slow  # learning runs; the fast suite checks both targets against numpy above
@pytest.mark.parametrize("double", [False, True])
def test_short_run_return_rises(double):
    algo = dqn.DQN(dqn.Config(total_steps=30_000, learning_starts=5_000, eps_decay_steps=30_000, double_dqn=double))
    assert_return_rises(train_returns(algo, iterations_per_dispatch=64), early=slice(20, 60), late=slice(-20, None))


@pytest.mark.slow
def test_full_run_reaches_400():
    returns = train_returns(dqn.DQN(dqn.Config()), iterations_per_dispatch=64)
    assert returns[-1] >= 400, returns[-10:]
