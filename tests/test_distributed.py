"""Multi-process runs: `fragc launch -n 2` with 4 simulated CPU devices per process.

References are single-process runs on the 8 devices of this test process.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import fragc
from fragc.algos import make
from fragc.launch import free_port
from fragc.runtime.reporting import params_fingerprint

# PPO with 8 environments x 128 steps: 1024 env steps an iteration.
STEPS = 1024
RUN = ["run", "ppo", "--num-envs", "8", "--devices", "4", "--no-cache"]


_LAUNCHED = []


def launch(*argv, n=2):
    """`fragc launch -n N -- fragc run ...` as a child process, with text pipes."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    command = [sys.executable, "-m", "fragc.cli", "launch", "-n", str(n), "--", sys.executable, "-m", "fragc.cli"]
    proc = subprocess.Popen(command + list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    _LAUNCHED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _stop_launchers():
    """A failed test leaves no run behind: SIGTERM makes the launcher stop its processes."""
    yield
    while _LAUNCHED:
        proc = _LAUNCHED.pop()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def summary(stdout):
    """Process 0's --json line (the launcher prefixes it with `[0] `)."""
    lines = [line[4:] for line in stdout.splitlines() if line.startswith("[0] {")]
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


def reference_fingerprint(policy, iterations):
    """`fragc run ppo --num-envs 8 --total-steps ITERATIONS*1024 --policy POLICY --devices 8`, in this process."""
    algo = make("ppo", num_envs=8, total_steps=iterations * STEPS)
    prog = fragc.compile(algo, policy, devices=8)
    state, _ = prog.run(prog.init(0), iterations)
    return params_fingerprint(state)


def training_run(policy):
    """A long launched run, once process 0 trains -> (launcher, [pid of process 0, pid of process 1])."""
    proc = launch(*RUN, "--policy", policy, "--total-steps", str(100_000 * STEPS))
    pids = child_pids(proc)
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if line.startswith("[0] fragc run ppo"):
            return proc, pids
        assert time.monotonic() < deadline, "process 0 did not start training"
    raise AssertionError(f"the run ended before training: {proc.stderr.read()[-3000:]}")


def child_pids(proc):
    """The launched processes' pids, from the launcher's first stderr line."""
    line = proc.stderr.readline()
    assert "pids" in line, line
    return [int(p) for p in line.split("pids")[1].split()]


@pytest.mark.parametrize("policy", ["anakin", "actor_learner"])
def test_two_processes_match_one(policy):
    proc = launch(*RUN, "--policy", policy, "--total-steps", str(3 * STEPS), "--json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    result = summary(out)
    assert result["processes"] == 2 and result["devices"] == 8 and result["iterations"] == 3
    assert result["params_fingerprint"] == reference_fingerprint(policy, 3)
    assert not any(line.startswith("[1] {") for line in out.splitlines()), "only process 0 reports"


def test_collective_transfers_give_the_same_bits_in_one_process():
    """The SPMD program that carries actor_learner across processes, checked where both lowerings run."""
    algo = make("ppo", num_envs=8, num_steps=16)
    for policy in ("actor_learner", "actor_learner_async"):
        prints = []
        for transfers in ("device_put", "collective"):
            prog = fragc.compile(algo, policy, devices=8, transfers=transfers, iterations_per_dispatch=4)
            state, history = prog.run(prog.init(0), 6)  # two dispatches, the second partial
            assert history["loss"].shape == (6,)
            prints.append(params_fingerprint(state))
        assert prints[0] == prints[1], policy


def test_collective_transfers_need_equal_groups():
    algo = make("ppo", num_envs=12, num_steps=16)
    policy = fragc.Policy("six_two", {"actors": tuple(range(6)), "learner": (6, 7)},
                          {"actor": fragc.RolePlacement("actors"), "*": fragc.RolePlacement("learner")})
    with pytest.raises(fragc.FragcError, match=r"cannot run with transfers='collective': its device groups "
                                               r"differ in size \(actors: 6, learner: 2\)"):
        fragc.compile(algo, policy, devices=8, transfers="collective")


def test_lost_process_stops_the_other_with_a_clear_error():
    proc, pids = training_run("actor_learner")
    time.sleep(2)
    os.kill(pids[1], signal.SIGKILL)
    killed = time.monotonic()
    out, err = proc.communicate(timeout=120)
    waited = time.monotonic() - killed
    assert proc.returncode != 0
    assert "[0] fragc: error: lost process 1 of 2" in err, err[-3000:]
    assert waited < 60, waited


def test_killed_run_resumes_to_the_uninterrupted_fingerprint(tmp_path):
    iterations = 96
    args = [*RUN, "--policy", "actor_learner", "--total-steps", str(iterations * STEPS),
            "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "16", "--json"]
    proc = launch(*args)
    pids = child_pids(proc)
    deadline = time.monotonic() + 180
    while not (tmp_path / "32").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint at iteration 32"
        time.sleep(0.2)
    for pid in pids:  # the whole run dies at once
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    saved = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
    assert 32 <= saved[-1] < iterations, saved

    resumed = launch(*args, "--resume")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    result = summary(out)
    assert result["resumed_from"] == saved[-1] and result["iterations"] == iterations
    assert result["params_fingerprint"] == reference_fingerprint("actor_learner", iterations)


def test_mismatched_configurations_are_refused():
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    fragc_run = " ".join([sys.executable, "-m", "fragc.cli", *RUN, "--policy", "anakin", "--total-steps", "3072"])
    proc = subprocess.run([sys.executable, "-m", "fragc.cli", "launch", "-n", "2", "--", "sh", "-c",
                           fragc_run + " --seed $FRAGC_PROCESS_ID"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 2
    assert ("[0] fragc: error: process 1 was started with a different configuration: --seed is 0 here and 1 on "
            "process 1") in proc.stderr, proc.stderr[-3000:]


def test_launch_forwards_output_and_the_first_failure():
    script = "import os, sys; print('hello from', os.environ['FRAGC_PROCESS_ID']); sys.exit(int(os.environ['FRAGC_PROCESS_ID']) * 5)"
    proc = subprocess.run([sys.executable, "-m", "fragc.cli", "launch", "-n", "2", "--", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5
    assert "[0] hello from 0" in proc.stdout and "[1] hello from 1" in proc.stdout
    assert "fragc launch: process 1 exited with code 5" in proc.stderr


def test_launch_without_a_command_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "fragc.cli", "launch", "-n", "2"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("fragc: error: launch: give the command after --")


def test_unreachable_coordinator_is_a_clear_error():
    port = free_port()  # nothing listens there
    with pytest.raises(fragc.FragcError, match=rf"cannot reach the coordinator 127.0.0.1:{port} \(process 0\) "
                                               r"within 2 s"):
        fragc.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=1, timeout_s=2)


def test_an_error_every_process_hits_is_reported_as_itself():
    proc = launch(*RUN, "--policy", "anakinn", "--total-steps", "3072")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    assert "[0] fragc: error: unknown policy 'anakinn' (did you mean 'anakin'?)" in err
    assert "lost process" not in err


def test_sigterm_to_the_launcher_stops_every_process():
    proc, pids = training_run("anakin")
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "fragc launch: SIGTERM, stopping the processes" in err
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_ctrl_c_in_one_process_stops_the_others():
    proc, pids = training_run("anakin")
    os.kill(pids[1], signal.SIGINT)
    interrupted = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (3, 130), err[-3000:]  # whichever exit the launcher saw first
    assert "[1] fragc: interrupted" in err
    assert "[0] fragc: error: lost process 1 of 2 (it stopped with: interrupted)" in err, err[-3000:]
    assert time.monotonic() - interrupted < 30
