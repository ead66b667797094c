"""Every bad input is refused with one clear line: `fragc: error: ...` and exit code 2 on the command
line, a `FragcError` in Python; never a traceback, a hang, or a run that silently does the wrong thing.

The tables run in-process (no JAX start-up per case); each case fails in argument parsing or
validation, before anything is compiled. Only the cases that need a fresh process (JAX's device
count is fixed once its backend starts) spawn one.
"""

import io
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import fragc
from fragc.algos import a2c, dqn, impala, ppo, ppo_continuous
from fragc.cli import main
from diverging_algo import Config as DivergingConfig
from diverging_algo import Diverging

# ---------------------------------------------------------------- the Python API


def _policy(groups, roles):
    return lambda algo: fragc.Policy("p", groups, roles)


ALL = {"*": fragc.RolePlacement("a")}
SPLIT = {"actor": fragc.RolePlacement("a"), "*": fragc.RolePlacement("b")}

API_CASES = [
    # (case, call, the error's message)
    ("compile devices='abc'", lambda algo: fragc.compile(algo, devices="abc"),
     "compile: devices must be a positive int or a list of jax devices, got 'abc'"),
    ("compile devices=0", lambda algo: fragc.compile(algo, devices=0), "devices must be a positive int"),
    ("compile devices=True", lambda algo: fragc.compile(algo, devices=True), "devices must be a positive int"),
    ("compile iterations_per_dispatch=0", lambda algo: fragc.compile(algo, iterations_per_dispatch=0),
     "iterations_per_dispatch must be a positive int, got 0"),
    ("compile transfers='bogus' on a one-stage policy", lambda algo: fragc.compile(algo, transfers="bogus"),
     "transfers must be one of auto, device_put, collective, got 'bogus'"),
    ("compile devices=100000", lambda algo: fragc.compile(algo, "anakin", devices=100000),
     "100000 devices were asked for but only 8 exist"),
    ("Config(num_envs='4')", lambda algo: ppo.Config(num_envs="4"), "ppo: num_envs must be an int, got '4'"),
    ("Config(num_envs=4.0)", lambda algo: ppo.Config(num_envs=4.0), "ppo: num_envs must be an int, got 4.0"),
    ("Config(anneal_lr='no')", lambda algo: ppo.Config(anneal_lr="no"), "anneal_lr must be True or False"),
    ("Config(env=3)", lambda algo: ppo.Config(env=3), "ppo: env must be a string, got 3"),
    ("Config(lr=nan)", lambda algo: ppo.Config(lr=float("nan")), "ppo: lr must be finite, got nan"),
    ("Config(lr=0)", lambda algo: ppo.Config(lr=0.0), "ppo: lr must be positive, got 0"),
    ("Config(gamma=1.5)", lambda algo: ppo.Config(gamma=1.5), r"ppo: gamma must be in \[0, 1\], got 1.5"),
    ("Config(gae_lambda=-0.1)", lambda algo: ppo.Config(gae_lambda=-0.1), r"gae_lambda must be in \[0, 1\]"),
    ("Config(max_grad_norm=0)", lambda algo: ppo.Config(max_grad_norm=0.0), "max_grad_norm must be positive"),
    ("Config(ent_coef=-1)", lambda algo: ppo.Config(ent_coef=-1.0), "ent_coef must be at least 0, got -1"),
    ("Config(hidden=0)", lambda algo: ppo.Config(hidden=0), r"ppo: hidden must be in \[1, 46340\], got 0"),
    ("Config(hidden=10**9)", lambda algo: ppo.Config(hidden=10**9), r"hidden must be in \[1, 46340\]"),
    ("Config(update_epochs=2**40)", lambda algo: ppo.Config(update_epochs=2**40),
     "update_epochs must be at most 2147483647"),
    ("ppo_continuous Config(gamma=2)", lambda algo: ppo_continuous.Config(gamma=2.0),
     r"ppo_continuous: gamma must be in \[0, 1\]"),
    ("a2c Config(vf_coef=-1)", lambda algo: a2c.Config(vf_coef=-1.0), "a2c: vf_coef must be at least 0"),
    ("impala Config(rho_bar=0)", lambda algo: impala.Config(rho_bar=0.0), "impala: rho_bar must be positive"),
    ("dqn Config(eps_end=2)", lambda algo: dqn.Config(eps_end=2.0), r"dqn: eps_end must be in \[0, 1\]"),
    ("dqn Config(learning_starts=-1)", lambda algo: dqn.Config(learning_starts=-1),
     "dqn: learning_starts must be at least 0"),
    ("Policy replicas=0", _policy({"a": (0, 1)}, {"*": fragc.RolePlacement("a", 0)}),
     "policy 'p': role '\\*' has replicas=0; replicas are a positive int"),
    ("Policy with a device twice in a group", _policy({"a": (0, 0)}, ALL), "device 0 is twice in group 'a'"),
    ("Policy with overlapping groups", _policy({"a": (0, 1), "b": (1, 2)}, SPLIT),
     "device 1 is in both group 'a' and group 'b'; device groups are disjoint"),
    ("Policy with coinciding groups", _policy({"a": (0, 1), "b": (0, 1)}, SPLIT),
     "device 0 is in both group 'a' and group 'b'"),
    ("Policy with a negative device", _policy({"a": (-1, 0)}, ALL), "device group 'a' holds -1; device indices"),
    ("Policy with an empty group", _policy({"a": ()}, ALL), "device group 'a' must be a non-empty tuple"),
    ("Policy with a negative staleness", lambda algo: fragc.Policy("p", {"a": (0,)}, ALL, staleness=-1),
     "staleness must be an int from 0, got -1"),
    ("fragment with a negative in_axes", lambda algo: fragc.fragment(role="actor", in_axes=(None, -1)),
     "fragment in_axes entries are axis indices from 0 .* got -1"),
    ("fragment with a negative out_axes", lambda algo: fragc.fragment(role="actor", out_axes=-2),
     "fragment out_axes entries are axis indices from 0 .* got -2"),
]


