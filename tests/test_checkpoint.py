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


def _corrupt(step_dir: pathlib.Path) -> None:
    for f in step_dir.rglob("*"):
        if f.is_file() and f.stat().st_size > 64 and "arrays" in f.parts:
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    ckpt = str(tmp_path / "ckpt")
    short = ["run", "ppo", "--total-steps", "8192", "--iterations-per-dispatch", "4", "--json", "--quiet"]
    assert main(short) == 0
    expected = json.loads(capsys.readouterr().out)
    assert main(short + ["--checkpoint-dir", ckpt, "--checkpoint-every", "4", "--stop-after", "12"]) == 0
    capsys.readouterr()
    steps = sorted(int(p.name) for p in pathlib.Path(ckpt).iterdir() if p.name.isdigit())
    assert steps[-2:] == [8, 12]
    _corrupt(pathlib.Path(ckpt) / "12")
    with pytest.warns(UserWarning, match=r"checkpoint 12 in .* is damaged .* falling back to the previous one"):
        assert main(short + ["--checkpoint-dir", ckpt, "--resume"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["resumed_from"] == 8
    assert got["params_fingerprint"] == expected["params_fingerprint"]


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
