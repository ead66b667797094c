"""Host environments (src/fragc/algos/host_envs.py): a gymnax environment stepped on the host through the host path
gives the device path's trajectory step for step; the Gymnasium backend equals a plain Gymnasium loop; the
IR shows the host step and its bytes; policies that cannot run host environments say so in one line."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import sys
import warnings

import chex
import gymnasium
import jax
import numpy as np
import pytest

import fragc
from fragc.algos import ppo
from fragc.algos.envs import VecEnv, split_env_name
from fragc.algos.host_envs import HOST_POOLS, HostPool, register_host_pool, seeds_of
from fragc.ir import parse
import shared_programs
from conftest import assert_trees_close


class GymnaxHostPool(HostPool):
    """The test adapter: a gymnax environment stepped on the host, numpy in and out, with the keys the
    device path would use, so the host path must reproduce the device path exactly. It takes a worker count
    as EnvPool does (and ignores it), so the tests can see where a placement's count arrives, and steps in
    a worker thread of its own between `send` and `recv`, as EnvPool's pool does, so a host loop that reads
    results before they are there, or starts a step twice, shows."""

    worker_kind = "threads"

    @classmethod
    def spaces(cls, env_id):
        import gymnax

        env, params = gymnax.make(env_id)
        return env.observation_space(params), env.action_space(params)

    def __init__(self, env_id, num_envs, workers=0):
        import gymnax

        super().__init__(env_id, num_envs, workers)
        env, params = gymnax.make(env_id)
        self._reset = jax.jit(jax.vmap(lambda k: env.reset(k, params)))
        self._step = jax.jit(jax.vmap(lambda k, s, a: env.step(k, s, a, params)))
        self.state = None

    def reset(self, keys):
        # as Gymnasium's AsyncVectorEnv, which refuses a reset while a step is in flight
        assert getattr(self, "_pending", None) is None, "a reset while a step was in flight"
        obs, self.state = self._reset(jax.random.wrap_key_data(keys))
        return np.asarray(obs)

    def step(self, actions, keys):
        obs, self.state, reward, terminated, truncated, info = self._step(
            jax.random.wrap_key_data(keys), self.state, actions)
        return tuple(np.asarray(x) for x in (obs, reward, terminated, truncated, info["final_observation"]))

    def send(self, actions, keys):
        assert getattr(self, "_pending", None) is None, "a step was sent before the last one was received"
        self._pending = self._worker.submit(self.step, np.copy(actions), np.copy(keys))

    def recv(self):
        pending, self._pending = self._pending, None
        return pending.result()

    @functools.cached_property
    def _worker(self):
        return concurrent.futures.ThreadPoolExecutor(1)

    def close(self):
        if "_worker" in self.__dict__:
            self._worker.shutdown()


register_host_pool("gymnax_host", GymnaxHostPool, "gymnax environments stepped on the host (tests only)")



def ppo_on(env):
    """The shared PPO program's algorithm (tests/shared_programs.py), on `env`."""
    return ppo.PPO(dataclasses.replace(shared_programs.ppo_algo().config, env=env))


def runner_numbers(runner):
    """What the two paths share of a runner (the environment state is the device's or a pool index)."""
    return (runner.obs, runner.key, runner.episode_return, runner.last_return, runner.has_return)


