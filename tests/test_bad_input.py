"""Every bad input is refused with one clear line: `fragc: error: ...` and exit code 2 on the command
line, a `FragcError` in Python; never a traceback, a hang, or a run that silently does the wrong thing.

The tables run in-process (no JAX start-up per case); each case fails in argument parsing or
validation, before anything is compiled. Only the cases that need a fresh process (JAX's device
count is fixed once its backend starts) spawn one.
"""

import io
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

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


# ---------------------------------------------------------------- divergence and resumed runs (fragc.train)


@struct.dataclass
class Walk:
    w: jax.Array  # [3]
    step: jax.Array


class Diverging:
    """w shrinks by 0.9 an iteration, and is NaN from the iteration after step `nan_at` on; the
    `loss` metric is |w|^2 of the iteration's incoming w, so NaN shows in the metrics one
    iteration after it reaches the state, as a parameter's would in a loss."""

    def __init__(self, nan_at=None):
        self.nan_at = nan_at

    def init(self, key):
        return Walk(jax.random.normal(key, (3,)), jnp.int32(0))

    @fragc.fragment(role="learner", in_axes=(None,), out_axes=(None, None))
    def learn(self, state):
        w = 0.9 * state.w
        if self.nan_at is not None:
            w = jnp.where(state.step >= self.nan_at, jnp.nan, w)
        return Walk(w, state.step + 1), {"loss": jnp.sum(state.w**2)}

    def iteration(self, state):
        return self.learn(state)


ITERATIONS, EVERY = 12, 4  # 2 iterations a dispatch: checkpoints after iterations 4, 8, 12


def compiled(nan_at=None):
    return fragc.compile(Diverging(nan_at), devices=1, iterations_per_dispatch=2)


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

    with pytest.raises(Diverged, match="^" + line) as err:
        train(compiled(nan_at), tmp_path)
    assert err.value.exit_code == 3 and "\n" not in str(err.value)
    assert Checkpointer(str(tmp_path)).steps() == [4]
    resumed = train(healthy, tmp_path, resume=True)
    assert resumed.resumed_from == 4
    w0 = healthy.init(0).w
    np.testing.assert_allclose(resumed.state.w, w0 * 0.9**ITERATIONS, rtol=1e-5)  # a plain loop's result


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
