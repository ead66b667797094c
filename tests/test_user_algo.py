"""A user's own algorithm (tests/purejaxrl_ppo.py) everywhere a built-in goes: the CLI with its
config's options, and the Python training driver with checkpoints and exact resume."""

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import fragc
import fragc.algos
from fragc.cli import main
from fragc.runtime.reporting import enable_compilation_cache, params_fingerprint

TESTS = pathlib.Path(__file__).parent
ROOT = TESTS.parent
USER_PPO = "tests/purejaxrl_ppo.py:PPO"  # relative to the repository root, as a user types it
ITERATIONS = 400  # of 4 environments x 16 steps
SMALL_FLAGS = ["--total-steps", str(ITERATIONS * 64), "--num-envs", "4", "--num-steps", "16",
               "--iterations-per-dispatch", "2"]
SMALL_PROGRAM = f"""
import fragc, purejaxrl_ppo as m
algo = m.PPO(m.Config(total_steps={ITERATIONS * 64}, num_envs=4, num_steps=16))
prog = fragc.compile(algo, "single", iterations_per_dispatch=2)
"""


@pytest.fixture(scope="module")
def small_ppo():
    """The user's PPO with a small config, compiled once through the Python API; the processes
    these tests start compile the same program, and find it in the compilation cache."""
    enable_compilation_cache()
    scope = {}
    exec(SMALL_PROGRAM, scope)
    return scope["prog"]


def test_fragc_run_trains_a_users_file_with_its_config_options(small_ppo, tmp_path, capsys, monkeypatch):
    """`fragc run file.py:Class` (a path relative to where it is typed) with the config's fields as options
    computes what the Python API computes with that config."""
    monkeypatch.chdir(ROOT)
    assert main(["run", USER_PPO, *SMALL_FLAGS, "--checkpoint-dir", str(tmp_path), "--stop-after", "16", "--json",
                 "--quiet"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["algo"] == USER_PPO and got["env"] == "CartPole-v1"
    assert got["iterations"] == 16 and got["env_steps"] == 1024
    result = fragc.train(small_ppo, small_ppo.init(0), 16)
    assert got["params_fingerprint"] == params_fingerprint(result.state)
    assert got["final_return"] == pytest.approx(result.final_return)


@pytest.mark.parametrize("algo,own,foreign", [
    ("ppo", ["--num-minibatches", "--clip-eps"], ["--buffer-size", "--rho-bar", "--env-name"]),
    (USER_PPO, ["--env-name", "--activation", "--total-steps"], ["--buffer-size", "--rho-bar", "--hidden"]),
])
def test_each_algorithm_offers_only_its_own_options(capsys, monkeypatch, algo, own, foreign):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exc:
        main(["run", algo, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert all(o in text for o in own) and not any(f in text for f in foreign), text
    assert main(["run", "ppo", "--buffer-size", "5"]) == 2
    assert "fragc: error: ppo has no option --buffer-size (see fragc run ppo --help)" in capsys.readouterr().err


def test_a_module_path_names_an_algorithm_too():
    import purejaxrl_ppo  # tests/ is on sys.path

    assert fragc.algos.load("purejaxrl_ppo:PPO") == (purejaxrl_ppo.PPO, purejaxrl_ppo.Config)


def test_a_users_state_resumes_from_its_checkpoint_to_the_uninterrupted_parameters(tmp_path, small_ppo):
    """The user's TrainState-based state through `fragc.train`: stopped after its second checkpoint and resumed,
    the run ends where an uninterrupted one does (a killed process's run: the test below, with -m slow)."""
    prog = small_ppo
    expected = fragc.train(prog, prog.init(0), 8)
    fragc.train(prog, prog.init(0), 8, checkpoint_dir=tmp_path, checkpoint_every=2, stop_after=4)
    resumed = fragc.train(prog, prog.init(0), 8, checkpoint_dir=tmp_path, resume=True)
    assert resumed.resumed_from == 4 and resumed.iterations == 8
    assert params_fingerprint(resumed.state) == params_fingerprint(expected.state)
    assert params_fingerprint(resumed.state) != params_fingerprint(prog.init(0))


@pytest.mark.slow  # a killed process (the fast suite kills `fragc run` in test_checkpoint.py; the test above)
def test_python_users_checkpoint_and_resume_exactly(tmp_path, small_ppo):
    """A Python program training with `fragc.train` is killed; `fragc.train(..., resume=True)` continues
    it to the parameters of an uninterrupted run."""
    iterations, ckpt = ITERATIONS, tmp_path / "ckpt"
    script = (f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
              "from fragc.runtime.reporting import enable_compilation_cache; enable_compilation_cache()\n"
              + SMALL_PROGRAM + f"fragc.train(prog, prog.init(0), {iterations}, checkpoint_dir=sys.argv[1], "
              "checkpoint_every=2)\n")
    victim = subprocess.Popen([sys.executable, "-c", script, str(ckpt)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and victim.poll() is None:  # two finished checkpoints
        if len([p for p in ckpt.glob("*") if p.name.isdigit()]) >= 2:
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the run ended before it could be killed: " + victim.stderr.read()[-2000:]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    prog = small_ppo
    expected = fragc.train(prog, prog.init(0), iterations)
    resumed = fragc.train(prog, prog.init(0), iterations, checkpoint_dir=ckpt, resume=True)
    assert 0 < resumed.resumed_from < iterations and resumed.iterations == iterations
    assert len(resumed.history["episode_return"]) == iterations - resumed.resumed_from
    assert params_fingerprint(resumed.state) == params_fingerprint(expected.state)


@pytest.mark.parametrize("spec,message", [
    ("tests/nowhere.py:PPO", "cannot find the file 'tests/nowhere.py'"),
    ("tests/purejaxrl_ppo.py:PPX", "'tests/purejaxrl_ppo.py' has no class 'PPX'; algorithm classes there: PPO"),
    ("tests/purejaxrl_ppo.py:Config", "tests/purejaxrl_ppo.py:Config is not an algorithm"),
    ("fragc.nowhere:PPO", "no module named 'fragc.nowhere' (for a file, give its path ending in .py)"),
    ("{tmp}/broken.py:A", "cannot import '{tmp}/broken.py': SyntaxError: "),
    ("{tmp}/fails.py:A", "cannot import '{tmp}/fails.py': ZeroDivisionError: division by zero ({tmp}/fails.py:3)"),
    ("{tmp}/noconfig.py:A", "cannot find its config dataclass: give A a `Config` attribute"),
])
def test_a_bad_algorithm_argument_is_one_line(capsys, tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(ROOT)
    (tmp_path / "broken.py").write_text("class A:\n    def init(self, key)\n")
    (tmp_path / "fails.py").write_text("import os\n\nx = 1 / 0\n")
    (tmp_path / "noconfig.py").write_text("class A:\n    def __init__(self, c):\n        pass\n"
                                          "    def init(self, key): pass\n    def iteration(self, s): pass\n")
    spec, message = (s.replace("{tmp}", str(tmp_path)) for s in (spec, message))
    assert main(["run", spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