@pytest.mark.parametrize("env_id,num_envs,steps,tolerance", [
    ("CartPole-v1", 4, 64, 1e-6),  # terminations; in this process: the suite's XLA flags (tests/conftest.py)
    pytest.param("CartPole-v1", 4, 64, 0, marks=[pytest.mark.slow, pytest.mark.xla_defaults]),  # bit-equal
    # never terminates: every episode is truncated at step 200. XLA fuses the pendulum's dynamics into the
    # device program differently from the host's separate step program: observations differ in the last bit.
    ("Pendulum-v1", 2, 210, 1e-5),
])
def test_host_path_gives_the_device_paths_trajectory_step_for_step(env_id, num_envs, steps, tolerance):
    """The same environment on the device and through the host path, the same random actions, in one program."""
    envs = [VecEnv(env_id), VecEnv(f"gymnax_host:{env_id}")]

    def trajectory(env, key):
        def step(runner, action_key):
            space = env.action_space
            if env.is_discrete():
                action = jax.random.randint(action_key, (num_envs,), 0, space.n)
            else:
                action = jax.random.uniform(action_key, (num_envs,) + space.shape, minval=space.low, maxval=space.high)
            obs = runner.obs
            runner, out = env.step(runner, action)
            return runner, (obs, out)

        runner, (obs, out) = jax.lax.scan(step, env.reset(key, num_envs), jax.random.split(key, steps))
        return obs, out, runner_numbers(runner)

    device, host = jax.jit(lambda key: [trajectory(env, key) for env in envs])(jax.random.key(0))
    assert_trees_close(host, device, rtol=tolerance, atol=tolerance)
    chex.assert_trees_all_equal((host[1].terminated, host[1].truncated), (device[1].terminated, device[1].truncated))
    obs, out, _ = device
    assert out.episode_done.any()  # the comparison covers episode ends and auto-resets
    if env_id == "Pendulum-v1":  # truncation, not termination; final_obs is the state reached, not the reset
        assert not out.terminated.any() and out.truncated[199].all() and not out.truncated[:199].any()
        assert not np.array_equal(out.final_obs[199], obs[200])


@pytest.fixture(scope="module")
def host_single():
    return fragc.compile(ppo_on("gymnax_host:CartPole-v1"), "single", env_workers=3)  # 3: see the workers test


