"""Every built-in policy against the reference semantics, on 8 simulated devices (PPO, 3 iterations).

Programs and runs are shared (tests/shared_programs.py): each policy compiles once.
"""

import jax
import numpy as np
import pytest

import fragc
from conftest import as_numbers, assert_trees_close
from shared_programs import ITERATIONS, ppo_algo, ppo_run


@pytest.fixture(scope="module")
def algo():
    return ppo_algo()


@pytest.fixture(scope="module")
def module(algo):
    return fragc.trace(algo)


def run_program(algo, policy, devices=8, seed=0):
    assert algo is ppo_algo()
    return ppo_run(policy, devices, seed)


def interpret_n(module, state, replicas):
    history = []
    for _ in range(ITERATIONS):
        state, metrics = fragc.interpret(module, state, replicas=replicas)
        history.append(metrics)
    return state, {k: np.array([m[k] for m in history]) for k in history[0]}


def assert_history_close(got, expected, rtol=1e-4, atol=1e-5):
    assert sorted(got) == sorted(expected)
    for k in got:
        np.testing.assert_allclose(got[k], expected[k], rtol=rtol, atol=atol, err_msg=k)


def test_anakin_equals_interpreter_with_8_replicas(algo, module):
    prog, state, out, history = run_program(algo, "anakin")
    ref, ref_history = interpret_n(module, state, 8)
    assert_trees_close(out, ref, rtol=1e-4, atol=1e-5)
    assert_history_close(history, ref_history)


def test_gspmd_equals_single(algo):
    _, _, single_out, single_history = run_program(algo, "single", devices=1)
    prog, _, out, history = run_program(algo, "gspmd")
    assert_trees_close(out, single_out, rtol=1e-4, atol=1e-5)
    assert_history_close(history, single_history)
    assert len(prog.devices) == 8


def test_actor_learner_equals_interpreter_with_matching_replicas(algo, module):
    prog, state, out, history = run_program(algo, "actor_learner")
    assert prog.stages == ["actors", "learner"]
    ref, ref_history = interpret_n(module, state, {"actor": 4, "learner": 4})
    assert_trees_close(out, ref, rtol=1e-4, atol=1e-5)
    assert_history_close(history, ref_history)


def test_actor_learner_async_equals_its_pipelined_module_and_repeats(algo):
    prog, state, out, history = run_program(algo, "actor_learner_async")
    pipelined = prog.pipeline.after("insert_delays")
    assert any(n.kind == "delay" for n in pipelined.graph.nodes)
    ref, ref_history = fragc.run_iterations(pipelined, state, ITERATIONS)
    assert_trees_close(out, ref, rtol=1e-4, atol=1e-5)
    assert_history_close(history, {k: np.array([m[k] for m in ref_history]) for k in ref_history[0]})
    again, again_history = prog.run(state, ITERATIONS)
    for a, b in zip(jax.tree.leaves(as_numbers(out)), jax.tree.leaves(as_numbers(again))):
        np.testing.assert_array_equal(a, b)
    for k in history:
        np.testing.assert_array_equal(history[k], again_history[k])


def test_async_differs_from_sync(algo):
    """Staleness is real: the pipelined run is not the synchronous one."""
    _, _, sync_out, _ = run_program(algo, "actor_learner")
    _, _, async_out, _ = run_program(algo, "actor_learner_async")
    diffs = [np.abs(a - b).max() for a, b in zip(jax.tree.leaves(as_numbers(sync_out.learner.params)),
                                                  jax.tree.leaves(as_numbers(async_out.learner.params)))]
    assert max(diffs) > 1e-6


@pytest.mark.slow  # the fast suite's tests/test_sweep.py compares vectorised members with their single runs
def test_population_equals_separate_single_runs(algo):
    prog, state, out, history = run_program(algo, fragc.population("single", 4), devices=1)
    single = run_program(algo, "single", devices=1)[0]  # one compiled program, run from each seed
    for i in range(4):
        single_out, single_history = single.run(single.init(i), ITERATIONS)
        assert_trees_close(jax.tree.map(lambda x: x[i], out), single_out, rtol=1e-4, atol=1e-5)
        assert_history_close({k: v[i] for k, v in history.items()}, single_history)
