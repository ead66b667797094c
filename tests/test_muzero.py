"""MuZero (src/fragc/algos/muzero.py): the categorical scale against its formulas, the unrolls' targets and masks
against a loop over the steps, the search's targets, the refusals, and the program under 8 replicas against the
reference interpreter. Learning against PQN at equal environment steps is bench/results.py's (docs/results_search.md)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("mctx", reason="the optional extra fragc[search]")

import fragc  # noqa: E402
from conftest import assert_trees_close  # noqa: E402
from fragc.algos import make, muzero  # noqa: E402
from fragc.cli import main  # noqa: E402
from shared_programs import small_algo, traced  # noqa: E402


def test_the_scale_and_its_inverse():
    x = np.array([-300.0, -7.5, -1.0, -0.2, 0.0, 0.3, 1.0, 2.0, 42.0, 1000.0], np.float32)
    h = np.sign(x) * (np.sqrt(np.abs(x) + 1) - 1) + 1e-3 * x  # MuZero's appendix F
    np.testing.assert_allclose(muzero.scale(jnp.asarray(x)), h, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(muzero.unscale(jnp.asarray(h)), x, rtol=1e-4, atol=1e-4)


def test_two_hot_splits_the_scaled_value_between_its_atoms_and_back():
    x = np.array([0.0, 1.0, 0.5, -3.0, 17.0, 55.0], np.float32)
    probs = np.asarray(muzero.two_hot(jnp.asarray(x), 10))
    assert probs.shape == (6, 21)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    atoms = np.arange(-10, 11)
    np.testing.assert_allclose(probs @ atoms, muzero.scale(jnp.asarray(x)), rtol=1e-5, atol=1e-6)
    assert np.count_nonzero(probs, -1).max() <= 2
    assert probs[0, 10] == 1.0  # 0 is the middle atom
    # the expectation of a categorical whose logits are log(two_hot) is the value itself
    np.testing.assert_allclose(muzero.expected(jnp.log(jnp.asarray(probs) + 1e-30), 10), x, rtol=1e-4, atol=1e-4)
    # beyond the support: the last atom (h(200) is about 13.3 > 10)
    assert muzero.two_hot(jnp.float32(200.0), 10)[-1] == 1.0


def plain_unrolls(done, T, k):
    """The mask of step t + j of each unroll, a step at a time: inside the rollout, and no episode end at t..t+j-1."""
    N = done.shape[1]
    mask = np.zeros((T, N, k + 1))
    for t in range(T):
        for n in range(N):
            for j in range(k + 1):
                mask[t, n, j] = t + j < T and not any(done[t + i, n] for i in range(j))
    return mask


def test_unrolls_take_the_next_steps_and_mask_past_episode_and_rollout_ends():
    rng = np.random.default_rng(0)
    T, N, A, K = 9, 3, 4, 3
    done = rng.random((T, N)) < 0.3
    traj = muzero.Trajectory(obs=jnp.asarray(rng.normal(size=(T, N, 5)), jnp.float32),
                             action=jnp.asarray(rng.integers(0, A, (T, N))),
                             reward=jnp.asarray(rng.normal(size=(T, N)), jnp.float32), done=jnp.asarray(done),
                             policy_target=jnp.asarray(rng.dirichlet(np.ones(A), (T, N)), jnp.float32),
                             value_target=jnp.asarray(rng.normal(size=(T, N)), jnp.float32))
    u = jax.jit(muzero.unrolls, static_argnums=1)(traj, K)
    assert u.actions.shape == (T, N, K) and u.policy_targets.shape == (T, N, K + 1, A) and u.mask.shape == (T, N, K + 1)
    mask = plain_unrolls(done, T, K)
    np.testing.assert_array_equal(u.mask, mask)
    for t in range(T):
        for n in range(N):
            for j in range(K + 1):
                if mask[t, n, j]:
                    np.testing.assert_array_equal(u.value_targets[t, n, j], traj.value_target[t + j, n])
                    np.testing.assert_array_equal(u.policy_targets[t, n, j], traj.policy_target[t + j, n])
                if j < K and mask[t, n, j]:
                    assert u.actions[t, n, j] == traj.action[t + j, n] and u.rewards[t, n, j] == traj.reward[t + j, n]
    np.testing.assert_array_equal(u.obs, traj.obs)


@pytest.mark.slow  # 20 s of compiling each; .ci/run runs this file's -m slow tests after the default suite
@pytest.mark.parametrize("policy,replicas", [("anakin", 8), ("actor_learner", {"actor": 4, "learner": 4})])
def test_a_policy_equals_the_interpreter_with_its_replicas(policy, replicas):
    """anakin: one environment per replica, each searching with its own key; actor_learner: the search on 4 actor
    devices, the model learned on 4 learner devices."""
    prog = fragc.compile(small_algo("muzero"), policy, devices=8)
    state = prog.init(0)
    out, history = prog.run(state, 2)
    ref = state
    for i in range(2):
        ref, metrics = fragc.interpret(traced("muzero"), ref, replicas=replicas)
        for name in ("episode_return", "root_value", "loss"):
            np.testing.assert_allclose(history[name][i], metrics[name], rtol=1e-4, atol=1e-5)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("args,says", [
    (["--env", "Pendulum-v1"], r"muzero supports discrete action spaces; Pendulum-v1 has Box"),
    (["--env", "pgx:connect_four"], r"pgx:connect_four is a two-player board game \(pgx\): use alphazero"),
    (["--num-simulations", "0"], r"muzero: num_simulations must be positive, got 0"),
    (["--unroll-steps", "0"], r"muzero: unroll_steps must be positive, got 0"),
    (["--num-minibatches", "3"], r"muzero: num_envs \* num_steps \(2048\) must divide by num_minibatches \(3\)"),
])
def test_bad_input_is_one_line_before_compiling(capsys, args, says):
    assert main(["run", "muzero", *args, "--iterations", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "compiling" not in err
    assert re.search(says, err), err


def test_q_values_are_scaled_by_the_whole_trees_range_so_two_actions_are_not_forced_apart():  # and the search's output
    """With two actions, mctx's default scales the children's Q-values by their own range: the better one gets 1,
    the other 0, and the improved policy is one action whatever the values (the policy collapsed on CartPole)."""
    import mctx

    algo = make("muzero", env="CartPole-v1", num_envs=16, num_simulations=8, hidden=32, embedding=16)
    params = algo.policy_params(algo.init(jax.random.key(0)))
    obs = algo.env.reset(jax.random.key(1), 16).obs
    out = jax.jit(lambda key: algo.search(params, key, obs))(jax.random.key(2))
    scaled = jax.vmap(muzero.qtransform_tree_min_max, in_axes=(0, None))(out.search_tree, 0)
    children = jax.vmap(mctx.qtransform_completed_by_mix_value, in_axes=(0, None))(out.search_tree, 0)
    visit_scale = 0.1 * (50.0 + np.max(out.search_tree.children_visits[:, 0], -1))
    assert np.all(scaled >= 0) and np.all(scaled <= visit_scale[:, None] + 1e-5)
    np.testing.assert_allclose(np.ptp(children, -1), visit_scale, rtol=1e-5)  # always the whole range
    assert np.all(np.ptp(scaled, -1) < visit_scale)  # a part of it
    # and the same order of the two actions
    np.testing.assert_array_equal(np.argmax(scaled, -1), np.argmax(children, -1))
    # the search's improved policy is a distribution; without Gumbel noise its action is the same each time
    np.testing.assert_allclose(np.sum(out.action_weights, -1), 1.0, rtol=1e-5)
    greedy = jax.jit(algo.greedy_action)
    np.testing.assert_array_equal(greedy(params, obs), greedy(params, obs))
