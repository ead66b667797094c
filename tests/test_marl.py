"""Multi-agent: JaxMARL's environments with an agent axis, IPPO and MAPPO, the agent axis in the IR, and the
agents' learners on devices of their own (`agent_learners`) against the reference interpreter and `jax.jit`.

The wider matrix (IPPO with per-agent parameters under anakin, actor_learner_async and a population) is
test_algorithms_x_policies.py's, in -m slow; learning is test_learning.py's (-m slow)."""

import functools
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close, traced_module

# found, not imported: importing jaxmarl (its environments, 2.6 s) here cost each xdist worker that collects this file
if importlib.util.find_spec("jaxmarl") is None:
    pytest.skip("jaxmarl is the optional extra fragc[marl]", allow_module_level=True)

from fragc.algos import ippo, mappo  # noqa: E402
from fragc.algos.envs import VecEnv  # noqa: E402
from fragc.ir.errors import FragcError  # noqa: E402

SMALL = dict(num_envs=4, num_steps=4, num_minibatches=2, update_epochs=1, hidden=16)
ITERATIONS = 2


@functools.cache
def per_agent_ippo() -> ippo.IPPO:
    return ippo.IPPO(ippo.Config(shared_params=False, **SMALL))


@functools.cache
def agent_learners_run():
    algo = per_agent_ippo()
    prog = fragc.compile(algo, "agent_learners(actors=1,learners=3)", devices=4)
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    return prog, state, out, history


def jit_iterations(algo, state, n=ITERATIONS):
    """`n` iterations of a plain `jax.jit` of the iteration, on one device."""
    state = jax.device_put(state, jax.devices()[0])
    step = jax.jit(algo.iteration)
    for _ in range(n):
        state, metrics = step(state)
    return state, metrics


def test_mpe_stacks_agents_after_the_environment_axis():
    env = VecEnv("jaxmarl:MPE_simple_spread_v3")
    layout = env.layout
    runner = jax.jit(env.reset, static_argnums=1)(jax.random.key(0), 2)
    assert runner.obs.shape == (2, 3, layout.size) and layout.size == 18 + 54  # own | the agents' side by side
    obs, _ = env.env.reset(jax.random.split(jax.random.split(jax.random.key(0), 2)[0])[0])
    np.testing.assert_array_equal(layout.own(runner.obs[0]), np.stack([obs[a] for a in env.agents]))
    np.testing.assert_array_equal(layout.world(runner.obs[0, 1]), np.concatenate([obs[a] for a in env.agents]))
    step = jax.jit(env.step)
    for _ in range(env.max_episode_steps + 1):
        runner, out = step(runner, jnp.ones((2, 3), jnp.int32))
    assert out.reward.shape == out.truncated.shape == (2, 3)
    assert not out.terminated.any() and runner.has_return.all()  # MPE ends at its time limit: truncated
    assert runner.last_length[0, 0] == env.max_episode_steps + 1 and runner.last_return.shape == (2, 3)


def test_trajectory_and_parameters_carry_agent_axes_in_the_ir():
    text = str(fragc.trace(per_agent_ippo()))
    assert "obs: f32[4@env,3@agent,18]" in text and "obs: f32[4,4@env,3@agent,18]" in text  # runner; trajectory
    assert "kernel: f32[3@agent,18,16]" in text  # each agent's own parameters


def test_agent_learners_equal_the_reference():
    """Each agent's learner on a device of its own equals the module run by the reference interpreter with one
    replica (the agents' learners share nothing), and the IR says so and parses back."""
    prog, state, out, history = agent_learners_run()
    text = prog.ir()
    assert "@learn_agents role=learner on @learners shard_map replicas=3 split=agent" in text
    ref = state
    for i in range(ITERATIONS):
        ref, metrics = fragc.interpret(traced_module(prog), ref, replicas=1)
        np.testing.assert_allclose(history["loss"][i], metrics["loss"], rtol=1e-4, atol=1e-5)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)
    assert str(fragc.ir.parse(text, bodies=prog.module)) == text


