"""Remote environment workers (src/fragc/algos/ray_envs.py): host environments stepped by Ray actors, placed by the IR.

The fleet's spec, its placement and printing, and bad input run without Ray. The rest share one local Ray of 2
CPUs for the module (starting it takes 10-20 s on 2 loaded cores, hence `-m slow`): a fleet computes the local
host loop's numbers bit for bit, a killed worker is survived with every step of the trajectory filled once,
and a run resumes on a fleet.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys
import warnings

import chex
import jax
import numpy as np
import pytest

import fragc
from fragc.algos import ppo, ray_envs
from fragc.cli import main
from fragc.compiler import run_passes
from fragc.ir import parse, verify
from fragc.ir.errors import FragcError, VerifyError
from fragc.ir.host import EnvFleet
from fragc.ir.printer import format_module
from fragc.options import CompileOptions

CARTPOLE = "gymnasium:CartPole-v1"


def tiny_ppo(num_envs=8, num_steps=8):
    return ppo.PPO(ppo.Config(env=CARTPOLE, num_envs=num_envs, num_steps=num_steps, num_minibatches=2,
                              update_epochs=1))


def key_data(tree):
    return jax.tree.map(lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                        else x, tree)


# ---------------------------------------------------------------- without Ray


@pytest.mark.parametrize("text,fleet", [
    ("ray:2", EnvFleet(2)), ("ray:2x4", EnvFleet(2, 4)), ("ray:4x2,cpus=0.5", EnvFleet(4, 2, 0.5)),
    ("ray:3x1,resource=envnode,resource=big", EnvFleet(3, 1, 1.0, ("envnode", "big"))),
])
def test_a_fleet_prints_as_it_parses(text, fleet):
    assert EnvFleet.parse(text) == fleet
    assert str(fleet) == text


@pytest.mark.parametrize("text,message", [
    ("ray:0", "expected ray:N"), ("ray:2x", "expected ray:N"), ("dask:2", "expected ray:N"),
    ("ray:2,cpus=0", "cpus must be a positive number"), ("ray:2,gpus=1", "unknown option 'gpus=1'"),
])
def test_a_malformed_fleet_is_one_line(text, message):
    with pytest.raises(FragcError, match=message):
        EnvFleet.parse(text)


@pytest.mark.parametrize("fleet,envs,pools,message", [
    ("ray:2x4", 6, 1, "2 workers x 4 environments is 8 environments, but the rollout steps 6"),
    ("ray:4", 6, 1, "6 environments do not split into 4 equal workers"),
    ("ray:3", 6, 2, "3 workers do not split into the 2 environment pools"),
])
def test_a_fleet_that_does_not_fit_the_batch_is_refused(fleet, envs, pools, message):
    with pytest.raises(FragcError, match=message):
        EnvFleet.parse(fleet).resolved(envs, pools)
    assert EnvFleet.parse("ray:4").resolved(8, 2) == EnvFleet(4, 2)


@pytest.fixture(scope="module")
def fleet_pipeline():
    """The passes of PPO (8 environments, 2 groups) on the fleet ray:4 (nothing compiled, Ray not started)."""
    return run_passes(tiny_ppo(), CompileOptions("single", env_groups=2, env_fleet="ray:4"))[0]


def test_the_ir_places_the_remote_groups_and_parses_back(fleet_pipeline):
    """`fragc ir --env-fleet`: the placement holds the fleet (environments per worker resolved), a line says which
    workers each remote group is and what crosses to each per step; the text parses back and verifies. Nothing
    starts Ray."""
    pipeline = fleet_pipeline
    text = format_module(pipeline.final)
    assert "host_loop(groups=2) env_fleet=ray:4x2 eqns=" in text
    line = next(line for line in text.splitlines() if line.strip().startswith("env fleet"))
    # per environment and step: action (int32) + key (2 x uint32) + index + pool step = 20 B in; obs (4 x f32)
    # + reward + 2 flags + final obs + pool step = 42 B out; a worker holds 2 environments
    assert line.strip() == ("env fleet ray:4x2 remote_groups=2   // group 0: workers 0..1, group 1: workers 2..3 "
                            "(ray actors of 2 environments); per step each worker's share of the host step: 40 B in "
                            "(actions, keys), 84 B out (observations, rewards, flags)")
    module = parse(text, bodies=pipeline.final)
    verify(module)
    assert format_module(module) == text
    assert module.fragments["rollout"].placement.env_fleet == "ray:4x2"
    assert module.fragments["rollout.env_step"].placement.env_fleet == "ray:4x2"
    assert not ray_envs.import_ray().is_initialized()


def test_the_verifier_refuses_a_fleet_on_a_fragment_that_steps_no_host_environments(fleet_pipeline):
    module = fleet_pipeline.final
    learn = module.fragments["learn"]
    broken = module.replace(fragments={**module.fragments, "learn": learn.replace(
        placement=dataclasses.replace(learn.placement, env_fleet="ray:2x4"))})
    verify(module)
    with pytest.raises(VerifyError, match="@learn has env_fleet=ray:2x4 but steps no host environments"):
        verify(broken)


def test_a_fleet_that_does_not_split_into_the_groups_is_refused_before_compiling():
    with pytest.raises(FragcError, match="3 workers do not split into the 2 environment pools"):
        run_passes(tiny_ppo(num_envs=6), CompileOptions("single", env_groups=2, env_fleet="ray:3"))
    with pytest.raises(FragcError, match="gymnasium_async starts a process per environment"):
        run_passes(ppo.PPO(dataclasses.replace(tiny_ppo().config, env="gymnasium_async:CartPole-v1")),
                   CompileOptions("single", env_fleet="ray:2"))


def run_cli(argv):
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize("argv,setup,message", [
    (["--env-fleet", "ray:2x4", "--ray-address", "127.0.0.1:1"], None,
     "fragc: error: no Ray cluster answers at '127.0.0.1:1'"),
    (["--env-fleet", "ray:2x4"], "no ray", "fragc: error: env fleet ray:...: remote environment workers need Ray: "
     "pip install 'fragc[ray]'"),
    (["--ray-address", "127.0.0.1:1"], None, "fragc: error: --ray-address names the Ray cluster of --env-fleet's"),
    (["--env-fleet", "ray:2x4", "--num-envs", "6"], None, "fragc: error: env fleet ray:2x4: 2 workers x 4 "
     "environments is 8 environments, but the rollout steps 6"),
])
def test_bad_fleet_input_is_one_line_writing_nothing(capsys, monkeypatch, tmp_path, argv, setup, message):
    if ray_envs.import_ray().is_initialized():
        pytest.skip("this process has joined a Ray cluster already (the slow tests')")
    if setup == "no ray":
        monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    monkeypatch.chdir(tmp_path)
    argv = ["run", "ppo", "--env", CARTPOLE, "--iterations", "1", "--num-steps", "8", "--checkpoint-dir", "ck",
            "--quiet", *argv]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("fragc: num_envs ="))
    assert err.startswith(message) and err.count("\n") == 1, err
    assert os.listdir(tmp_path) == []


def test_rays_own_startup_failure_is_one_line(monkeypatch):
    """Ray raises a bare Exception when its node times out during startup (under load): one line, not Ray's
    traceback."""
    ray = ray_envs.import_ray()
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def timed_out(**_):
        raise Exception("The current node timed out during startup. This could happen because some of the Ray "
                        "processes failed to startup.\n(30 more lines)")

    monkeypatch.setattr(ray, "init", timed_out)
    with pytest.raises(FragcError) as err:
        ray_envs.connect(None)
    assert str(err.value) == ("cannot start or join a local Ray: The current node timed out during startup. This "
                              "could happen because some of the Ray processes failed to startup.")


def test_a_head_that_stops_answering_ends_the_run_in_one_line(monkeypatch):
    """The head watch without a cluster: a socket stands for the head's GCS, answering, then closed; the watch
    says so once it has not answered for `lost_after_s` (its exit recorded here instead of ending the process)."""
    import socket
    import threading
    import time

    said, stopped = [], threading.Event()

    def say_and_exit(line, code=ray_envs.EXIT_HEAD_LOST):
        said.append((line, code, time.monotonic()))
        stopped.set()
        threading.Event().wait()  # the watching thread stops here for good, as os._exit would end the process

    monkeypatch.setattr(ray_envs, "say_and_exit", say_and_exit)
    monkeypatch.setattr(ray_envs, "import_ray", lambda: type("Ray", (), {"is_initialized": staticmethod(lambda: True)}))
    monkeypatch.setattr(ray_envs, "_head_watch", None)
    monkeypatch.setattr(ray_envs, "_fleets_running", 0)
    head = socket.socket()
    head.bind(("127.0.0.1", 0))
    head.listen()
    port = head.getsockname()[1]
    ray_envs.watch_head(f"127.0.0.1:{port}", "ray:2x4", lost_after_s=0.6, interval_s=0.1)
    time.sleep(0.5)
    assert not said  # answering
    closed = time.monotonic()
    head.close()
    assert stopped.wait(10)
    (line, code, when), = said
    assert code == ray_envs.EXIT_HEAD_LOST and 0.6 <= when - closed < 5
    assert line == (f"fragc: error: env fleet ray:2x4: lost the Ray cluster's head (its GCS at 127.0.0.1:{port} has "
                    "not answered for 0.6 s); the run stops here, its last checkpoint kept (continue with --resume "
                    "once the cluster is back)")


# ---------------------------------------------------------------- on a local Ray


@pytest.fixture(scope="module")
def ray_cluster():
    ray = ray_envs.import_ray()
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def fleet_program(fleet, groups=2, **config):
    prog = fragc.compile(tiny_ppo(**config), "single", env_groups=groups, env_fleet=fleet)
    return prog, prog.algo.env.fleet


@pytest.mark.slow
def test_a_fleet_computes_the_local_host_loops_numbers_bit_for_bit(ray_cluster):
    """The same seeds and partition (2 groups of 4 environments), stepped by this process's pools and by 4 Ray
    workers of 2 (each group 2 workers, pipelined): every leaf of the state and every metric the same bits."""
    local = fragc.compile(tiny_ppo(), "single", env_groups=2)
    state, metrics = local.run(local.init(0), 2)
    prog, fleet = fleet_program("ray:4x2,cpus=0.5")
    try:
        remote_state, remote_metrics = prog.run(prog.init(0), 2)
        assert sorted(prog.algo.env.pools) == [(0, 1, 2, 3), (4, 5, 6, 7)]
        assert len({ray_cluster.get(a.where.remote())[0] for a in fleet.actors}) == 4  # 4 worker processes
    finally:
        fleet.stop()
    chex.assert_trees_all_equal(key_data(state), key_data(remote_state))
    np.testing.assert_array_equal(remote_metrics.pop("episodes_cut"), [0, 0])
    chex.assert_trees_all_equal(metrics, remote_metrics)


@pytest.mark.slow
def test_killed_workers_are_restarted_and_their_episodes_cut_short_nothing_lost(ray_cluster, monkeypatch):
    """In a 16-step rollout on 4 workers of 2 environments, worker 1 is killed through Ray before step 6 and
    worker 2's process is killed (SIGKILL) before step 10: Ray restarts each, their environments restart from
    derived seeds, that step is their episodes' cut (truncated, reward 0, the new episode's observation), and
    every step of every environment is in the trajectory once. Every other environment, and these before their
    kill, step as in a run without kills (one rollout with the same parameters), bit for bit."""
    steps, kills = 16, {1: 5, 2: 9}  # worker -> the pool step after which it is killed

    def rollout(kill):
        prog, fleet = fleet_program("ray:4x2,cpus=0.5", num_steps=steps)
        pid = ray_cluster.get(fleet.actors[2].where.remote())[0]
        seen = []  # (pool step, workers, the step's results) as the host loop receives them
        send, recv = ray_envs.RayPool.send, ray_envs.RayPool.recv

        def killing_send(pool, actions, keys):
            if kill and pool.steps == kills[1] and 1 in pool.workers:
                ray_cluster.kill(fleet.actors[1], no_restart=False)
            if kill and pool.steps == kills[2] and 2 in pool.workers:
                os.kill(pid, signal.SIGKILL)
            send(pool, actions, keys)

        def recording_recv(pool):
            out = recv(pool)
            seen.append((pool.steps, tuple(pool.workers), out))
            return out

        monkeypatch.setattr(ray_envs.RayPool, "send", killing_send)
        monkeypatch.setattr(ray_envs.RayPool, "recv", recording_recv)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                state, metrics = prog.run(prog.init(0), 1)
        finally:
            fleet.stop()
        monkeypatch.undo()
        return state, metrics, sorted(seen, key=lambda x: x[:2]), fleet, [str(w.message) for w in caught]

    state, metrics, seen, _, _ = rollout(kill=False)
    k_state, k_metrics, k_seen, k_fleet, said = rollout(kill=True)
    assert k_fleet.restarts == [0, 1, 1, 0] and k_fleet.episodes_cut == 4
    # ray.kill reaches the worker asynchronously: a call sent just after it may still be answered, so the step
    # that finds the worker lost (and cuts its episodes) is the next or a later one; SIGKILL is at once
    lost = {int(w): int(t) for text in said for w, t in re.findall(r"worker (\d) was lost at step (\d+) and", text)}
    assert sorted(lost) == [1, 2] and kills[1] < lost[1] <= kills[1] + 3 and lost[2] == kills[2] + 1, said
    assert int(k_metrics["episodes_cut"][0]) == 4 and int(metrics["episodes_cut"][0]) == 0
    # every pool stepped each step once: nothing duplicated, nothing dropped
    assert [(s, w) for s, w, _ in k_seen] == [(s, w) for s, w, _ in seen]
    assert [(s, w) for s, w, _ in seen] == [(s, w) for s in range(1, steps + 1) for w in ((0, 1), (2, 3))]
    for (s, workers, out), (_, _, k_out) in zip(seen, k_seen):
        for k, w in enumerate(workers):
            rows = slice(2 * k, 2 * k + 2)
            if s < lost.get(w, steps + 1):  # not (yet) lost: the same bits
                for a, b in zip(out, k_out):
                    np.testing.assert_array_equal(a[rows], b[rows])
            elif s == lost[w]:  # the cut
                obs, k_obs, (_, k_reward, k_terminated, k_truncated, k_final_obs) = out[0], k_out[0], k_out[:5]
                np.testing.assert_array_equal(k_reward[rows], 0.0)
                np.testing.assert_array_equal(k_truncated[rows], True)
                np.testing.assert_array_equal(k_terminated[rows], False)
                np.testing.assert_array_equal(k_obs[rows], k_final_obs[rows])
                assert not np.array_equal(k_obs[rows], obs[rows])
    untouched = [0, 1, 6, 7]
    np.testing.assert_array_equal(np.asarray(k_state.runner.obs)[untouched], np.asarray(state.runner.obs)[untouched])
    np.testing.assert_array_equal(k_state.runner.env_state.pool_step, steps)


@pytest.mark.slow
def test_a_run_resumes_on_a_fleet(ray_cluster, tmp_path):
    """Checkpointed after 2 of 4 iterations, resumed by a new program (a new fleet: the environments' state is not
    in the checkpoint), which resets them with a warning and trains on."""
    prog, fleet = fleet_program("ray:2x4")
    try:
        fragc.train(prog, prog.init(0), 4, checkpoint_dir=str(tmp_path), checkpoint_every=2, stop_after=2)
    except Exception as stop:  # noqa: BLE001 - train stops with `Stopped` after stop_after
        assert "Stopped" in type(stop).__name__, stop
    finally:
        fleet.stop()
    prog, fleet = fleet_program("ray:2x4")
    try:
        with pytest.warns(UserWarning, match="resetting them"):
            result = fragc.train(prog, prog.init(0), 4, checkpoint_dir=str(tmp_path), checkpoint_every=2,
                                 resume=True)
    finally:
        fleet.stop()
    assert len(result.history["loss"]) == 2  # iterations 3 and 4


@pytest.mark.slow
def test_a_fleet_the_cluster_cannot_hold_or_whose_workers_cannot_make_the_env_is_one_line(ray_cluster):
    with pytest.raises(FragcError, match=r"3 workers ask Ray for 3 CPU in all but the cluster has 2"):
        fleet_program("ray:3", groups=1, num_envs=6)
    with pytest.raises(FragcError, match=r"ask Ray for 2 gpu_box in all but the cluster has 0"):
        fleet_program("ray:2,resource=gpu_box")
    # an id registered in this process only: the workers, other processes, cannot make it
    import gymnasium
    gymnasium.register("LocalOnlyCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    algo = ppo.PPO(dataclasses.replace(tiny_ppo().config, env="gymnasium:LocalOnlyCartPole-v0"))
    with pytest.raises(FragcError, match=r"worker \d cannot make 'gymnasium:LocalOnlyCartPole-v0'"):
        fragc.compile(algo, "single", env_fleet="ray:2x4")


HEAD_LOSS_RUN = ["run", "ppo", "--env", CARTPOLE, "--env-fleet", "ray:2x4", "--num-envs", "8", "--num-steps", "8",
                 "--num-minibatches", "2", "--update-epochs", "1", "--iterations-per-dispatch", "1",
                 "--total-steps", "64000000", "--checkpoint-every", "2", "--quiet"]


@pytest.mark.slow
def test_losing_the_ray_head_is_one_line_and_the_last_checkpoint_is_kept(tmp_path):
    """A cluster of its own (a head with no CPUs, a node with 2, as `ray start` would make them): once the run has
    checkpointed, the head's GCS is killed. The workers on the node go on stepping, so nothing fails in the run;
    the head watch says so in one line within `HEAD_LOST_AFTER_S` and the process exits with 3 (Ray's own core
    worker would end it after 60 s, in C++), and the checkpoints written are whole: `--resume` reads them."""
    import subprocess
    import time

    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 0})
    try:
        cluster.add_node(num_cpus=2)
        ckpt = tmp_path / "ckpt"
        proc = subprocess.Popen([sys.executable, "-m", "fragc.cli", *HEAD_LOSS_RUN, "--ray-address", cluster.address,
                                 "--checkpoint-dir", str(ckpt)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 300
        while not (ckpt.is_dir() and [d for d in os.listdir(ckpt) if d.isdigit()]) and proc.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        killed = time.monotonic()
        cluster.head_node.kill_gcs_server()
        out, err = proc.communicate(timeout=ray_envs.HEAD_LOST_AFTER_S + 60)
        took = time.monotonic() - killed
    finally:
        if "proc" in locals() and proc.poll() is None:
            proc.kill()
        cluster.shutdown()
    assert proc.returncode == ray_envs.EXIT_HEAD_LOST, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(
        "fragc: error: env fleet ray:2x4: lost the Ray cluster's head (its GCS at "), err[-3000:]
    assert "last checkpoint kept (continue with --resume once the cluster is back)" in err
    assert ray_envs.HEAD_LOST_AFTER_S <= took < ray_envs.HEAD_LOST_AFTER_S + 30  # before Ray's own 60 s
    saved = sorted(int(d) for d in os.listdir(ckpt) if d.isdigit())
    assert saved and saved[-1] % 2 == 0
    # the latest reads back whole: the run resumes from it (on this machine's own pools: the cluster is gone)
    local = [a for a in HEAD_LOSS_RUN if a not in ("--env-fleet", "ray:2x4")]
    resumed = subprocess.run([sys.executable, "-m", "fragc.cli", *local, "--checkpoint-dir", str(ckpt), "--resume",
                              "--stop-after", "2", "--json"], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["resumed_from"] == saved[-1]


@pytest.mark.slow  # starts a Ray of its own (10-20 s here), in a process of its own: this module's Ray may be up
def test_the_compiled_graph_bench_times_both_calls():
    """bench/ray_compiled_graph.py (docs/distributed.md): each call's milliseconds, plain and compiled, are numbers."""
    import subprocess

    script = os.path.join(os.path.dirname(__file__), os.pardir, "bench", "ray_compiled_graph.py")
    done = subprocess.run([sys.executable, script, "--envs", "2", "--calls", "5", "--rounds", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^round 0 (noop|step): plain ([0-9.]+) ms, compiled ([0-9.]+) ms$", done.stdout, re.M)
    assert [r[0] for r in rows] == ["noop", "step"] and all(float(p) > 0 and float(c) > 0 for _, p, c in rows)
