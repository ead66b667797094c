"""Checkpoints: a run killed at any moment resumes to the same parameters; damage is detected."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from fragc.cli import main

RUN = ["run", "ppo", "--total-steps", "262144", "--iterations-per-dispatch", "4", "--json", "--quiet"]


def fragc_subprocess(*argv):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "fragc.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def fingerprint(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_sigkill_mid_run_then_resume_reaches_the_uninterrupted_fingerprint(tmp_path):
    uninterrupted = fragc_subprocess(*RUN)
    ckpt = tmp_path / "ckpt"
    victim = fragc_subprocess(*RUN, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "8")
    deadline = time.time() + 240
    while time.time() < deadline and victim.poll() is None:  # wait for two finished checkpoints
        if len([p for p in ckpt.glob("*") if p.name.isdigit()]) >= 2:
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the run ended before it could be killed; make it longer"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    resumed = fragc_subprocess(*RUN, "--checkpoint-dir", str(ckpt), "--resume")
    got, expected = fingerprint(resumed), fingerprint(uninterrupted)
    assert 0 < got["resumed_from"] < expected["iterations"]
    assert got["params_fingerprint"] == expected["params_fingerprint"]


def _flip_a_byte_of_the_largest_array_file(step_dir: pathlib.Path) -> None:
    largest = max((f for f in (step_dir / "arrays").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    largest.write_bytes(bytes(data))


def test_a_damaged_latest_checkpoint_is_moved_aside_and_the_run_falls_back(tmp_path, capsys):
    """Issue 15.1, its exact commands: the resumed run writes iteration 96 again, where the damaged one was."""
    ckpt = str(tmp_path / "ckpt")
    base = ["run", "ppo", "--total-steps", "100000", "--checkpoint-every", "16", "--json", "--quiet"]
    assert main(base) == 0
    expected = json.loads(capsys.readouterr().out)
    assert main(base + ["--checkpoint-dir", ckpt, "--stop-after", "96"]) == 0
    capsys.readouterr()
    _flip_a_byte_of_the_largest_array_file(pathlib.Path(ckpt) / "96")
    with pytest.warns(UserWarning, match=r"checkpoint 96 in .* is damaged .*moved to '96.damaged'; falling back"):
        assert main(base + ["--checkpoint-dir", ckpt, "--resume"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["resumed_from"] == 80 and got["iterations"] == expected["iterations"]
    assert got["params_fingerprint"] == expected["params_fingerprint"]
    assert (pathlib.Path(ckpt) / "96.damaged").is_dir()


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
    checkpointer = Checkpointer(str(folder))
    for it in (4, 8):
        checkpointer.save(it, {**state, "w": state["w"] + it}, {}, {"algo": "toy", "config": {"lr": 0.1}, "seed": 0})
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
        restored, delays, meta = Checkpointer(str(folder)).restore_latest(state, {})
    assert meta["iteration"] == 4 and delays == {}
    np.testing.assert_array_equal(restored["w"], state["w"] + 4)
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(state["key"]))
    assert sorted(p.name for p in folder.iterdir()) == ["4", "8.damaged"]


def test_pipelined_run_resumes_exactly(tmp_path, capsys):
    """The delay values of actor_learner_async are part of the checkpoint."""
    base = ["run", "impala", "--policy", "actor_learner_async", "--devices", "8", "--total-steps", "8192",
            "--num-envs", "8", "--json", "--quiet"]
    assert main(base) == 0
    expected = json.loads(capsys.readouterr().out)
    ckpt = str(tmp_path / "ckpt")
    assert main(base + ["--checkpoint-dir", ckpt, "--checkpoint-every", "5", "--stop-after", "13"]) == 0
    assert main(base + ["--checkpoint-dir", ckpt, "--resume"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["resumed_from"] == 13 and got["params_fingerprint"] == expected["params_fingerprint"]


@pytest.mark.parametrize("extra,message", [
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--checkpoint-dir", "{tmp}/empty", "--resume"], "--resume: no checkpoint in"),
    (["--checkpoint-dir", "/proc/fragc-cannot-write"], "cannot write checkpoints to '/proc/fragc-cannot-write'"),
])
def test_checkpoint_errors_are_one_line_and_exit_code_2(capsys, tmp_path, extra, message):
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    assert main(["run", "ppo", "--total-steps", "4096", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_resuming_with_another_configuration_is_refused(capsys, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    assert main(["run", "ppo", "--total-steps", "4096", "--checkpoint-dir", ckpt, "--quiet"]) == 0
    assert main(["run", "ppo", "--total-steps", "4096", "--lr", "0.001", "--checkpoint-dir", ckpt, "--resume"]) == 2
    assert "the checkpoint was written with a different config" in capsys.readouterr().err


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
        Checkpointer(str(folder)).restore_latest(state, {}, run=run)
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["4", "8"]
