"""The device suites (src/fragc/algos/device_suites.py): each steps as its own package does, keeps the observation
reached before an auto-reset, tells truncation from termination, runs an algorithm under a policy as the reference
interpreter does, and refuses bad input in one line. The Craftax, Brax and Playground programs take 15-60 s to
compile on the CPU: their runs are -m slow."""

import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close
from fragc.algos import make
from fragc.algos.device_suites import flat_leaves
from fragc.algos.envs import VecEnv
from fragc.cli import main
from fragc.ir.errors import FragcError


def test_jumanji_steps_as_its_auto_reset_wrapper_and_keeps_the_reached_observation():
    """Snake moving one way hits a wall: a terminated step whose final observation is the wrapper's `next_obs`,
    the runner's the reset one; checked step by step against jumanji itself."""
    import jumanji
    from jumanji.wrappers import AutoResetWrapper

    env = VecEnv("jumanji:Snake-v1")
    plain = AutoResetWrapper(jumanji.make("Snake-v1"), next_obs_in_extras=True)
    keys = jax.random.split(jax.random.key(3), 2)
    runner = env.reset_each(keys)
    states, _ = jax.vmap(plain.reset)(jax.vmap(jax.random.split)(jax.random.key_data(keys))[:, 0])
    step, plain_step = jax.jit(env.step), jax.jit(jax.vmap(plain.step))
    terminated_seen = False
    for _ in range(12):
        action = jnp.zeros(2, jnp.int32)
        runner, out = step(runner, action)
        states, ts = plain_step(states, action)
        np.testing.assert_array_equal(runner.obs, jax.vmap(flat_leaves)(ts.observation))
        np.testing.assert_array_equal(out.final_obs, jax.vmap(flat_leaves)(ts.extras["next_obs"]))
        np.testing.assert_array_equal(out.reward, ts.reward)
        np.testing.assert_array_equal(out.terminated, ts.last() & (ts.discount == 0))
        assert not np.any(out.truncated)
        terminated_seen |= bool(np.any(out.terminated))
    assert terminated_seen
    assert env.obs_size == runner.obs.shape[1] and env.max_episode_steps == 4000


def assert_anakin_equals_the_interpreter(algo):
    """Two iterations on 8 replicas, compiled and interpreted."""
    prog = fragc.compile(algo, "anakin", devices=8)
    state = prog.init(0)
    out, _ = prog.run(state, 2)
    ref = state
    module = fragc.trace(algo)
    for _ in range(2):
        ref, _ = fragc.interpret(module, ref, replicas=8)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


def test_ppo_on_jumanji_under_anakin_equals_the_interpreter():
    assert_anakin_equals_the_interpreter(make("ppo", env="jumanji:Game2048-v1", num_envs=8, num_steps=4,
                                              num_minibatches=2, update_epochs=1))


@pytest.mark.parametrize("args,says", [
    (["ppo", "--env", "craftax:Craftax-Symbolc-v1"], r"craftax: unknown environment 'Craftax-Symbolc-v1'; did you mean "
                                                      r"'Craftax-Symbolic-v1'\?"),
    (["ppo", "--env", "jumanji:Snak-v1"], r"jumanji: unknown environment 'Snak-v1'; did you mean 'Snake-v1'\?"),
    (["ppo", "--env", "jumanji:BinPack-v2"], r"jumanji:BinPack-v2 takes MultiDiscreteArray actions"),
    (["ppo_continuous", "--env", "jumanji:Snake-v1"], r"ppo_continuous supports continuous \(Box\) action spaces; "
                                                       r"jumanji:Snake-v1 is discrete"),
    (["ppo", "--env", "brax:antt"], r"brax: unknown environment 'antt'; did you mean 'ant'\?"),
    (["ppo", "--env", "brax:inverted_pendulum"], r"ppo supports discrete action spaces; brax:inverted_pendulum has Box"),
])
def test_bad_input_is_one_line_before_compiling(capsys, args, says):
    assert main(["run", *args, "--iterations", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "compiling" not in err
    assert re.search(says, err), err


def test_a_missing_suite_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "craftax.craftax_env", None)  # importing it raises ImportError
    with pytest.raises(FragcError, match=r"^craftax: environments need craftax: pip install 'fragc\[craftax\]'$"):
        VecEnv("craftax:Craftax-Symbolic-v1")


@pytest.mark.slow
def test_a_playground_robot_without_its_assets_is_refused_before_any_clone():
    from mujoco_playground._src import mjx_env

    if mjx_env.MENAGERIE_PATH.exists():
        pytest.skip("mujoco_menagerie is installed here")
    with pytest.raises(FragcError, match=r"playground:Go1JoystickFlatTerrain's robot is in mujoco_menagerie, which is "
                                         r"not installed"):
        VecEnv("playground:Go1JoystickFlatTerrain")


@pytest.mark.slow
@pytest.mark.parametrize("algo,env", [("ppo", "craftax:Craftax-Classic-Symbolic-v1"),
                                      ("ppo_continuous", "brax:inverted_pendulum"),
                                      ("ppo_continuous", "playground:CartpoleBalance")])
def test_an_algorithm_on_each_suite_under_anakin_equals_the_interpreter(algo, env):
    assert_anakin_equals_the_interpreter(make(algo, env=env, num_envs=8, num_steps=4, num_minibatches=2,
                                              update_epochs=1))


@pytest.mark.slow
def test_brax_truncates_at_its_episode_length_and_bootstraps():
    """brax's EpisodeWrapper at 1000 steps: inverted_pendulum held upright by no action runs... until it falls;
    whatever ends an episode, a step is terminated or truncated, never both, and truncated only at step 1000."""
    env = VecEnv("brax:inverted_pendulum")
    runner = env.reset(jax.random.key(0), 2)
    step = jax.jit(env.step)
    for t in range(1, 30):
        runner, out = step(runner, jnp.zeros((2, 1)))
        assert not np.any(out.terminated & out.truncated)
        assert not np.any(out.truncated)  # far from 1000 steps
    assert env.max_episode_steps == 1000
