"""PQN: its Q(lambda) returns and epsilon schedule, the reference interpreter under the policies, exact resume,
its config's ranges, and (-m slow) learning CartPole."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close
from fragc.algos import pqn
from fragc.passes import default_passes, resolve, run_pipeline

ITERATIONS = 2


@functools.cache
def tiny() -> pqn.PQN:
    return pqn.PQN(pqn.Config(num_envs=8, num_steps=4, num_minibatches=2, num_epochs=2, hidden=16,
                              total_steps=320, eps_decay=0.5))


@functools.cache
def traced() -> fragc.Module:
    return fragc.trace(tiny())


@functools.cache
def program(policy, devices=8):
    return fragc.compile(tiny(), policy, devices=devices, iterations_per_dispatch=ITERATIONS)


def interpret_n(module, state, replicas, iterations=ITERATIONS):
    history = []
    for _ in range(iterations):
        state, metrics = fragc.interpret(module, state, replicas=replicas)
        history.append(metrics)
    return state, history


def test_lambda_returns_match_a_plain_python_loop():
    rng = np.random.default_rng(0)
    T, N, gamma, lam = 7, 5, 0.9, 0.7
    reward = rng.normal(size=(T, N)).astype(np.float32)
    next_q = rng.normal(size=(T, N)).astype(np.float32)
    terminated = rng.random((T, N)) < 0.15
    done = terminated | (rng.random((T, N)) < 0.15)  # some truncated, not terminated
    got = np.asarray(pqn.lambda_returns(jnp.asarray(reward), jnp.asarray(terminated), jnp.asarray(done),
                                        jnp.asarray(next_q), gamma, lam))
    want = np.zeros((T, N))
    for n in range(N):
        future = None
        for t in reversed(range(T)):
            if terminated[t, n]:
                g = reward[t, n]
            elif done[t, n] or t == T - 1:  # the trace stops: bootstrap from the state reached
                g = reward[t, n] + gamma * next_q[t, n]
            else:
                g = reward[t, n] + gamma * ((1 - lam) * next_q[t, n] + lam * future)
            want[t, n] = future = g
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    one_step = pqn.lambda_returns(jnp.asarray(reward), jnp.asarray(terminated), jnp.asarray(done),
                                  jnp.asarray(next_q), gamma, 0.0)
    np.testing.assert_allclose(one_step, reward + gamma * (1 - terminated) * next_q, rtol=1e-5, atol=1e-6)


def test_epsilon_decays_linearly_over_its_fraction_of_the_run():
    algo = pqn.PQN(pqn.Config(total_steps=100 * 2048, eps_start=1.0, eps_finish=0.2, eps_decay=0.2))
    assert algo.config.iterations == 100
    eps = [float(algo.epsilon(jnp.int32(u))) for u in (0, 10, 20, 50, 99)]
    np.testing.assert_allclose(eps, [1.0, 0.6, 0.2, 0.2, 0.2], rtol=1e-6)
    flat = pqn.PQN(pqn.Config(eps_decay=0.0, eps_finish=0.1))
    assert float(flat.epsilon(jnp.int32(0))) == pytest.approx(0.1)


@pytest.mark.parametrize("policy,replicas", [pytest.param("single", 1, marks=pytest.mark.slow), ("anakin", 8)])
def test_synchronous_policy_equals_interpreter(policy, replicas):
    """anakin in the default suite (8 replicas: per-replica minibatches, the gradients' pmean, the return's psum);
    single, one replica of the same program, with -m slow: each cell's interpreter compiles the fragments anew."""
    prog = program(policy)
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    ref, ref_history = interpret_n(traced(), state, replicas)
    for i, metrics in enumerate(ref_history):
        for name in ("episode_return", "loss", "epsilon"):
            np.testing.assert_allclose(history[name][i], metrics[name], rtol=1e-4, atol=1e-5)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)
    assert float(history["epsilon"][1]) < float(history["epsilon"][0]) == 1.0


