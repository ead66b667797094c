"""Every bad input is refused with one clear line: `fragc: error: ...` and exit code 2 on the command
line, a `FragcError` in Python; never a traceback, a hang, or a run that silently does the wrong thing.

The tables run in-process (no JAX start-up per case); each case fails in argument parsing or
validation, before anything is compiled. Only the cases that need a fresh process (JAX's device
count is fixed once its backend starts) spawn one.
"""

import os
import subprocess
import sys

import pytest

import fragc
from fragc.algos import a2c, dqn, impala, ppo, ppo_continuous
from fragc.cli import main
from toy_algos import Regression

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
    ("Config(hidden=0)", lambda algo: ppo.Config(hidden=0), "ppo: hidden must be positive, got 0"),
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


@pytest.fixture(scope="module")
def program():
    return fragc.compile(Regression(), devices=1, iterations_per_dispatch=1)


@pytest.mark.xfail(strict=True, reason="needs Program.init to call fragc.runtime.seeds.check_seed (runtime/program.py)")
@pytest.mark.parametrize("seed", ["abc", -1, 2**32, 2**70, 1.5])
def test_program_init_refuses_a_bad_seed(program, seed):
    with pytest.raises(fragc.FragcError, match=r"seed must be an int from 0 to 4294967295"):
        program.init(seed)


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
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_with_one_line_and_exit_code_2(capsys, argv, message):
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fragc") and err.count("\n") == 1 and message in err, err


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


# ---------------------------------------------------------------- the command line, as a user starts it


def test_impossible_device_count_is_refused_at_once():
    """JAX takes minutes to start 100000 simulated CPU devices; fragc refuses before asking it."""
    proc = subprocess.run([sys.executable, "-m", "fragc.cli", "run", "ppo", "--policy", "anakin", "--devices",
                           "100000"], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["fragc: error: 100000 devices were asked for but only 1 exist, and fragc simulates at most "
                     "1024 CPU devices"], proc.stderr
