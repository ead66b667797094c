"""Checkpoints: a run killed at any moment resumes to the same parameters; damage is detected."""

import contextlib
import io
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from fragc.cli import main

SMALL = ["--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
"""A smaller PPO iteration (4 envs x 32 steps, 2 minibatch updates): these tests check stopping and resuming, not
learning, so they keep their iteration counts (256, 48) at a fraction of the default iteration's work."""
RUN = ["run", "ppo", *SMALL, "--total-steps", "32768", "--iterations-per-dispatch", "4", "--json", "--quiet"]
pytestmark = pytest.mark.usefixtures("commands_compile_each_configuration_once")  # RUN compiled once in this process


def fragc_subprocess(*argv):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "fragc.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


@pytest.fixture(scope="module")
def uninterrupted():
    """The --json summary of RUN without interruption, run once in this process for the tests that kill RUN
    (a subprocess would start Python and JAX once more for the same numbers)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(RUN) == 0
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    return lambda: summary


def started_run(ckpt):
    """RUN with checkpoints every 8 iterations, once it has written two."""
    victim = fragc_subprocess(*RUN, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "8")
    deadline = time.time() + 240
    while time.time() < deadline and victim.poll() is None:
        if len([p for p in ckpt.glob("*") if p.name.isdigit()]) >= 2:
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the run ended before it could be stopped; make it longer"
    return victim


def saved_steps(ckpt):
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())


def resumed(ckpt):
    """The --json summary of RUN resumed from `ckpt` (written by a process that was stopped), run in this
    process, where RUN's program is already compiled."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*RUN, "--checkpoint-dir", str(ckpt), "--resume"]) == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_sigkill_mid_run_then_resume_reaches_the_uninterrupted_fingerprint(tmp_path, uninterrupted):
    ckpt = tmp_path / "ckpt"
    victim = started_run(ckpt)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    got = resumed(ckpt)
    assert 0 < got["resumed_from"] < uninterrupted()["iterations"]
    assert got["params_fingerprint"] == uninterrupted()["params_fingerprint"]


def stopped_in_this_process(ckpt, capsys):
    """RUN with checkpoints every 8 iterations in this process (its program compiled already), sent SIGTERM once
    it has written two -> (`main`'s exit code, stderr). `python -m fragc.cli` exits with `main`'s code."""
    def terminate_once_two_are_written():
        deadline = time.monotonic() + 120
        while len([p for p in ckpt.glob("*") if p.name.isdigit()]) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a signal that came after `main` returned
    sender = threading.Thread(target=terminate_once_two_are_written)
    try:
        sender.start()
        code = main([*RUN, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "8"])
        sender.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code, capsys.readouterr().err


# The default suite stops a run in this process (a subprocess starts Python and JAX and compiles RUN again: 10-20 s
# of the suite's 2 cores); -m slow stops a `fragc run` process, to see its exit status. SIGKILL: the test above.
@pytest.mark.parametrize("in_a_process", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_sigterm_saves_where_the_run_stops_and_resume_reaches_the_uninterrupted_fingerprint(
        tmp_path, capsys, uninterrupted, in_a_process):
    """Issue 15.3: a graceful stop finishes the dispatch, writes a checkpoint there and exits 128 + 15."""
    ckpt = tmp_path / "ckpt"
    if in_a_process:
        victim = started_run(ckpt)
        victim.send_signal(signal.SIGTERM)
        _, err = victim.communicate(timeout=120)
        code = victim.returncode
    else:
        code, err = stopped_in_this_process(ckpt, capsys)
    assert code == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM at iteration " in err, err
    stopped_at = int(err.split("stopped by SIGTERM at iteration ")[1].split(";")[0])
    assert saved_steps(ckpt)[-1] == stopped_at and stopped_at % 4 == 0
    got = resumed(ckpt)
    assert got["resumed_from"] == stopped_at
    assert got["params_fingerprint"] == uninterrupted()["params_fingerprint"]


def test_a_stop_signal_without_a_checkpoint_folder_exits_with_its_conventional_code(tmp_path, capsys):
    """Nothing to save: SIGHUP stops at once, one line, exit code 128 + 1 (not Ctrl-C's 130). Sent to this process
    while `main` trains RUN (a subprocess would start Python and JAX for it; the SIGTERM test above checks a stopped
    process's exit status). A SIGHUP that came after `main` had returned would meet this test's own handler."""
    metrics = tmp_path / "m.jsonl"

    def hang_up_once_training():
        deadline = time.monotonic() + 120
        while not (metrics.exists() and metrics.read_text().count("\n") >= 1) and time.monotonic() < deadline:
            time.sleep(0.005)  # the run trains for about a second (64 dispatches) once its first line is out
        os.kill(os.getpid(), signal.SIGHUP)

    previous = signal.signal(signal.SIGHUP, lambda *_: None)
    sender = threading.Thread(target=hang_up_once_training)
    try:
        sender.start()
        code = main([*RUN, "--metrics", str(metrics)])
        sender.join()
    finally:
        signal.signal(signal.SIGHUP, previous)
    err = capsys.readouterr().err
    assert code == 128 + signal.SIGHUP, err
    assert err.strip().splitlines() == ["fragc: interrupted"], err


def _flip_a_byte_of_the_largest_array_file(step_dir: pathlib.Path) -> None:
    largest = max((f for f in (step_dir / "arrays").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    largest.write_bytes(bytes(data))


def test_a_damaged_latest_checkpoint_is_moved_aside_and_the_run_falls_back(tmp_path, capsys):
    """Issue 15.1's commands on RUN's program (compiled by now), shortened (48 iterations, where the issue's ran 195
    and damaged iteration 96): a run stopped at 48 writes checkpoints 16, 32 and 48; with 48 removed (as if the run
    had died after writing 32) and 32 damaged, the resumed run falls back to 16, writes 32 again, and stops at 48
    where the first run did."""
    ckpt = tmp_path / "ckpt"
    base = [*RUN, "--checkpoint-every", "16", "--checkpoint-dir", str(ckpt)]
    assert main([*base, "--stop-after", "48"]) == 0
    expected = json.loads(capsys.readouterr().out)
    assert saved_steps(ckpt) == [16, 32, 48]
    shutil.rmtree(ckpt / "48")
    _flip_a_byte_of_the_largest_array_file(ckpt / "32")
    with pytest.warns(UserWarning, match=r"checkpoint 32 in .* is damaged .*moved to '32.damaged'; falling back"):
        assert main([*base, "--resume", "--stop-after", "32"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["resumed_from"] == 16 and got["iterations"] == expected["iterations"] == 48
    assert got["params_fingerprint"] == expected["params_fingerprint"]
    assert (ckpt / "32.damaged").is_dir()


def _metadata_edits():
    def edit(**fields):
        return lambda meta: {**meta, **fields}

    return {
        "iteration edited": edit(iteration=10),
        "iteration missing": lambda meta: {k: v for k, v in meta.items() if k != "iteration"},
        "iteration of the wrong type": edit(iteration="12"),
        "config edited": lambda meta: {**meta, "config": {**meta["config"], "lr": 1.0}},
        "array digest edited": edit(arrays_digest="0" * 64),
        "a list, not an object": lambda meta: [meta],
    }


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """A folder with checkpoints 4 and 8 of a small state (a PRNG key included), written once."""
    import jax
    import numpy as np

    from fragc.runtime.checkpoint import Checkpointer

    folder = tmp_path_factory.mktemp("two")
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "key": jax.random.key(1)}
    with Checkpointer(str(folder)) as checkpointer:
        for it in (4, 8):
            checkpointer.save(it, {**state, "w": state["w"] + it}, {}, {"algo": "toy", "config": {"lr": 0.1},
                                                                      "seed": 0})
    return folder, state


@pytest.mark.parametrize("damage", list(_metadata_edits()) + ["not JSON"])
def test_damaged_metadata_means_a_damaged_checkpoint(two_checkpoints, tmp_path, damage):
    """Issue 15.4: every metadata field is covered by the digest; a damaged one is a damaged checkpoint."""
    import shutil

    import jax
    import numpy as np

    from fragc.runtime.checkpoint import Checkpointer

    source, state = two_checkpoints
    folder = tmp_path / "ckpt"
    shutil.copytree(source, folder)
    meta_file = folder / "8" / "meta" / "metadata"
    if damage == "not JSON":
        meta_file.write_text(meta_file.read_text()[:-5])
    else:
        meta_file.write_text(json.dumps(_metadata_edits()[damage](json.loads(meta_file.read_text()))))
    with pytest.warns(UserWarning, match=r"checkpoint 8 in .* is damaged \(its metadata .*moved to '8.damaged'"):
        with Checkpointer(str(folder)) as checkpointer:
            restored, delays, meta = checkpointer.restore_latest(state, {})
    assert meta["iteration"] == 4 and delays == {}
    np.testing.assert_array_equal(restored["w"], state["w"] + 4)
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(state["key"]))
    assert sorted(p.name for p in folder.iterdir()) == ["4", "8.damaged"]


@pytest.mark.parametrize("extra,message", [
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--checkpoint-dir", "/proc/fragc-cannot-write"], "cannot write checkpoints to '/proc/fragc-cannot-write'"),
])
def test_checkpoint_errors_are_one_line_and_exit_code_2(capsys, tmp_path, extra, message):
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    assert main(["run", "ppo", "--total-steps", "4096", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_resuming_with_another_configuration_is_refused_naming_what_differs(capsys, tmp_path, monkeypatch):
    """Issue 15.5: another environment is not 'damage', and another seed is not accepted; refused before
    anything is compiled."""
    import fragc

    ckpt = str(tmp_path / "ckpt")
    assert main([*RUN, "--checkpoint-dir", ckpt, "--stop-after", "8"]) == 0  # RUN's program, compiled already
    capsys.readouterr()
    from fragc.cli import algorithm  # what the command line compiles with

    monkeypatch.setattr(algorithm, "compile_with", lambda *a, **k: pytest.fail("compiled before refusing"))
    for option, named in ((["--env", "Acrobot-v1"], "--env is 'CartPole-v1' in the checkpoint and 'Acrobot-v1' here"),
                          (["--seed", "7"], "--seed is 0 in the checkpoint and 7 here.")):
        assert main([*RUN, *option, "--checkpoint-dir", ckpt, "--resume"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "fragc: error: --resume: the checkpoint at iteration 8" in err, err
        assert named in err and "damaged" not in err, err


@pytest.mark.parametrize("run,named", [
    ({"algo": "toy", "config": {"lr": 0.2}, "seed": 0}, "--lr is 0.1 in the checkpoint and 0.2 here"),
    ({"algo": "toy", "config": {"lr": 0.1}, "seed": 7}, "--seed is 0 in the checkpoint and 7 here"),
    ({"algo": "toy", "config": {"lr": 0.1, "env": "Acrobot-v1"}, "seed": 0},
     "--env is not set in the checkpoint and 'Acrobot-v1' here"),
    ({"algo": "dqn", "config": {"epsilon": 0.1}, "seed": 0}, "algo is 'toy' in the checkpoint and 'dqn' here$"),
])
def test_resuming_another_configuration_names_what_differs(two_checkpoints, run, named):
    """Issue 15.5: not 'damaged', and not both whole configurations: the fields that differ, and nothing moves."""
    from fragc import FragcError
    from fragc.runtime.checkpoint import Checkpointer

    folder, state = two_checkpoints
    with pytest.raises(FragcError, match=r"^--resume: the checkpoint at iteration 8 in .* was written by another "
                                         r"configuration: " + named.replace("$", r"\. Resume with the same options")):
        with Checkpointer(str(folder)) as checkpointer:
            checkpointer.restore_latest(state, {}, run=run)
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["4", "8"]


TRUNCATED_FALLBACK = """
import pathlib, sys, time
import numpy as np
from fragc.runtime.checkpoint import Checkpointer

folder = pathlib.Path(sys.argv[1])
rng = np.random.default_rng(0)
state = {f"w{i}": rng.standard_normal((16, 64)).astype(np.float32) for i in range(48)}
with Checkpointer(str(folder), keep=6) as checkpointer:
    for it in range(1, 7):
        checkpointer.save(it, state, {}, {"algo": "toy"})
for it in range(2, 7):  # five damaged checkpoints: five failed reads, each with dozens of reads in flight
    largest = max((f for f in (folder / str(it) / "arrays").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])
with Checkpointer(str(folder)) as checkpointer:
    restored, _, meta = checkpointer.restore_latest(state, {})
    time.sleep(0.2)  # the reads left in flight finish
assert all((restored[k] == v).all() for k, v in state.items())
print(meta["iteration"])
"""


def test_a_truncated_checkpoint_falls_back_with_the_warning_only(tmp_path):
    """Issue 26.5: a checkpoint whose array file was cut short fails in orbax's asynchronous reader, whose reads
    still in flight then reported `RuntimeError: Event loop is closed` as dozens of tracebacks on stderr (and
    asyncio logged the tasks nobody awaited). Now: the warning for each damaged checkpoint, nothing else. A
    subprocess, for the real stderr; a state of 48 random arrays leaves enough reads in flight."""
    done = subprocess.run([sys.executable, "-c", TRUNCATED_FALLBACK, str(tmp_path / "ckpt")], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr[-3000:]
    assert done.stderr.count("is damaged (its arrays do not read back") == 5, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Event loop is closed" not in done.stderr, done.stderr[-3000:]
    assert "never retrieved" not in done.stderr, done.stderr[-3000:]


def test_a_checkpoint_of_another_state_layout_is_refused_and_kept(tmp_path):
    """A state that gained a field (an algorithm's new metric counters did) reads back as damaged to orbax;
    it is whole, so it is refused in one line naming the difference, and left where it is."""
    import numpy as np

    import fragc
    from fragc.runtime.checkpoint import Checkpointer

    old = {"params": np.zeros((2, 3), np.float32), "runner": {"obs": np.ones(4, np.float32)}}
    new = {"params": np.zeros((2, 3), np.float32), "runner": {"obs": np.ones(4, np.float32),
                                                              "episode_length": np.zeros(4, np.int32)}}
    with Checkpointer(str(tmp_path)) as checkpoints:
        checkpoints.save(8, old, {}, {})
        with pytest.raises(fragc.FragcError, match=r"^--resume: the checkpoint at iteration 8 in '.*' holds a state "
                                                   r"laid out otherwise than this run's \(it has no "
                                                   r"state\.runner\.episode_length\)"):
            checkpoints.restore_latest(new, {})
        assert sorted(os.listdir(tmp_path)) == ["8"]  # not moved aside as damaged
        state, _, _ = checkpoints.restore_latest(old, {})  # and the run it belongs to still resumes from it
        np.testing.assert_array_equal(state["runner"]["obs"], old["runner"]["obs"])