@pytest.mark.slow
def test_agent_learners_equal_jit_and_the_split_semantics():
    """The same run against a plain jax.jit of the iteration, and the interpreter's split=agent semantics on the
    placed module (3 replicas, each one agent) against one replica."""
    prog, state, out, _ = agent_learners_run()
    assert_trees_close(out, jit_iterations(per_agent_ippo(), state)[0], rtol=2e-4, atol=2e-5)
    split, _ = fragc.interpret(prog.pipeline.after("place"), state, replicas={"actor": 1, "learner": 3})
    one, _ = fragc.interpret(traced_module(prog), state, replicas=1)
    assert_trees_close(split, one, rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_mappo_smax_equals_the_reference_and_jit():
    """MAPPO's centralised critic on SMAX 3m (available actions masked), shared parameters: `single` against the
    interpreter and jax.jit."""
    algo = mappo.MAPPO(mappo.Config(env="jaxmarl:SMAX_3m", **SMALL))
    assert (algo.config.lr, algo.config.clip_eps, algo.env.layout.masked) == (0.004, 0.05, True)  # the SMAX preset
    prog = fragc.compile(algo, "single")
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    ref, metrics = jit_iterations(algo, state)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)
    module = fragc.trace(algo)
    for _ in range(ITERATIONS):
        state, metrics = fragc.interpret(module, state, replicas=1)
    assert_trees_close(out, state, rtol=2e-4, atol=2e-5)
    assert {"win_rate", "episode_return_agent2"} <= set(history)


class WrongAgentAxis(ippo.IPPO):
    """Declares the trajectory's agent axis on its time axis."""

    rollout_shared = fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None),
                                    agent_axes=((None, None), (0, None, None)))(ippo.rollout)