def test_checkpoint_and_exact_resume(tmp_path):
    """A run stopped after its first checkpoint and resumed equals an uninterrupted one bit for bit (the anakin
    program the test above compiled: 8 replicas' state, per-environment keys included)."""
    prog = program("anakin")
    whole = fragc.train(prog, prog.init(0), 3 * ITERATIONS)
    fragc.train(prog, prog.init(0), 3 * ITERATIONS, checkpoint_dir=tmp_path, checkpoint_every=ITERATIONS,
                stop_after=ITERATIONS)
    resumed = fragc.train(prog, prog.init(0), 3 * ITERATIONS, checkpoint_dir=tmp_path, resume=True)
    assert resumed.resumed_from == ITERATIONS
    assert_trees_close(resumed.state, whole.state, rtol=0, atol=0)


@pytest.mark.parametrize("policy,expected", [("actor_learner", (2, 3)), ("actor_learner_async", (2, 2))])
def test_actor_learner_stages(policy, expected):
    """Params and the iteration count go to the actors, the rollout (obs, action, target) to the learner
    once for all epochs; async delays params and count together."""
    module = run_pipeline(traced(), default_passes(resolve(policy, 8), 4, "device_put")).final
    transfers = sum(n.kind == "transfer" for n in module.graph.nodes)
    assert (len(module.stages), transfers) == expected
    assert [s.group for s in module.stages] == ["actors", "learner"]


@pytest.mark.parametrize("field,value,message", [
    ("td_lambda", 1.5, "pqn: td_lambda must be in [0, 1], got 1.5"),
    ("eps_decay", -0.1, "pqn: eps_decay must be in [0, 1], got -0.1"),
    ("reward_scale", 0.0, "pqn: reward_scale must be positive, got 0"),
    ("num_minibatches", 3, "pqn: num_envs * num_steps (2048) must divide by num_minibatches (3)"),
])
def test_a_bad_config_value_is_one_line(field, value, message):
    with pytest.raises(fragc.FragcError) as err:
        pqn.Config(**{field: value})
    assert str(err.value) == message


def test_the_command_line_lists_and_checks_pqn(capsys):
    from fragc.cli import main

    assert main(["algos"]) == 0
    assert "pqn" in capsys.readouterr().out
    assert main(["run", "pqn", "--td-lambda", "2"]) == 2
    assert capsys.readouterr().err == "fragc: error: pqn: td_lambda must be in [0, 1], got 2\n"


# ---------------------------------------------------------------- -m slow: the other policies, learning


@pytest.mark.slow
@pytest.mark.parametrize("policy,replicas", [("gspmd", 1), ("actor_learner", {"actor": 4, "learner": 4})])
def test_other_synchronous_policies_equal_interpreter(policy, replicas):
    prog = program(policy)
    state = prog.init(0)
    out, _ = prog.run(state, ITERATIONS)
    ref, _ = interpret_n(traced(), state, replicas)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


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
def test_evaluation_runs_the_greedy_policy():
    algo = pqn.PQN(pqn.Config(num_envs=8, num_steps=4, num_minibatches=2, hidden=16, eval_every=1,
                              eval_episodes=2))
    prog = fragc.compile(algo, "single")
    _, history = prog.run(prog.init(0), 2)
    assert np.all(np.asarray(history["eval_return"]) > 0)


@pytest.mark.slow
def test_cartpole_reaches_475_within_purejaxqls_budget():
    """purejaxql's pqn_cartpole.yaml: 5e5 environment steps (the default config)."""
    best = 0.0
    for seed in range(3):
        algo = pqn.PQN(pqn.Config())
        prog = fragc.compile(algo, "single", iterations_per_dispatch=61)
        _, history = prog.run(prog.init(seed), algo.config.iterations)
        best = max(best, float(np.asarray(history["episode_return"])[-1]))
        if best >= 475:
            break
    assert best >= 475, best
