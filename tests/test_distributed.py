"""Multi-process runs: `fragc launch -n 2` with 4 simulated CPU devices per process.

References are single-process runs on the 8 devices of this test process.
"""

import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import fragc
from conftest import assert_trees_close
from fragc.algos import make
from fragc.distributed import ENV_LOST_AFTER_S
from fragc.launch import free_port
from fragc.runtime.reporting import params_fingerprint

# A small PPO: 8 environments x 16 steps, 128 env steps an iteration; 200 iterations in all.
CONFIG = {"num_envs": 8, "num_steps": 16, "update_epochs": 1, "num_minibatches": 2, "total_steps": 200 * 128}
RUN = ["run", "ppo", "--devices", "4", "--no-cache", "--iterations-per-dispatch", "2",
       *[f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]]
RESUMED_IN_ONE_LAUNCH = ("anakin", "actor_learner_async")
"""One policy per way a program spans processes: one fused program (as `gspmd`), and the SPMD
program of a staged policy with its delay values (as `actor_learner`, which the kill test resumes)."""

_LAUNCHED = []


def launch(*argv, n=2, env=None):
    """`fragc launch -n N -- fragc run ...` (or another command) as a child process, with text pipes."""
    env = {**{k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}, **(env or {})}
    command = [sys.executable, "-m", "fragc.cli", "launch", "-n", str(n), "--"]
    if argv[0] == "run":
        command += [sys.executable, "-m", "fragc.cli"]
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


def json_lines(stdout):
    """Every line on stdout as JSON: nothing else may be there."""
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


@functools.lru_cache(maxsize=None)
def one_process_program(policy, transfers):
    """The small PPO under `policy` on the 8 devices of this test process, compiled once."""
    algo = make("ppo", **CONFIG)
    return fragc.compile(algo, policy, devices=8, transfers=transfers, iterations_per_dispatch=2)


def reference_fingerprint(policy, iterations):
    """The launched processes' program (collective transfers) in this one process: the same program, so the same
    bits under the suite's XLA flags too. Collective against device_put transfers: the next test."""
    prog = one_process_program(policy, "collective")
    state, _ = prog.run(prog.init(0), iterations)
    return params_fingerprint(state)


def training_run(policy, env=None, *extra):
    """A long launched run, once process 0 trains -> (launcher, [pid of process 0, pid of process 1])."""
    proc = launch(*RUN, "--policy", policy, "--total-steps", str(100_000 * 128), *extra, env=env)
    pids = child_pids(proc)
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if line.startswith("fragc run ppo"):
            return proc, pids
        assert time.monotonic() < deadline, "process 0 did not start training"
    raise AssertionError(f"the run ended before training: {proc.stderr.read()[-3000:]}")


def child_pids(proc):
    """The launched processes' pids, from the launcher's first stderr line."""
    line = proc.stderr.readline()
    assert "pids" in line, line
    return [int(p) for p in line.split("pids")[1].split()]


def test_runs_across_processes_match_one_process_and_resume(tmp_path):
    """One launch: per policy, 4 iterations straight, 2 a dispatch (`prog.k` as asked, also for the
    SPMD program of a staged policy), and 2 + 2 through a checkpoint, in two processes."""
    script = os.path.join(os.path.dirname(__file__), "two_process_resume.py")
    proc = launch(sys.executable, script, str(tmp_path), json.dumps(CONFIG), *RESUMED_IN_ONE_LAUNCH)
    references = {policy: reference_fingerprint(policy, 4) for policy in RESUMED_IN_ONE_LAUNCH}  # while they run
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    results = {r["policy"]: r for r in json_lines(out)}
    assert sorted(results) == sorted(RESUMED_IN_ONE_LAUNCH), out[-3000:]
    for policy, result in results.items():
        assert result["processes"] == 2 and result["devices"] == 8 and result["resumed_from"] == 2
        assert result["k"] == 2 and result["dispatch_ends"] == [2, 4], policy
        assert result["resumed"] == result["straight"], policy
        assert result["straight"] == references[policy], policy


# The same bits need XLA's defaults (a process of their own, tests/conftest.py): -m slow. The default suite runs
# both in this process, where the suite's XLA flags fuse the two programs differently (last bits), and reuses the
# collective program the test above compiled.
@pytest.mark.parametrize("bits", [pytest.param(False, id="to_rounding"),
                                  pytest.param(True, marks=[pytest.mark.slow, pytest.mark.xla_defaults], id="bits")])
def test_collective_transfers_give_the_same_bits_in_one_process(bits):
    """The SPMD program that carries a staged policy across processes (with its delay values),
    checked where both lowerings run."""
    states = []
    for transfers in ("device_put", "collective"):
        prog = one_process_program("actor_learner_async", transfers)
        state, history = prog.run(prog.init(0), 3)  # two dispatches, the second partial
        assert history["loss"].shape == (3,)
        states.append(state)
    if bits:
        assert params_fingerprint(states[0]) == params_fingerprint(states[1])
    else:
        assert_trees_close(states[0], states[1], rtol=1e-5, atol=1e-6)


def test_collective_transfers_need_equal_groups():
    algo = make("ppo", num_envs=12, num_steps=16)
    policy = fragc.Policy("six_two", {"actors": tuple(range(6)), "learner": (6, 7)},
                          {"actor": fragc.RolePlacement("actors"), "*": fragc.RolePlacement("learner")})
    with pytest.raises(fragc.FragcError, match=r"cannot run with transfers='collective': its device groups "
                                               r"differ in size \(actors: 6, learner: 2\)"):
        fragc.compile(algo, policy, devices=8, transfers="collective")