CLI_CASES = [
    # (case, argv, the line's text): each refused before compiling, exit code 2
    ("a single-agent algorithm on a multi-agent environment", ["run", "ppo", "--env", "jaxmarl:MPE_simple_spread_v3"],
     "fragc: error: ppo is a single-agent algorithm; jaxmarl:MPE_simple_spread_v3 has 3 agents (use ippo or mappo)"),
    ("a multi-agent algorithm on a single-agent environment", ["run", "mappo", "--env", "CartPole-v1"],
     "fragc: error: mappo is a multi-agent algorithm; CartPole-v1 is a single-agent environment"),
    ("shared parameters placed per agent", ["run", "ippo", "--policy", "agent_learners(actors=1,learners=3)",
                                            "--devices", "4"],
     "fragc: error: policy 'agent_learners(actors=1,learners=3)' splits fragment 'learn' over agents, but none of its "
     "results has an agent axis: the agents share what it returns (their parameters)"),
    ("shared parameters on learners that do not divide the agents: the sharing named, not the count",
     ["run", "ippo", "--policy", "agent_learners", "--devices", "4"],
     "fragc: error: pass 'place{policy=agent_learners}' failed (after 001_trace, 002_canonicalize): policy "
     "'agent_learners' splits fragment 'learn' over agents, but none of its results has an agent axis"),
    ("per-agent parameters on devices that do not divide the agents",
     ["run", "ippo", "--no-shared-params", "--policy", "agent_learners(actors=2,learners=2)", "--devices", "4"],
     "fragc: error: policy 'agent_learners(actors=2,learners=2)' splits fragment 'learn_agents' over 2 devices, and "
     "its 3 agents' parameters do not divide among them"),
    ("an unknown SMAX map", ["run", "ippo", "--env", "jaxmarl:SMAX_99z"],
     "fragc: error: jaxmarl: unknown SMAX map in 'SMAX_99z'"),
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_bad_multi_agent_input_is_one_line(capsys, argv, message):
    from fragc.cli import main

    try:
        code = main(argv + ["--num-envs", "4", "--num-steps", "4", "--iterations", "1", "--quiet"])
    except SystemExit as exit:
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fragc: error: ") and err.count("\n") == 1, err
    assert message.removeprefix("fragc: error: ") in err, err


@pytest.mark.parametrize("case,make,message", [
    ("an agent axis that disagrees with the environment's agent count",
     lambda: fragc.trace(WrongAgentAxis(ippo.Config(**SMALL))),
     "fragment 'rollout' declares an agent axis of length 4, but WrongAgentAxis's environment has 3 agents"),
    ("agents split under GSPMD",
     lambda: fragc.Policy("p", {"a": (0,)}, {"*": fragc.RolePlacement("a", 1, "jit", split="agent")}),
     "policy 'p': role '\\*' splits agents under jit"),
    ("agent axes of two lengths in one fragment",
     lambda: fragc.fragment(role="learner", in_axes=None, out_axes=None, agent_axes=(0, 0))(
         lambda x, y: x + y[:1])(jnp.zeros(3), jnp.zeros(4)),
     "fragment 'learner': declared agent axes have different lengths"),
])
def test_bad_multi_agent_declaration_is_one_line(case, make, message):
    with pytest.raises(FragcError, match=message) as err:
        make()
    assert "\n" not in str(err.value)


def train_returns(algo) -> np.ndarray:
    prog = fragc.compile(algo, "single", iterations_per_dispatch=16)
    _, history = prog.run(prog.init(0), algo.config.iterations)
    return np.asarray(history["episode_return"])


@pytest.mark.slow
@pytest.mark.parametrize("algo", [ippo.IPPO(ippo.Config(total_steps=1_000_000)),
                                  mappo.MAPPO(mappo.Config(total_steps=1_000_000))], ids=["ippo", "mappo"])
def test_learns_mpe_simple_spread(algo):
    """JaxMARL's IPPO configuration for 1e6 steps (90 s and 144 s on a loaded 2-core CPU): each agent's episode
    return (the sum of its 26 steps' rewards) rose from -26.3 (first 10 iterations) to -19.5 (last 10) with seed 0,
    MAPPO's from -26.2 to -19.3."""
    returns = train_returns(algo)
    early, late = returns[:10].mean(), returns[-10:].mean()
    assert early < -24 and late > -22 and late > early + 3, (early, late)


def test_the_agents_trajectories_carry_no_next_observations():
    """IPPO's and MAPPO's learners are PPO's epoch (shared or per-agent parameters), which reads V(s_{t+1}) only:
    the reached observations ([T, N, A, D]) are not shuffled with every epoch's minibatches."""
    for algo in (ippo.IPPO(), ippo.IPPO(ippo.Config(shared_params=False)), mappo.MAPPO()):
        state = jax.eval_shape(algo.init, jax.random.key(0))
        traj, _, _ = jax.eval_shape(algo.rollout, state.learner.params, state.runner)
        assert traj.next_obs is None and traj.next_value.shape == traj.reward.shape, type(algo).__name__


def test_episodes_count_the_environments_episodes_not_the_agents():
    """MPE's episodes last 26 steps (its max_steps 25, +1 as test_mpe_stacks_agents_after_the_environment_axis
    finds): 52 steps of 4 environments end 8 episodes, not 8 x 3 agents'."""
    algo = ippo.IPPO(ippo.Config(**{**SMALL, "num_steps": 52}))
    state = jax.jit(algo.init)(jax.random.key(0))
    traj, _, metrics = jax.jit(algo.rollout)(state.learner.params, state.runner)
    assert algo.env.max_episode_steps == 25 and traj.done.shape == (52, 4, 3)
    assert int(metrics["episodes"]) == 8 and int(jnp.sum(traj.done)) == 24


@pytest.mark.slow  # a fresh process importing jaxmarl: 12 s
def test_importing_jaxmarl_keeps_the_callers_stdout():
    """Importing jaxmarl sets sys.stdout back to sys.__stdout__; through fragc a caller's stream (pytest's capture,
    a notebook's) stays. In a fresh process, where jaxmarl is not imported yet."""
    import subprocess
    import sys

    code = ("import io, sys\nbuf = io.StringIO()\nsys.stdout = buf\n"
            "from fragc.algos.marl_envs import _import_jaxmarl\n_import_jaxmarl()\n"
            "assert sys.stdout is buf, sys.stdout\nsys.stderr.write('kept')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stderr.endswith("kept"), out.stderr[-2000:]
