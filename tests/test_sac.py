"""SAC: the twin-Q soft target, the squashed Gaussian, Polyak averaging and the temperature's gradient against plain
numpy; the reference interpreter under the policies, exact resume, its config's ranges, and (-m slow) learning
Pendulum."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close
from fragc.algos import sac
from fragc.algos.replay import Transition

ITERATIONS = 2


@functools.cache
def tiny() -> sac.SAC:
    """8 environments, 1 gradient step per iteration (utd 1/8), learning from the second iteration on."""
    return sac.SAC(sac.Config(num_envs=8, buffer_size=64, batch_size=16, learning_starts=8, utd_ratio=0.125,
                              hidden=16, total_steps=160))


@functools.cache
def traced() -> fragc.Module:
    return fragc.trace(tiny())


@functools.cache
def program(policy, devices=8):
    return fragc.compile(tiny(), policy, devices=devices, iterations_per_dispatch=ITERATIONS)


@functools.cache
def anakin_run():
    """(initial state, state and history after ITERATIONS) of the anakin program from seed 0."""
    prog = program("anakin")
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    return state, out, history


def interpret_n(module, state, replicas, iterations=ITERATIONS):
    history = []
    for _ in range(iterations):
        state, metrics = fragc.interpret(module, state, replicas=replicas)
        history.append(metrics)
    return state, history


# ---------------------------------------------------------------- the maths, against numpy


def mlp(params, x):
    """A flax Dense stack in numpy: relu between layers Dense_0 .. Dense_{n-1}."""
    n = len(params)
    for i in range(n):
        layer = params[f"Dense_{i}"]
        x = x @ np.asarray(layer["kernel"]) + np.asarray(layer["bias"])
        x = np.maximum(x, 0) if i < n - 1 else x
    return x


def actor_np(params, obs, noise, scale, bias):
    """CleanRL's Actor.get_action in numpy, with the given standard normal noise: (action, log_prob)."""
    p = jax.tree.map(np.asarray, params["params"])
    h = np.maximum(obs @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"], 0)
    h = np.maximum(h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"], 0)
    mean = h @ p["Dense_2"]["kernel"] + p["Dense_2"]["bias"]
    log_std = np.tanh(h @ p["Dense_3"]["kernel"] + p["Dense_3"]["bias"])
    log_std = -5 + 0.5 * (2 - -5) * (log_std + 1)
    x = mean + np.exp(log_std) * noise
    y = np.tanh(x)
    normal = -0.5 * ((x - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi)
    return y * scale + bias, np.sum(normal - np.log(scale * (1 - y**2) + 1e-6), -1)


def critic_np(critic, i, obs, action):
    return mlp(jax.tree.map(lambda x: np.asarray(x[i]), critic["params"]), np.concatenate([obs, action], -1))[:, 0]


def test_twin_q_soft_target_and_critic_loss_match_numpy():
    algo = tiny()
    learner = jax.device_get(anakin_run()[0].learner)
    rng = np.random.default_rng(0)
    n = 5
    batch = Transition(rng.normal(size=(n, 3)).astype(np.float32), rng.uniform(-2, 2, (n, 1)).astype(np.float32),
                       rng.normal(size=n).astype(np.float32), rng.normal(size=(n, 3)).astype(np.float32),
                       np.array([0, 1, 0, 0, 1], bool))
    noise = rng.normal(size=(n, 1)).astype(np.float32)
    target_critic = jax.tree.map(lambda x: x + 0.1, learner.critic)  # the target differs from the online critics
    alpha = 0.3

    @jax.jit
    def maths(learner, target_critic, batch, noise):
        return (algo.soft_target(target_critic, learner.actor, jnp.float32(alpha), batch, noise),
                algo.critic_loss(learner.critic, target_critic, learner.actor, jnp.float32(alpha), batch, noise)[0],
                algo.squashed_gaussian(learner.actor, batch.obs, noise * 10))

    got, loss, (action, log_prob) = maths(learner, target_critic, batch, noise)
    next_action, next_log_prob = actor_np(learner.actor, batch.next_obs, noise, 2.0, 0.0)
    q_next = np.minimum(critic_np(target_critic, 0, batch.next_obs, next_action),
                        critic_np(target_critic, 1, batch.next_obs, next_action))
    want = batch.reward + 0.99 * (1 - batch.terminated) * (q_next - alpha * next_log_prob)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    q = [critic_np(learner.critic, i, batch.obs, batch.action) for i in (0, 1)]
    np.testing.assert_allclose(float(loss), sum(np.mean((qi - want) ** 2) for qi in q), rtol=1e-5)
    # the policy's actions lie within Pendulum's bounds, and their log-probabilities are the numpy ones
    want_action, want_log_prob = actor_np(learner.actor, batch.obs, noise * 10, 2.0, 0.0)
    assert np.all(np.abs(np.asarray(action)) <= 2.0)
    np.testing.assert_allclose(action, want_action, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(log_prob, want_log_prob, rtol=1e-4, atol=1e-4)


def random_batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return Transition(rng.normal(size=(n, 3)).astype(np.float32), rng.uniform(-2, 2, (n, 1)).astype(np.float32),
                      rng.normal(size=n).astype(np.float32), rng.normal(size=(n, 3)).astype(np.float32),
                      rng.random(n) < 0.3)


def test_polyak_averaging_and_the_temperature_gradient():
    online = {"w": np.array([1.0, 2.0]), "b": np.array(3.0)}
    target = {"w": np.array([0.0, 0.0]), "b": np.array(1.0)}
    moved = sac.polyak(online, target, 0.25)
    np.testing.assert_allclose(moved["w"], [0.25, 0.5])
    np.testing.assert_allclose(moved["b"], 1.5)
    # alpha rises (its loss's gradient in log alpha is negative) while the entropy -log pi is below the target
    # entropy -|A| (Pendulum: -1), and falls above it; the gradient is -alpha (log pi + target_entropy)
    algo = tiny()
    for log_prob, sign in ((np.full(4, 3.0), -1), (np.full(4, -3.0), 1)):
        grad = float(jax.grad(algo.alpha_loss)(jnp.float32(np.log(0.5)), jnp.asarray(log_prob)))
        assert np.sign(grad) == sign
        np.testing.assert_allclose(grad, -0.5 * (log_prob[0] - 1.0), rtol=1e-6)


# ---------------------------------------------------------------- the program under the policies


def test_anakin_equals_interpreter_and_the_targets_move_by_polyak_averaging():
    """anakin in the default suite (8 replicas: per-replica buffer columns and noise, the gradients' pmean);
    iteration 0 acts at random and skips learning, iteration 1 takes one gradient step, after which the target
    critics are tau of the new critics plus (1 - tau) of the initial ones (targets start as the critics)."""
    state, out, history = anakin_run()
    ref, ref_history = interpret_n(traced(), state, 8)
    for i, metrics in enumerate(ref_history):
        for name in ("episode_return", "qf_loss", "actor_loss", "alpha", "alpha_loss"):
            np.testing.assert_allclose(history[name][i], metrics[name], rtol=1e-4, atol=1e-5)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)
    assert float(history["qf_loss"][0]) == 0.0 < float(history["qf_loss"][1])  # learning from iteration 1
    assert float(history["alpha"][0]) == 1.0 != float(history["alpha"][1])  # log alpha from 0
    tau = tiny().config.tau
    for c0, c1, t1 in zip(*(jax.tree.leaves(p) for p in (state.learner.critic, out.learner.critic,
                                                          out.learner.target_critic))):
        np.testing.assert_allclose(t1, tau * np.asarray(c1) + (1 - tau) * np.asarray(c0), rtol=1e-6, atol=1e-7)
    assert not np.allclose(jax.tree.leaves(out.learner.critic)[1], jax.tree.leaves(state.learner.critic)[1])


def unrolling(unroll):
    """SAC with two gradient steps an iteration, `unroll` of them unrolled."""
    return sac.SAC(sac.Config(num_envs=8, buffer_size=64, batch_size=16, learning_starts=0, utd_ratio=0.25, hidden=16,
                              unroll=unroll))


def test_config_unroll_reaches_the_learners_loop():
    """`Config.unroll` is the learner scan's `unroll`; its 0 is 1 on the CPU (a GPU unrolls every step). The numbers
    are checked against the rolled loop with -m slow."""
    assert (unrolling(0).unrolled_steps, unrolling(2).unrolled_steps, unrolling(5).unrolled_steps) == (1, 2, 2)
    rolled, unrolled = (str(fragc.trace(unrolling(u)).fragments["learn"].body) for u in (1, 2))
    assert "unroll=1" in rolled and "unroll=2" not in rolled
    assert "unroll=2" in unrolled


def test_checkpoint_and_exact_resume(tmp_path):
    """A run stopped after its first checkpoint and resumed equals an uninterrupted one bit for bit (the anakin
    program above: the buffer, the per-environment keys, three optimizers' states and log alpha included)."""
    prog = program("anakin")
    whole = fragc.train(prog, prog.init(0), 3 * ITERATIONS)
    fragc.train(prog, prog.init(0), 3 * ITERATIONS, checkpoint_dir=tmp_path, checkpoint_every=ITERATIONS,
                stop_after=ITERATIONS)
    resumed = fragc.train(prog, prog.init(0), 3 * ITERATIONS, checkpoint_dir=tmp_path, resume=True)
    assert resumed.resumed_from == ITERATIONS
    assert int(whole.state.buffer.size) == 3 * ITERATIONS
    assert_trees_close(resumed.state, whole.state, rtol=0, atol=0)


@pytest.mark.parametrize("field,value,message", [
    ("tau", 1.5, "sac: tau must be in [0, 1], got 1.5"),
    ("q_lr", 0.0, "sac: q_lr must be positive, got 0"),
    ("alpha", -0.1, "sac: alpha must be at least 0, got -0.1"),
    ("utd_ratio", 0.1, "sac: utd_ratio * num_envs * num_steps (0.8) must be a whole number of gradient steps per "
                       "iteration, at least 1"),
    ("learning_starts", -1, "sac: learning_starts must be at least 0, got -1"),
    ("unroll", -1, "sac: unroll must be at least 0, got -1"),
])
def test_a_bad_config_value_is_one_line(field, value, message):
    with pytest.raises(fragc.FragcError) as err:
        sac.Config(**{field: value})
    assert str(err.value) == message


def test_a_discrete_action_space_is_refused():
    with pytest.raises(fragc.FragcError) as err:
        sac.SAC(sac.Config(env="CartPole-v1")).env
    assert str(err.value) == "sac supports continuous (Box) action spaces; CartPole-v1 is discrete (use dqn, pqn or ppo)"


def test_the_command_line_lists_and_checks_sac(capsys):
    from fragc.cli import main

    assert main(["algos"]) == 0
    assert "sac" in capsys.readouterr().out
    assert main(["run", "sac", "--tau", "2"]) == 2
    assert capsys.readouterr().err == "fragc: error: sac: tau must be in [0, 1], got 2\n"


# ---------------------------------------------------------------- -m slow: the other policies, learning


@pytest.mark.slow
@pytest.mark.parametrize("policy,replicas", [("single", 1), ("gspmd", 1),
                                             ("actor_learner", {"actor": 4, "buffer": 4, "learner": 4})])
def test_other_synchronous_policies_equal_interpreter(policy, replicas):
    prog = program(policy)
    state = prog.init(0)
    out, _ = prog.run(state, ITERATIONS)
    ref, _ = interpret_n(traced(), state, replicas)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_several_gradient_steps_per_iteration_equal_interpreter():
    """utd_ratio 2: 16 gradient steps per iteration of 8 environment steps, a scan in the learner."""
    algo = sac.SAC(sac.Config(num_envs=8, buffer_size=64, batch_size=16, learning_starts=0, utd_ratio=2.0, hidden=16))
    assert algo.config.gradient_steps == 16
    prog = fragc.compile(algo, "anakin", devices=8)
    state = prog.init(0)
    out, _ = prog.run(state, ITERATIONS)
    ref, _ = interpret_n(fragc.trace(algo), state, 8)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_an_unrolled_learner_loop_gives_the_rolled_loops_numbers():
    """The single program with two gradient steps unrolled equals the interpreted rolled loop."""
    prog = fragc.compile(unrolling(2), "single", devices=1, iterations_per_dispatch=ITERATIONS)
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    ref, ref_history = interpret_n(fragc.trace(unrolling(1)), state, 1)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)
    for i, metrics in enumerate(ref_history):
        np.testing.assert_allclose(history["qf_loss"][i], metrics["qf_loss"], rtol=1e-4)
        assert float(metrics["qf_loss"]) > 0  # both iterations learned


@pytest.mark.slow
def test_async_policy_equals_pipelined_interpreter():
    prog = program("actor_learner_async")
    state = prog.init(0)
    out, _ = prog.run(state, ITERATIONS)
    ref, _ = fragc.run_iterations(prog.pipeline.after("insert_delays"), state, ITERATIONS)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_population_member_equals_interpreter_from_its_seed():
    algo = tiny()
    prog = fragc.compile(algo, fragc.population("single", 2))
    start = prog.init(0)
    own = jax.jit(algo.init)(jax.random.key(1))
    out, _ = prog.run(start, ITERATIONS)
    one, _ = interpret_n(traced(), own, 1)
    assert_trees_close(jax.tree.map(lambda x: x[1], out), one, rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_mountain_car_continuous_and_evaluation_run():
    algo = sac.SAC(sac.Config(env="MountainCarContinuous-v0", buffer_size=64, batch_size=16, learning_starts=8,
                              hidden=16, eval_every=1, eval_episodes=2))
    prog = fragc.compile(algo, "single")
    _, history = prog.run(prog.init(0), 2)
    assert np.all(np.isfinite(np.asarray(history["eval_return"])))
    assert float(history["qf_loss"][1]) > 0


@pytest.mark.slow
def test_host_environment_through_the_host_loop():
    """gymnasium:Pendulum-v1 stepped on the host: the rollout's time loop runs from Python."""
    algo = sac.SAC(sac.Config(env="gymnasium:Pendulum-v1", num_steps=4, buffer_size=64, batch_size=16,
                              learning_starts=16, utd_ratio=0.125, hidden=16))
    prog = fragc.compile(algo, "single")
    assert "loop" in prog.ir()
    _, history = prog.run(prog.init(0), 3)
    assert float(history["qf_loss"][-1]) > 0 and np.all(np.isfinite(np.asarray(history["actor_loss"])))


@pytest.mark.slow
def test_pendulum_reaches_minus_200_within_rl_zoos_budget():
    """RL Baselines3 Zoo's Pendulum-v1 budget (2e4 steps, the default config); SB3's published SAC: -176 +- 102."""
    algo = sac.SAC(sac.Config())
    prog = fragc.compile(algo, "single", iterations_per_dispatch=125)
    _, history = prog.run(prog.init(0), algo.config.iterations)
    returns = np.asarray(history["episode_return"])
    assert np.mean(returns[-125:]) > -250, returns[-125:].mean()