def assert_equals_the_device_program(host, policy="single", devices=1, tolerance=0.0):
    """`host` (PPO stepping CartPole through the host path) runs as the shared device-path program does."""
    _, _, dev_state, dev_metrics = shared_programs.ppo_run(policy, devices)
    state, metrics = host.run(host.init(0), shared_programs.ITERATIONS)
    assert_trees_close(metrics, dev_metrics, rtol=tolerance, atol=tolerance)
    assert_trees_close(state.learner, dev_state.learner, rtol=tolerance, atol=tolerance)
    assert_trees_close(runner_numbers(state.runner), runner_numbers(dev_state.runner), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("tolerance", [
    1e-5,  # in this process, whose XLA flags fuse the two programs differently (tests/conftest.py)
    pytest.param(0.0, marks=[pytest.mark.slow, pytest.mark.xla_defaults]),  # XLA's defaults: the same bits
])
def test_single_program_equals_the_device_program(host_single, tolerance):
    assert_equals_the_device_program(host_single, tolerance=tolerance)


@pytest.mark.parametrize("env_groups,pools", [
    (0, [tuple(range(8)), tuple(range(8, 16))]),  # host calls inside the program: a pool per device
    # host loop: a pool per group, both devices (2 groups on several devices by default: test_host_loop's processes)
    pytest.param(2, [(0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15)], marks=pytest.mark.slow),
])
def test_anakin_steps_a_pool_per_device_or_group_and_equals_the_device_program(env_groups, pools):
    """2 devices of 8 environments each: with the host step inside the program each device steps its own
    pool, concurrently; with a host loop of 2 groups, group g is environments of both devices, 4 from each."""
    algo = ppo_on("gymnax_host:CartPole-v1")
    host = fragc.compile(algo, "anakin", devices=2, env_groups=env_groups)
    state, metrics = host.run(host.init(0), shared_programs.ITERATIONS)
    _, _, dev_state, dev_metrics = shared_programs.ppo_run("anakin", 2)
    assert_trees_close(metrics, dev_metrics, rtol=1e-5, atol=1e-5)
    assert_trees_close(state.learner, dev_state.learner, rtol=1e-5, atol=1e-5)
    assert_trees_close(runner_numbers(state.runner), runner_numbers(dev_state.runner), rtol=1e-5, atol=1e-5)
    assert sorted(algo.env.pools) == pools


@pytest.mark.slow  # a second staged compile (~10 s on 2 busy cores)
@pytest.mark.xla_defaults
def test_actor_learner_program_equals_the_device_program():
    assert_equals_the_device_program(fragc.compile(ppo_on("gymnax_host:CartPole-v1"), "actor_learner", devices=2))


def test_the_ir_shows_the_host_step_and_its_bytes(host_single):
    c = host_single.algo.config
    n, t, obs = c.num_envs, c.num_steps, 4
    to_host = t * n * (4 + 4 + 4 + 8)  # per step: pool indices, pool step (i32), actions (i32), key data (2 x u32)
    from_host = t * n * (obs * 4 + 4 + 1 + 1 + obs * 4 + 4)  # obs, reward, terminated, truncated, final obs, pool step
    text = host_single.ir()
    line = f'host step "gymnax_host:CartPole-v1 step" on cpu calls={t} to_host={to_host} from_host={from_host}'
    rollout_lines = text.split("fragment @rollout", 1)[1].split("fragment @learn", 1)
    assert line in rollout_lines[0] and "host step" not in rollout_lines[1]
    total = host_single.cost()["total"]
    assert (total["device_to_host_bytes"], total["host_to_device_bytes"]) == (to_host, from_host)
    assert parse(text).fragments["rollout"].host_steps == host_single.module.fragments["rollout"].host_steps


def test_env_workers_are_placed_printed_parsed_and_reach_every_pool(host_single):
    """The policy's worker count is the host fragment's placement: in the IR, read back by the parser, and
    given to each pool as it is made (the program's numbers are the device program's: the test above)."""
    prog = host_single
    text = prog.ir()
    assert "fragment @rollout role=actor on @main shard_map replicas=1 host_loop(groups=1) env_workers=3 " in text
    # only fragments that step host environments: the rollout, and its loop node's host step on @host
    assert [line.split(" eqns=")[0] for line in text.splitlines() if "env_workers" in line] == [
        "fragment @rollout role=actor on @main shard_map replicas=1 host_loop(groups=1) env_workers=3",
        "fragment @rollout.env_step role=host on @host host replicas=1 env_workers=3"]
    assert parse(text).fragments["rollout"].placement.env_workers == 3
    state, _ = prog.run(prog.init(0), 1)
    assert prog.algo.env.pools and {s.pool.num_workers for s in prog.algo.env.pools.values()} == {3}

    # Another program over the same environments, with another count (`Program` applies it as below): the
    # pools already made are left to the first, which goes on stepping them without a reset.
    from fragc.compiler import run_passes
    from fragc.ir.host import apply_env_workers

    env, pools = prog.algo.env, dict(prog.algo.env.pools)
    apply_env_workers(run_passes(prog.algo, fragc.CompileOptions("single", env_workers=1))[0].final)
    assert env.pools == pools and env.workers == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a closed pool would be reset mid-run, with a warning
        prog.run(state, 1)
    env.set_workers(3)


@pytest.mark.parametrize("env,message", [
    ("gymnasium:CartPole-v1", r"env_workers=2: gymnasium environments take no worker count \(it steps its "
                              r"environments one after another in this process\); a worker count sets EnvPool's"),
    ("gymnasium_async:CartPole-v1", "env_workers=2: gymnasium_async environments take no worker count "
                                    r"\(Gymnasium's AsyncVectorEnv starts one worker process per environment\)"),
])
def test_a_worker_count_for_a_backend_without_workers_is_one_line(env, message, capsys):
    with pytest.raises(fragc.FragcError, match=message):
        fragc.compile(ppo_on(env), "single", env_workers=2)
    from fragc.cli import main  # `fragc ir` refuses it too: the placement is where it is checked

    assert main(["ir", "ppo", "--env", env, "--env-workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "take no worker count" in err, err


class TwoArgumentPool(GymnaxHostPool):
    """Says it takes threads but its __init__ takes no count."""

    def __init__(self, env_id, num_envs):
        super().__init__(env_id, num_envs)


register_host_pool("gymnax_two_args", TwoArgumentPool, "a pool whose __init__ takes no count (tests only)")


def test_a_pool_class_that_cannot_take_its_worker_count_is_one_line():
    from fragc.compiler import run_passes  # the passes alone: refused where the placement is made, before XLA

    with pytest.raises(fragc.FragcError, match=r"env_workers=2: TwoArgumentPool says it takes threads but its "
                                               r"__init__ takes no third argument \(workers\)"):
        run_passes(ppo_on("gymnax_two_args:CartPole-v1"), fragc.CompileOptions("single", env_workers=2))


@pytest.mark.parametrize("policy,devices,message", [
    ("gspmd", 2, "fragment 'rollout' steps host environments and is spread over 2 devices"),
    ("population(single,2)", 1, "a population with host environments is not supported yet"),
])
def test_policies_that_cannot_run_host_environments_refuse_in_one_line(policy, devices, message):
    with pytest.raises(fragc.FragcError, match=message):
        fragc.compile(ppo_on("gymnasium:CartPole-v1"), policy, devices=devices)  # refused before XLA compiles


def test_gymnasium_backend_equals_a_plain_gymnasium_loop():
    n, steps = 3, 40
    env = VecEnv("gymnasium:CartPole-v1")
    runner = jax.jit(env.reset, static_argnums=1)(jax.random.key(7), n)
    step = jax.jit(env.step)
    reference = gymnasium.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync",
                                   vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP})
    reset_keys = jax.vmap(jax.random.split)(jax.random.split(jax.random.key(7), n))[:, 0]
    obs, _ = reference.reset(seed=seeds_of(np.asarray(jax.random.key_data(reset_keys))))
    np.testing.assert_array_equal(runner.obs, obs)
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(steps):
        action = rng.integers(0, 2, n)
        runner, out = step(runner, jax.numpy.asarray(action, jax.numpy.int32))
        obs, reward, terminated, truncated, info = reference.step(action)
        np.testing.assert_array_equal(runner.obs, obs)
        np.testing.assert_array_equal(out.reward, reward)
        np.testing.assert_array_equal(out.terminated, terminated)
        np.testing.assert_array_equal(out.truncated, truncated)
        for i in np.flatnonzero(terminated | truncated):
            np.testing.assert_array_equal(out.final_obs[i], info["final_obs"][i])
            ends += 1
    assert ends > 0


def test_async_gymnasium_pool_steps_as_the_sync_one():
    """Worker processes with shared memory give the sync pool's numbers (the pools alone: numpy, no JAX)."""
    keys = np.arange(6, dtype=np.uint32).reshape(3, 2)
    pools = [HOST_POOLS[b]("CartPole-v1", 3) for b in ("gymnasium", "gymnasium_async")]
    try:
        chex.assert_trees_all_equal(*[p.reset(keys) for p in pools])
        actions = np.random.default_rng(0).integers(0, 2, (30, 3))
        for a in actions:
            chex.assert_trees_all_equal(*[p.step(a, keys) for p in pools])
    finally:
        for p in pools:
            p.close()


def test_a_resumed_run_resets_the_host_environments_with_a_warning():
    env = VecEnv("gymnasium:CartPole-v1")
    start = jax.jit(env.reset, static_argnums=1)(jax.random.key(0), 2)
    step = jax.jit(env.step)
    action = jax.numpy.zeros(2, jax.numpy.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # continuing the pool's last step does not warn
        runner, out = step(*step(start, action)[:1], action)
        jax.block_until_ready(out)
    assert not out.truncated.any()
    for resumed in (start, runner):  # a state the pool has moved on from (a checkpoint restored in this process)...
        if resumed is runner:  # ...or a new process, where no pool exists
            env.pools.clear()
        with pytest.warns(UserWarning, match="state is not in the checkpoint"):
            _, out = step(resumed, action)
            jax.block_until_ready(out)
        assert out.truncated.all() and not out.terminated.any() and (out.reward == 0).all()


def test_envpool_steps_with_same_step_autoreset():
    pytest.importorskip("envpool", reason="envpool is the optional extra fragc[host]")
    env = VecEnv("envpool:CartPole-v1")
    runner = jax.jit(env.reset, static_argnums=1)(jax.random.key(0), 2)
    step = jax.jit(env.step)
    ends = 0
    for _ in range(40):  # always pushing right ends every episode within ~10 steps
        runner, out = step(runner, jax.numpy.ones(2, jax.numpy.int32))
        for i in np.flatnonzero(out.episode_done):
            x, _, theta, _ = np.asarray(out.final_obs[i])
            assert abs(theta) > 0.2094 or abs(x) > 2.4  # the terminal state reached...
            assert np.abs(np.asarray(runner.obs[i])).max() <= 0.05  # ...and the next episode's first observation
            ends += 1
    assert ends >= 4


def test_bad_environment_names_get_one_clear_line(monkeypatch):
    with pytest.raises(fragc.FragcError, match="unknown environment backend 'gym'"):
        split_env_name("gym:CartPole-v1")
    with pytest.raises(fragc.FragcError, match="gymnasium: cannot make 'NoSuchEnv-v0'"):
        VecEnv("gymnasium:NoSuchEnv-v0")
    monkeypatch.setitem(sys.modules, "envpool", None)  # as if the extra were not installed
    with pytest.raises(fragc.FragcError, match=r"pip install 'fragc\[host\]'"):
        VecEnv("envpool:Pong-v5")


@pytest.mark.slow  # 5e5 CartPole steps through Gymnasium on the host: 197 s of running on 2 busy cores
def test_ppo_on_gymnasium_cartpole_reaches_475():
    from conftest import train_returns

    returns = train_returns(ppo.PPO(ppo.Config(env="gymnasium:CartPole-v1", total_steps=500_000)))
    assert returns[-1] >= 475, returns[-10:]


def test_fragc_envs_lists_the_backends_and_a_bad_backend_is_one_line(capsys, monkeypatch):
    from fragc.cli import lists, main

    for suite in ("jumanji", "brax", "playground"):  # importing them to list their ids takes 15 s (test_cli_refusals.py)
        monkeypatch.setitem(lists.ID_LISTS, suite, (lambda: [], ""))
    assert main(["envs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[:4]] == ["gymnax:ID", "gymnasium:ID", "gymnasium_async:ID", "envpool:ID"]
    assert any(line.startswith("CartPole-v1 ") for line in out)
    assert main(["ir", "ppo", "--env", "gym:CartPole-v1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "fragc: error: unknown environment backend 'gym' in 'gym:CartPole-v1'; backends: gymnax, gymnasium, "
        "gymnasium_async, envpool, jaxmarl, craftax, jumanji, brax, playground, pgx, gymnax_host, gymnax_two_args"]


class ByteFrames(gymnasium.Env):
    """A Gymnasium environment with 8-bit observations, as Atari frames are: a counter in every pixel."""

    observation_space = gymnasium.spaces.Box(0, 255, (2, 3), np.uint8)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = int(self.np_random.integers(0, 200))
        return np.full((2, 3), self.t, np.uint8), {}

    def step(self, action):
        self.t = (self.t + 1 + int(action)) % 256
        return np.full((2, 3), self.t, np.uint8), 1.0, False, self.t == 0, {}


gymnasium.register(id="FragcByteFrames-v0", entry_point=ByteFrames)


def test_eight_bit_observations_cross_as_bytes_and_arrive_as_float32():
    """A quarter of float32's bytes from the host (the IR's count), the same numbers on the device."""
    env = VecEnv("gymnasium:FragcByteFrames-v0")
    n = 3

    def two_steps(key):
        runner = env.reset(key, n)
        after, _ = env.step(runner, jax.numpy.ones(n, jax.numpy.int32))
        return runner.obs, after.obs

    first, second = jax.jit(two_steps)(jax.random.key(0))
    assert first.dtype == second.dtype == np.float32 and first.shape == (n, 6)
    np.testing.assert_array_equal(second, (first + 2) % 256)  # action 1 adds 2 to the counter
    algo = ppo.PPO(ppo.Config(env="gymnasium:FragcByteFrames-v0", num_envs=4, num_steps=8))
    (step,) = fragc.trace(algo).fragments["rollout"].host_steps
    per_env_step = 6 + 4 + 1 + 1 + 6 + 4  # obs (uint8), reward, terminated, truncated, final obs (uint8), pool step
    assert step.from_host == 8 * 4 * per_env_step
