"""Issue 26.4 and 26.5: `--config FILE` (TOML, YAML), `--print-config`, the record written beside checkpoints and
metrics, `--iterations`/`--total-steps` for any algorithm, and the final line of an algorithm without returns.

In-process (`main([...])`) on tiny algorithms written to a temporary file, which compile in a fraction of a
second; PPO only where nothing is compiled (`--print-config`, refusals before compiling)."""

import json
import pathlib
import shutil
import subprocess
import sys
import tomllib

import pytest

import fragc
from fragc import config_files
from fragc.cli import main
from fragc.cli.algorithm import make_algo
from fragc.cli.commands import parse

TINY = '''
import dataclasses

import jax
import jax.numpy as jnp

import fragc


class NoConfig:
    """No config: gradient steps that fit w to 1; its one metric is a loss (no episode_return)."""

    def init(self, key):
        return {"w": jax.random.normal(key, (3,))}

    @fragc.fragment(role="learner", in_axes=(None, None), out_axes=(None, None))
    def learn(self, w, lr):
        loss, grad = jax.value_and_grad(lambda w: jnp.sum((w - 1.0) ** 2))(w)
        return w - lr * grad, {"loss": loss}

    def iteration(self, state):
        w, metrics = self.learn(state["w"], 0.1)
        return {"w": w}, metrics


class Stepped(NoConfig):
    steps_per_iteration = 32
    """Known env steps per iteration: --total-steps works."""


@dataclasses.dataclass(frozen=True)
class Config:
    lr: float = 0.1
    """Step size."""
    iterations: int = 10
    """The run length."""
    scale: tuple = (1.0, 2.0)
    """A tuple field (TOML and YAML have lists)."""
    seed: int = 0
    """A field named like a fragc run option: --config-seed."""


class WithConfig(NoConfig):
    Config = Config

    def __init__(self, config: Config = Config()):
        self.config = config

    def iteration(self, state):
        w, metrics = self.learn(state["w"], self.config.lr * self.config.scale[0])
        return {"w": w}, metrics
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("algo")
    (folder / "tiny.py").write_text(TINY)
    return lambda name: f"{folder / 'tiny.py'}:{name}"


def run_json(capsys, argv):
    assert main([*argv, "--json", "--quiet"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def printed(capsys, argv):
    assert main([*argv, "--print-config"]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


# ------------------------------------------------------------------ item 5: run length, final line


def test_a_class_without_config_runs_with_iterations(tiny, capsys):
    """`fragc run file.py:Class --iterations 20` (the issue's acceptance); the final line is its metrics' last
    values, and no env steps are claimed: it has no steps_per_iteration."""
    assert main(["run", tiny("NoConfig"), "--iterations", "20"]) == 0
    out = capsys.readouterr().out
    assert "NoConfig: policy single, 20 iterations, compiled in" in out and "env" not in out.replace("fragc", ""), out
    assert out.splitlines()[-1].startswith("final metrics: loss ") and "after 20 iterations (" in out, out
    assert "nan" not in out
    got = run_json(capsys, ["run", tiny("NoConfig"), "--iterations", "20"])
    assert got["iterations"] == 20 and got["env_steps"] is None and got["final_return"] is None
    assert got["env"] is None and 0 <= got["final_metrics"]["loss"] < 0.01


def test_a_class_without_run_length_is_refused_in_one_line(tiny, capsys):
    assert main(["run", tiny("NoConfig")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fragc run needs the run length: pass --iterations N" in err, err
    assert main(["run", tiny("NoConfig"), "--total-steps", "100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--total-steps needs the env steps of an iteration" in err, err


def test_total_steps_where_steps_per_iteration_are_known_and_what_is_rounded_is_said(tiny, capsys):
    got = run_json(capsys, ["run", tiny("Stepped"), "--total-steps", "100"])
    assert got["iterations"] == 3 and got["env_steps"] == 96
    assert main(["run", tiny("Stepped"), "--total-steps", "100", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "after 96 env steps" in captured.out  # rounded down to whole iterations, and said
    assert main(["run", tiny("Stepped"), "--total-steps", "10", "--quiet"]) == 0
    assert capsys.readouterr().err == ("fragc: warning: --total-steps 10 is less than one iteration (32 env steps): "
                                       "running 1 iteration (32 env steps)\n")


def test_ppo_total_steps_below_one_iteration_is_said_before_compiling(capsys, monkeypatch):
    """The issue's `--total-steps 10`: one line on stderr, before anything compiles (compile is stopped here)."""
    from fragc.cli import algorithm  # what the command line compiles with

    def not_compiled(*args, **kwargs):
        raise fragc.FragcError("not compiled")

    monkeypatch.setattr(algorithm, "compile_with", not_compiled)
    assert main(["run", "ppo", "--total-steps", "10"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "fragc: warning: --total-steps 10 is less than one iteration (512 env steps): running 1 iteration "
        "(512 env steps)", "fragc: error: not compiled"]
    assert main(["run", "ppo", "--total-steps", "4096"]) == 2  # a whole number of iterations: nothing to say
    assert capsys.readouterr().err.splitlines() == ["fragc: error: not compiled"]


def test_iterations_sets_a_builtin_configs_total_steps(capsys):
    """PPO's run length is total_steps (its learning rate anneals over it): --iterations N sets it to N
    iterations' env steps, so that the printed config is the run."""
    text = printed(capsys, ["run", "ppo", "--iterations", "20", "--num-envs", "4", "--num-steps", "8"])
    table = tomllib.loads(text)
    assert table["total_steps"] == 20 * 32 and "iterations" not in table
    assert main(["run", "ppo", "--iterations", "20", "--total-steps", "640"]) == 2
    err = capsys.readouterr().err
    assert err == "fragc: error: pass --iterations or --total-steps, not both\n", err


def test_iterations_is_a_configs_iterations_field_under_run_and_bench_keeps_its_own(tiny, tmp_path):
    """A config field `iterations` is fragc run's --iterations (the same run length), and stays
    --config-iterations under fragc bench, whose --iterations counts timed iterations; a config file's
    `iterations` is the field under both."""
    spec = tiny("WithConfig")
    assert make_algo(parse(["run", spec, "--iterations", "4"], spec)).config.iterations == 4
    path = tmp_path / "c.toml"
    path.write_text("iterations = 7\nlr = 0.5\n")
    run = parse(["run", spec, "--config", str(path)], spec)
    assert make_algo(run).config.iterations == 7 and run.iterations == 7
    bench = parse(["bench", spec, "--config", str(path)], spec)
    assert (bench.iterations, bench.cfg_iterations, bench.cfg_lr) == (16, 7, 0.5)
    assert make_algo(bench).config.iterations == 7


# ------------------------------------------------------------------ item 4: config files


PPO_TOML = """
# hand-written: both spellings of a field, a float written as 5e5 for an int
seed = 3
policy = "single"
lr = 1e-3
ent-coef = 0.02
total_steps = 5e5
num_envs = 8
anneal_lr = false
"""


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_print_config_round_trips_in_the_files_format(capsys, tmp_path, suffix):
    """file -> --print-config -> the same file; its values are the run's (the file's, the command line's over
    them, the algorithm's defaults for the rest)."""
    source = tmp_path / f"run{suffix}"
    if suffix == ".toml":
        source.write_text(PPO_TOML)
    else:
        import yaml

        source.write_text(yaml.safe_dump(tomllib.loads(PPO_TOML)).replace("ent_coef", "ent-coef"))
    first = printed(capsys, ["run", "ppo", "--config", str(source), "--num-steps", "16"])
    again = tmp_path / f"again{suffix}"
    again.write_text(first)
    assert printed(capsys, ["run", "ppo", "--config", str(again)]) == first
    table = tomllib.loads(first) if suffix == ".toml" else __import__("yaml").safe_load(first)
    assert (table["seed"], table["lr"], table["ent_coef"], table["total_steps"]) == (3, 1e-3, 0.02, 500000)
    assert (table["num_envs"], table["num_steps"], table["anneal_lr"], table["gamma"]) == (8, 16, False, 0.99)
    assert table["policy"] == "single" and table["checkpoint_every"] == 64 and "resume" not in table
    overridden = printed(capsys, ["run", "ppo", "--config", str(again), "--seed", "9", "--lr", "0.5"])
    assert overridden == first.replace("seed: 3", "seed: 9").replace("seed = 3", "seed = 9").replace(
        "lr: 0.001", "lr: 0.5").replace("lr = 0.001", "lr = 0.5")


def test_the_printed_config_runs_the_same_run(tiny, capsys, tmp_path):
    """A config with a tuple field and a field named like a run option (seed -> config_seed)."""
    spec = tiny("WithConfig")
    argv = ["run", spec, "--seed", "2", "--config-seed", "5", "--scale", "(0.5, 3.0)", "--iterations", "6"]
    expected = run_json(capsys, argv)
    text = printed(capsys, argv)
    table = tomllib.loads(text)
    assert (table["seed"], table["config_seed"], table["scale"], table["iterations"]) == (2, 5, [0.5, 3.0], 6)
    path = tmp_path / "printed.toml"
    path.write_text(text)
    got = run_json(capsys, ["run", spec, "--config", str(path)])
    assert got["params_fingerprint"] == expected["params_fingerprint"] and got["iterations"] == 6
    args = parse(["run", spec, "--config", str(path)], spec)
    assert make_algo(args).config == fragc.algos.load(spec)[1](lr=0.1, iterations=6, scale=(0.5, 3.0), seed=5)


@pytest.mark.parametrize("content,message", [
    ("lrr = 0.1\n", "c.toml: unknown key 'lrr' (did you mean 'lr'?); the keys are the fields of ppo's config and "
                    "fragc run's options (fragc run ppo --help)"),
    ("lr = \"fast\"\n", "c.toml: lr must be a number, got \"fast\" (a string)"),
    ("num_envs = 2.5\n", "c.toml: num_envs must be a whole number, got 2.5 (a number)"),
    ("anneal_lr = 1\n", "c.toml: anneal_lr must be true or false, got 1 (an integer)"),
    ("seed = -1\n", "c.toml: seed: expected a whole number from 0 to 4294967295, got -1"),
    ("checkpoint_every = 0\n", "c.toml: checkpoint_every: must be positive, got 0"),
    ("resume = true\n", "c.toml: 'resume' is an option of the command line only (--resume)"),
    ("lr = 0.1\nlr-x = 1\n", "unknown key 'lr-x' (did you mean 'lr'?)"),
    ("ent_coef = 0.1\nent-coef = 0.2\n", "c.toml: 'ent_coef' and 'ent-coef' are the same key"),
    ("lr = \n", "c.toml is not valid TOML: Invalid value (at line 1, column 6)"),
    ("total_steps = 0\n", "ppo: total_steps must be positive, got 0"),
    ("[fragc]\nalgo = \"dqn\"\n", "c.toml was written for the algorithm dqn, not ppo"),
])
def test_a_bad_config_file_is_one_line_and_exit_code_2(capsys, tmp_path, monkeypatch, content, message):
    monkeypatch.chdir(tmp_path)
    pathlib.Path("c.toml").write_text(content)
    assert main(["run", "ppo", "--config", "c.toml", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fragc: error: ") and message in err, err


@pytest.mark.parametrize("content,expected", [
    ("lr: 1e-3\ntotal_steps: 5e5\n", "lr: 0.001\n"),  # PyYAML reads both as strings (YAML 1.1: no dot)
    ("lr: -1.5E+2\n", "ppo: lr must be positive, got -150"),  # a number: the config's own check refuses it
    ("lr: fast\n", "c.yaml: lr must be a number, got \"fast\" (a string)"),
    ("lr: 1e-3e\n", "c.yaml: lr must be a number, got \"1e-3e\" (a string)"),
    ("env: 1e3\n", "\nenv: 1e3\n"),  # a string field keeps its string (a number would print 1000.0)
])
def test_a_yaml_number_in_exponent_notation_is_a_number(capsys, tmp_path, monkeypatch, content, expected):
    """`lr: 1e-3` in YAML is the number 0.001 (total_steps 5e5 the int 500000), as in TOML; a string that is no
    number is still refused in one line naming the key and the type it needs."""
    monkeypatch.chdir(tmp_path)
    pathlib.Path("c.yaml").write_text(content)
    code = main(["run", "ppo", "--config", "c.yaml", "--print-config"])
    out, err = capsys.readouterr()
    if code == 0:
        assert expected in out and ("total_steps" not in content or "total_steps: 500000\n" in out), out
    else:
        assert code == 2 and err.count("\n") == 1 and expected in err, err
    assert (code == 0) == expected.endswith("\n")


def test_config_file_errors_without_a_file_or_pyyaml(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv, message in ((["--config", "nowhere.toml"], "cannot read the config file 'nowhere.toml': No such file"),
                          (["--config", "run.json"], "--config run.json: expected a .toml, .yaml or .yml file")):
        assert main(["run", "ppo", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    pathlib.Path("run.yaml").write_text("lr: 0.1\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    assert main(["run", "ppo", "--config", "run.yaml"]) == 2
    assert capsys.readouterr().err == ("fragc: error: YAML config files need PyYAML: pip install pyyaml (or write "
                                       "the file as .toml)\n")


def test_ir_takes_the_config_and_the_placement_from_a_runs_file(tiny, capsys, tmp_path):
    spec = tiny("WithConfig")
    path = tmp_path / "run.toml"
    path.write_text('policy = "anakin"\ndevices = 4\nseed = 7\ncheckpoint_dir = "ckpt"\nlr = 0.3\n')
    assert main(["ir", spec, "--config", str(path)]) == 0
    assert "mesh @all = devices[0..3]" in capsys.readouterr().out
    args = parse(["ir", spec, "--config", str(path), "--devices", "2"], spec)
    assert (args.policy, args.devices, args.cfg_lr) == ("anakin", 2, 0.3) and not hasattr(args, "seed")


def test_the_run_is_recorded_beside_its_checkpoints_and_metrics(tiny, capsys, tmp_path, monkeypatch):
    """run.toml in the checkpoint folder and NAME.run.toml beside NAME.jsonl: the resolved config and a [fragc]
    table (algorithm, fragc's version, the command, the git revision of the algorithm's file: none here, in
    a temporary folder); either runs again with --config, and a resume finds its checkpoints beside it."""
    from importlib import metadata

    monkeypatch.chdir(tmp_path)
    spec = tiny("WithConfig")
    argv = ["run", spec, "--iterations", "4", "--lr", "0.2", "--checkpoint-dir", "ckpt", "--metrics", "m.jsonl",
            "--checkpoint-every", "2", "--stop-after", "2"]
    assert main([*argv, "--quiet"]) == 0
    capsys.readouterr()
    record = (tmp_path / "ckpt" / "run.toml").read_text()
    assert (tmp_path / "m.run.toml").read_text() == record
    table = tomllib.loads(record)
    assert (table["lr"], table["iterations"], table["checkpoint_dir"], table["metrics"]) == (0.2, 4, "ckpt", "m.jsonl")
    assert table["fragc"] == {"algo": spec, "fragc_version": metadata.version("fragc"),
                              "command": "fragc " + " ".join(argv + ["--quiet"]), "source": spec.split(":")[0]}
    assert printed(capsys, ["run", spec, "--config", "ckpt/run.toml"]) == record.split("\n[fragc]")[0]
    got = run_json(capsys, ["run", spec, "--config", "ckpt/run.toml", "--resume"])
    assert got["resumed_from"] == 2 and got["iterations"] == 4


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_revision_of_the_algorithms_file(tmp_path):
    algo = tmp_path / "algo.py"
    algo.write_text("x = 1\n")
    assert config_files.git_revision(str(algo)) == (None, None)  # not in a checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "algo.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "algo"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (tmp_path / "other.py").write_text("y = 2\n")  # another file's changes are not this file's
    assert config_files.git_revision(str(algo)) == (head, False)
    algo.write_text("x = 2\n")
    assert config_files.git_revision(str(algo)) == (head, True)