@pytest.mark.slow  # 30 s of two launches; the only test of the lost-process watchdog: run it with -m slow
@pytest.mark.xla_defaults
def test_a_lost_process_stops_the_run_which_resumes_to_the_uninterrupted_fingerprint(tmp_path):
    """kill -9 of process 1 mid-run: process 0 names it within the (shortened) lost-process time;
    `--resume` ends where an uninterrupted run does, and its --json stdout is JSON only."""
    args = [*RUN, "--policy", "actor_learner", "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "2"]
    proc = launch(*args, env={ENV_LOST_AFTER_S: "3"})
    pids = child_pids(proc)
    deadline = time.monotonic() + 180
    while not (tmp_path / "4").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint at iteration 4"
        time.sleep(0.05)
    os.kill(pids[1], signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert "[0] fragc: error: lost process 1 of 2" in err, err[-3000:]
    assert time.monotonic() - killed < 20
    saved = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
    assert 4 <= saved[-1] < 190, saved

    resumed = launch(*args, "--resume", "--stop-after", "4", "--json", "--quiet")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    result, = json_lines(out)  # only process 0 reports, and only JSON reaches stdout
    assert result["processes"] == 2 and result["devices"] == 8
    assert result["resumed_from"] == saved[-1] and result["iterations"] == saved[-1] + 4
    assert result["params_fingerprint"] == reference_fingerprint("actor_learner", saved[-1] + 4)


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
    assert sorted(proc.stdout.splitlines()) == ["hello from 0", "hello from 1"]  # stdout as it is
    assert "fragc launch: 2 processes" in proc.stderr
    assert "fragc launch: process 1 exited with code 5" in proc.stderr


def test_launch_without_a_command_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "fragc.cli", "launch", "-n", "2"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("fragc: error: launch: give the command after --")


def test_unreachable_coordinator_is_a_clear_error():
    port = free_port()  # nothing listens there
    with pytest.raises(fragc.FragcError, match=rf"cannot reach the coordinator 127.0.0.1:{port} \(process 0\) "
                                               r"within 1 s"):
        fragc.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=1, timeout_s=1)


def test_a_peer_that_never_joins_is_named_in_one_line_within_the_join_timeout():
    """JAX alone aborts process 0 after its deadline with a C++ `Check failure` stack trace (exit code 134)."""
    port = free_port()
    script = f"from fragc.cli import main; main(['run', 'ppo', '--coordinator', '127.0.0.1:{port}', " \
             "'--num-processes', '2', '--process-id', '0', '--join-timeout', '1', '--total-steps', '4096'])"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == fragc.distributed.EXIT_NOT_JOINED, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"fragc: error: process 0 waited 1 s at 127.0.0.1:{port} and process 1 did not join (start every process "
        "with the same --coordinator and --num-processes 2, or wait longer with --join-timeout S)"]
    assert time.monotonic() - started < 1 + fragc.distributed.JOIN_MARGIN_S  # before JAX's own deadline


def test_an_error_every_process_hits_is_reported_as_itself():
    proc = launch(*RUN, "--policy", "anakinn", "--total-steps", "3072")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    assert "[0] fragc: error: unknown policy 'anakinn' (did you mean 'anakin'?)" in err
    assert "lost process" not in err


def alive(pid):
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_processes_stop_with_their_launcher(sig):
    """SIGTERM is passed on to every process; after SIGKILL, which the launcher cannot pass on, each
    sees the launcher's pipe close. Either way no process is alive 10 s later."""
    joined = ("import os, time; from fragc import distributed; "
              "distributed.initialize(os.environ['FRAGC_COORDINATOR'], 2, int(os.environ['FRAGC_PROCESS_ID'])); "
              "print('joined', flush=True); time.sleep(300)")
    proc = launch(sys.executable, "-c", joined)
    pids = child_pids(proc)
    assert [proc.stdout.readline().strip() for _ in pids] == ["joined", "joined"]
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode == (128 + sig if sig == signal.SIGTERM else -sig)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids), "a process outlived its launcher by 10 s"


@pytest.mark.slow  # two launched processes training (~25 s of CPU); SIGTERM to one process: test_checkpoint.py
def test_sigterm_to_one_process_stops_every_process_with_a_checkpoint(tmp_path):
    """Issue 15.6: JAX's preemption service no longer swallows it; the processes agree on where
    to stop, process 0 saves there, and every process exits with 128 + 15."""
    proc = launch(*RUN, "--policy", "anakin", "--total-steps", str(100_000 * 128), "--checkpoint-dir", str(tmp_path),
                  "--checkpoint-every", "2")
    pids = child_pids(proc)
    deadline = time.monotonic() + 180
    while not (tmp_path / "2").is_dir():  # both processes train
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint at iteration 2"
        time.sleep(0.05)
    os.kill(pids[1], signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    # process 1 got the signal; gloo's native lines may be cut by it ("[1] [Gloo] Rank 1fragc: SIGTERM: ...")
    assert any(line.startswith("[1] ") and "fragc: SIGTERM: stopping after this dispatch with a checkpoint" in line
               for line in err.splitlines()), err[-3000:]
    stopped_at = int(err.split("[0] fragc: stopped by SIGTERM at iteration ")[1].split(";")[0])
    assert max(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == stopped_at
    assert "exited with code 143" in err and "lost process" not in err and "Terminating" not in err, err[-3000:]