@pytest.mark.parametrize("call,message", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_python_api_refuses_with_one_line(ppo_algo, call, message):
    with pytest.raises(fragc.FragcError, match=message) as err:
        call(ppo_algo)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("seed", ["abc", -1, 2**32, 2**70, 1.5])
def test_program_init_refuses_a_bad_seed(healthy, seed):
    with pytest.raises(fragc.FragcError, match=r"seed must be an int from 0 to 4294967295"):
        healthy.init(seed)


# ---------------------------------------------------------------- the command line, in-process


def run_cli(argv):
    """fragc's exit code for `argv`; argparse's usage errors exit through SystemExit."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


def write(path, content):
    path.write_bytes(content)
    return str(path)


CLI_CASES = [
    # (case, argv, the line's text); every case exits with code 2
    ("--lr nan", ["run", "ppo", "--lr", "nan"], "ppo: lr must be finite, got nan"),
    ("--lr -1", ["run", "ppo", "--lr", "-1"], "ppo: lr must be positive, got -1"),
    ("--gamma -1", ["run", "ppo", "--gamma", "-1"], r"ppo: gamma must be in [0, 1], got -1"),
    ("--clip-eps -0.2", ["run", "ppo", "--clip-eps", "-0.2"], "ppo: clip_eps must be positive, got -0.2"),
    ("--num-envs 1e8", ["run", "ppo", "--num-envs", "1e8"],
     "ppo: num_envs * num_steps (12800000000) must be at most 2147483647"),
    ("--total-steps 1e30", ["run", "ppo", "--total-steps", "1e30"], "is more than 2147483647 iterations"),
    ("--devices 100000", ["run", "ppo", "--policy", "anakin", "--devices", "100000"],
     "100000 devices were asked for but only 8 exist, and fragc simulates at most 1024 CPU devices"),
    ("--total-steps inf", ["run", "ppo", "--total-steps", "inf"], "argument --total-steps: expected an integer"),
    ("--iterations-per-dispatch inf", ["run", "ppo", "--iterations-per-dispatch", "inf"],
     "expected a positive whole number, got inf"),
    ("--seed -1", ["run", "ppo", "--seed", "-1"], "argument --seed: expected a whole number from 0 to 4294967295"),
    ("--seed 2**32", ["run", "ppo", "--seed", str(2**32)], f"from 0 to 4294967295, got {2**32}"),
    ("--seed 2**70", ["run", "ppo", "--seed", str(2**70)], f"from 0 to 4294967295, got {2**70}"),
    ("--stop-after without --checkpoint-dir", ["run", "ppo", "--stop-after", "3"],
     "--stop-after needs --checkpoint-dir"),
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_with_one_line_and_exit_code_2(capsys, argv, message):
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fragc") and err.count("\n") == 1 and message in err, err


def test_a_malformed_process_count_in_the_environment_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("FRAGC_NUM_PROCESSES", "abc")
    assert run_cli(["run", "ppo"]) == 2
    err = capsys.readouterr().err
    assert err == "fragc: error: FRAGC_NUM_PROCESSES='abc' in the environment: expected a whole number from 0\n"


DIVERGING = os.path.join(os.path.dirname(__file__), "diverging_algo.py:Diverging")
TINY = ["run", DIVERGING, "--iterations-per-dispatch", "2", "--quiet"]  # compiles in a second


def full_disk(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(2**30, 2**30 - 4096, 4096))


RUN_CASES = [
    # (case, arguments after TINY, set-up, exit code, the line's text): failures while training
    ("--metrics /dev/full", ["--metrics", "/dev/full"], None, 2,
     "fragc: error: cannot write metrics to '/dev/full': No space left on device"),
    ("a full disk under --checkpoint-dir", ["--checkpoint-dir", "{tmp}", "--checkpoint-every", "2"], full_disk, 2,
     "fragc: error: cannot write the checkpoint of iteration 2 to '{tmp}': No space left on device (0.00 MiB "
     "free, about 1.00 MiB needed); the earlier checkpoints are kept"),
]


@pytest.mark.parametrize("extra,setup,code,message", [c[1:] for c in RUN_CASES], ids=[c[0] for c in RUN_CASES])
def test_a_run_that_fails_stops_with_one_line(capsys, monkeypatch, tmp_path, extra, setup, code, message):
    if setup is not None:
        setup(monkeypatch)
    assert run_cli(TINY + [a.format(tmp=tmp_path) for a in extra]) == code
    err = capsys.readouterr().err
    assert err.startswith(message.format(tmp=tmp_path)) and err.count("\n") == 1, err


PLOT_CASES = [
    # (case, file content, extra arguments, the line's text)
    ("a JSON number per line", b"3\n4\n", [], "is not a fragc metrics file (line 1 is not a JSON object)"),
    ("a row missing env_steps", b'{"iteration": 1, "env_steps": 5}\n{"iteration": 2}\n', [],
     "is not a fragc metrics file (line 2 has no numeric env_steps)"),
    ("non-UTF-8 bytes", b'{"env_steps": 1}\n\xff\xfe\n', [], "is not a fragc metrics file (not UTF-8 text"),
    ("not JSON", b"iteration,env_steps\n1,5\n", [], "is not a fragc metrics file (line 1: Expecting value)"),
    ("an empty file", b"", [], "has no metric lines"),
    ("--out x.nosuchfmt", b'{"iteration": 1, "env_steps": 5}\n', ["--out", "x.nosuchfmt"],
     "cannot write plot 'x.nosuchfmt': unknown image format '.nosuchfmt' (known: "),
]


@pytest.mark.parametrize("content,extra,message", [c[1:] for c in PLOT_CASES], ids=[c[0] for c in PLOT_CASES])
def test_plot_refuses_with_one_line_and_exit_code_2(capsys, tmp_path, content, extra, message):
    assert run_cli(["plot", write(tmp_path / "m.jsonl", content), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fragc: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "m.png").exists()


# ---------------------------------------------------------------- issue 46: the command line (bad input 9 and 11)


ISSUE_46_CASES = [
    # (case, argv, the line's text); each exits with code 2 and leaves nothing in the working folder
    ("--env-workers abc after --env",  # the early parse failed, so --env read as an abbreviation: 'ambiguous option'
     ["run", "ppo", "--env", "gymnasium:CartPole-v1", "--env-workers", "abc"],
     "fragc run: error: argument --env-workers: expected a whole number from 0, got abc"),
    ("a2c on a continuous environment", ["run", "a2c", "--env", "MountainCarContinuous-v0"],
     "fragc: error: a2c supports discrete action spaces; MountainCarContinuous-v0 has Box"),  # it said 'ppo'
    ("sweep --lr -1,1e-4", ["sweep", "ppo", "--lr", "-1,1e-4"],  # argparse took -1,1e-4 for an option
     "fragc: error: sweep: lr=-1.0: ppo: lr must be positive, got -1"),
    ("--lr -1e-3", ["run", "ppo", "--lr", "-1e-3"], "fragc: error: ppo: lr must be positive, got -0.001"),
    ("--track-dir without --track", ["run", "ppo", "--track-dir", "tracked", "--total-steps", "4096"],
     "fragc: error: --track-dir says where --track's sinks (and --capture-video's videos) write: give --track "
     "SINKS too"),
    ("--memory-limit without --policy auto", ["run", "ppo", "--memory-limit", "100"],  # the search's: unused
     "fragc: error: --memory-limit is an option of --policy auto's search; this run has --policy single"),
    ("--no-auto-cache without --policy auto", ["run", "ppo", "--policy", "anakin", "--no-auto-cache"],
     "fragc: error: --no-auto-cache is an option of --policy auto's search; this run has --policy anakin"),
    ("sweep --pbt-metric without --pbt-every", ["sweep", "ppo", "--seeds", "0-1", "--pbt-metric", "loss"],
     "fragc: error: --pbt-metric is an option of population-based training: give --pbt-every K too"),
    ("--auto-budget without --policy auto", ["run", "ppo", "--auto-budget", "5"],
     "fragc: error: --auto-budget is an option of --policy auto's search; this run has --policy single"),
    # a config check of PPO's code, inherited, named ppo
    ("impala --activation relu6", ["run", "impala", "--activation", "relu6"],
     "fragc: error: impala: activation must be one of tanh, relu, got 'relu6'"),
    ("ppo_continuous --num-envs 3 --num-steps 3", ["run", "ppo_continuous", "--num-envs", "3", "--num-steps", "3"],
     "fragc: error: ppo_continuous: num_envs * num_steps (9) must divide by num_minibatches (32)"),
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in ISSUE_46_CASES], ids=[c[0] for c in ISSUE_46_CASES])
def test_issue_46_command_lines_are_refused_in_one_line_writing_nothing(capsys, monkeypatch, tmp_path, argv,
                                                                         message):
    monkeypatch.chdir(tmp_path)
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    assert os.listdir(tmp_path) == []


def test_track_dir_is_taken_with_capture_video_alone(capsys):
    """--capture-video's videos go to --track-dir too: that pair is not refused (printed, not run)."""
    assert run_cli(["run", "ppo", "--track-dir", "tracked", "--capture-video", "--print-config"]) == 0
    assert "lr = 0.00025" in capsys.readouterr().out


# ---------------------------------------------------------------- the command line, as a user starts it


def test_impossible_device_count_is_refused_at_once():
    """JAX takes minutes to start 100000 simulated CPU devices; fragc refuses before asking it."""
    proc = subprocess.run([sys.executable, "-m", "fragc.cli", "run", "ppo", "--policy", "anakin", "--devices",
                           "100000"], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["fragc: error: 100000 devices were asked for but only 1 exist, and fragc simulates at most "
                     "1024 CPU devices"], proc.stderr


# ---------------------------------------------------------------- divergence and resumed runs (fragc.train)


ITERATIONS, EVERY = 12, 4  # 2 iterations a dispatch: checkpoints after iterations 4, 8, 12


def compiled(nan_at=-1):
    return fragc.compile(Diverging(DivergingConfig(nan_at=nan_at)), devices=1, iterations_per_dispatch=2)


@pytest.fixture(scope="module")
def healthy():
    return compiled()


def train(prog, directory, **kw):
    return fragc.train(prog, prog.init(0), ITERATIONS, checkpoint_dir=directory, checkpoint_every=EVERY, **kw)


@pytest.mark.parametrize("nan_at,line", [
    (4, "training diverged: metric 'loss' is nan in iteration 6"),  # the metrics show it first
    (7, "training diverged: the state's w is not finite after iteration 8"),  # the state, just before its checkpoint
])
def test_a_run_that_diverges_stops_and_its_latest_checkpoint_is_finite_and_resumable(tmp_path, healthy, nan_at,
                                                                                      line):
    from fragc.runtime.checkpoint import Checkpointer
    from fragc.runtime.divergence import Diverged

    prog = compiled(nan_at)
    kept = f"; the latest checkpoint in '{tmp_path}' is iteration 4"
    with pytest.raises(Diverged, match="^" + re.escape(line + kept) + "$") as err:
        train(prog, tmp_path)
    assert err.value.exit_code == 3
    with Checkpointer(str(tmp_path)) as checkpoints:
        assert checkpoints.steps() == [4]
        state, _, _ = checkpoints.restore_latest(prog.init(0), {})
    w0 = np.asarray(prog.init(0).w)
    np.testing.assert_allclose(state.w, w0 * 0.9**4, rtol=1e-6)  # finite: a plain loop's 4 iterations
    progress = io.StringIO()
    with pytest.raises(Diverged, match="^" + re.escape(line + kept) + "$"):  # resumes, and repeats itself
        train(prog, tmp_path, resume=True, progress=progress)
    assert "resumed from the checkpoint at iteration 4" in progress.getvalue()


def test_parameters_are_checked_on_device_after_every_dispatch():
    """Without checkpoints the state never reaches the host during the run: the on-device flags of
    the dispatch that made w NaN stop it, before the next iteration's loss could show it."""
    from fragc.runtime.divergence import Diverged

    prog = compiled(nan_at=7)
    with pytest.raises(Diverged, match=r"^training diverged: the state's w is not finite after iteration 8$"):
        train(prog, None)


def test_a_diverging_run_on_the_command_line_exits_with_code_3(capsys, tmp_path):
    assert run_cli(TINY + ["--nan-at", "4", "--checkpoint-every", "4", "--checkpoint-dir", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err == (f"fragc: error: training diverged: metric 'loss' is nan in iteration 6; the latest checkpoint in "
                   f"'{tmp_path}' is iteration 4\n")


def test_a_resumed_run_writes_the_metrics_file_of_an_uninterrupted_one(tmp_path, healthy):
    train(healthy, None, metrics=tmp_path / "whole.jsonl")
    resumed = tmp_path / "resumed.jsonl"
    train(healthy, tmp_path / "ck", metrics=resumed, stop_after=6)
    shutil.rmtree(tmp_path / "ck" / "6")  # killed after iteration 6's metrics, before its checkpoint
    train(healthy, tmp_path / "ck", metrics=resumed, resume=True)

    def rows(name):
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"}
                for line in (tmp_path / name).read_text().splitlines()]

    assert [r["iteration"] for r in rows("whole.jsonl")] == [2, 4, 6, 8, 10, 12]
    assert rows("resumed.jsonl") == rows("whole.jsonl")


def test_resume_before_the_first_checkpoint_starts_fresh_with_a_notice(tmp_path, healthy):
    progress = io.StringIO()
    result = train(healthy, tmp_path / "empty", resume=True, progress=progress)
    assert result.resumed_from == 0 and result.iterations == ITERATIONS
    assert f"no checkpoint in '{tmp_path / 'empty'}' yet: starting afresh" in progress.getvalue()
    np.testing.assert_allclose(result.state.w, healthy.init(0).w * 0.9**ITERATIONS, rtol=1e-5)


def test_warnings_on_the_command_line_are_one_line():
    """A damaged checkpoint's fallback notice (a Python warning) reads as one line, without the source line."""
    import warnings

    from fragc.cli.errors import one_line_warnings

    message = "checkpoint 96 in 'D' is damaged; falling back to the previous one"
    with one_line_warnings():
        shown = warnings.formatwarning(UserWarning(message), UserWarning, "src/fragc/runtime/checkpoint.py", 182)
    assert shown == f"fragc: warning: {message}\n"
    assert not warnings.formatwarning(UserWarning(message), UserWarning, "x.py", 1).startswith("fragc:")  # restored
