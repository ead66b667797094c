"""The command line: training, IR printing, and one clear line with exit code 2 for bad input."""

import pytest

from fragc.cli import main


def test_run_prints_progress_and_final_return(capsys):
    assert main(["run", "ppo", "--total-steps", "4096", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "fragc run ppo: env CartPole-v1, policy single, 8 iterations" in out
    assert "final mean episode return" in out
    # off a terminal: a line before compiling, and progress lines with an ETA (issue 46)
    assert out.index("fragc run ppo: compiling for env CartPole-v1, policy single") < out.index("compiled in")
    assert "  8/8 it  4096 env steps" in out and "elapsed, eta 0:00" in out


def test_ir_prints_the_traced_module(capsys):
    assert main(["ir", "ppo", "--after", "trace"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("// fragc.ir · ppo · after 001_trace")
    assert "run @rollout(%state.learner.params.params, %state.runner)" in out


def test_ir_runs_the_passes_only(capsys, monkeypatch):
    """`fragc ir` prints what the passes make (the golden module) and compiles no program. DQN under
    actor_learner on 8 devices: two stages, three transfers an iteration."""
    import pathlib

    import fragc.compiler

    def no_program(*args, **kwargs):
        raise AssertionError("fragc ir built a Program")

    monkeypatch.setattr(fragc.compiler, "Program", no_program)
    assert main(["ir", "dqn", "--policy", "actor_learner", "--devices", "8"]) == 0
    out = capsys.readouterr().out
    assert out == (pathlib.Path(__file__).parent / "golden" / "dqn_actor_learner.fir").read_text()
    lines = out.splitlines()
    assert sum(line.lstrip().startswith("stage @") for line in lines) == 2
    assert sum(" = transfer " in line for line in lines) == 3


def test_ir_dot(capsys):
    assert main(["ir", "ppo", "--dot"]) == 0
    assert capsys.readouterr().out.startswith('digraph "ppo"')


@pytest.mark.parametrize("argv,message", [
    (["run", "ppx"], "unknown algorithm 'ppx' (did you mean 'ppo'?)"),
    (["run", "ppo", "--env", "CartPole"], "unknown environment 'CartPole'; did you mean 'CartPole-v1'?"),
    (["run", "ppo", "--env", "Pendulum-v1"], "ppo supports discrete action spaces; Pendulum-v1 has Box (for continuous "
                                             "actions: ppo_continuous or sac)"),
    (["run", "ppo", "--policy", "nope"], "unknown policy 'nope'"),
    (["run", "ppo", "--num-envs", "6", "--num-minibatches", "4", "--num-steps", "3"], "must divide by num_minibatches"),
    (["ir", "ppo", "--after", "lower-everything"], "no pass named 'lower-everything'"),
    # an unknown option or command, with the closest known one (issue 46)
    (["run", "ppo", "--lrr", "1e-3"], "ppo has no option --lrr (did you mean --lr?) (see fragc run ppo --help)"),
    (["sweep", "ppo", "--ent-cof", "0.1"], "ppo has no option --ent-cof (did you mean --ent-coef?)"),
    (["sweep", "ppo", "--seedz", "0-3"], "ppo has no option --seedz (did you mean --seeds?)"),
    (["bench", "ppo", "--repeat-count", "2"], "ppo has no option --repeat-count (did you mean --repeats?)"),
    (["ir", "ppo", "--afterr", "trace"], "ppo has no option --afterr (did you mean --after?)"),
    (["video", "ck", "--episods", "3"], "fragc video has no option --episods (did you mean --episodes?) (see fragc "
                                        "video --help)"),
    (["plot", "m.jsonl", "--outt", "m.png"], "fragc plot has no option --outt (did you mean --out?)"),
    (["run", "ppo", "--lrr=1e-3", "--zzzzzz"], "ppo has no option --lrr=1e-3 (did you mean --lr?), --zzzzzz (see"),
    (["run", "ppo", "--no-anneal-lr", "true"], "--no-anneal-lr takes no value, got true (--anneal-lr true sets one)"),
    (["rnu", "ppo"], "unknown command 'rnu' (did you mean run?); the commands are run, ir, bench, sweep,"),
])
def test_bad_input_is_one_line_and_exit_code_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_non_positive_counts_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:  # the driver's counts by the parser
        main(["run", "ppo", "--iterations-per-dispatch", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "must be positive" in err and err.count("\n") == 1, err
    assert main(["run", "ppo", "--total-steps", "0"]) == 2  # the config's by the config
    err = capsys.readouterr().err
    assert "ppo: total_steps must be positive, got 0" in err and err.count("\n") == 1, err


def test_run_under_a_distributed_policy(capsys):
    assert main(["run", "ppo", "--policy", "actor_learner", "--devices", "8", "--num-envs", "8",
                 "--total-steps", "2048", "--quiet"]) == 0
    assert "final mean episode return" in capsys.readouterr().out


def test_ir_print_after_all_and_dump_dir(capsys, tmp_path):
    assert main(["ir", "ppo", "--policy", "anakin", "--devices", "4", "--print-after-all",
                 "--dump-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("// fragc.ir · ppo · after") == 8
    assert (tmp_path / "003_place.fir").read_text().startswith("// fragc.ir · ppo · after 003_place{policy=anakin}")


def test_unwritable_dump_dir(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["ir", "ppo", "--dump-dir", str(blocker / "sub")]) == 2
    assert "cannot write IR dumps" in capsys.readouterr().err


def test_every_commands_help_prints(capsys):
    """`fragc --help`, each command's and each algorithm's options print and exit 0 (argparse formats help strings
    with %: an unescaped `95% CIs` once made `fragc --help` a traceback)."""
    from fragc.algos import ALGOS
    from fragc.cli import COMMANDS

    algorithm_helps = [[command, name, "--help"] for command in ("run", "bench", "sweep") for name in ALGOS]  # ir: run's
    for argv in [["--help"], *[[command, "--help"] for command in COMMANDS], *algorithm_helps]:
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 0, argv
        assert capsys.readouterr().out.startswith("usage: fragc"), argv


@pytest.mark.parametrize("package", ["fragc", "fragc.ir"])
def test_a_package_loads_each_name_it_lists_on_first_use(package):
    """`fragc` and `fragc.ir` import their modules when a name is first read (so that `fragc launch` starts
    without JAX): each name in __all__ resolves, and the imports type checkers read name the same ones."""
    import ast
    import importlib
    import typing

    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    tree = ast.parse(open(module.__file__).read())
    checked = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    assert sorted(alias.asname or alias.name for imp in checked.body for alias in imp.names) == sorted(module.__all__)
    assert typing.TYPE_CHECKING is False
    with pytest.raises(AttributeError, match="has no attribute 'nonesuch'"):
        module.nonesuch


def test_the_command_line_starts_without_jax():
    """`fragc launch` and `fragc --help` need no JAX (about 2 s of each launcher's start)."""
    import subprocess
    import sys

    script = ("import sys; from fragc.cli import main; main(['launch', '-n', '1', '--', sys.executable, '-c', 'pass']); "
              "print(sorted(m for m in ('jax', 'flax', 'optax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "[]", out.stdout


def test_bench_splits_its_policies_at_top_level_commas_only(capsys):
    """`--policies 'single,population(single,4)'` names two policies: the comma inside the parentheses is the
    population's own (refused here at the policy after it, before anything compiles)."""
    assert main(["bench", "ppo", "--policies", "single,population(single,4),nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown policy 'nope'" in err and err.count("\n") == 1, err


def test_the_search_options_reach_the_search_and_default_to_its_own():
    """`--auto-top` given, `--auto-budget` not: the search's own default (60 s, as the help says)."""
    from fragc.cli.algorithm import search_options
    from fragc.cli.commands import parse

    options = search_options(parse(["run", "ppo", "--policy", "auto", "--auto-top", "2", "--memory-limit", "1"], "ppo"))
    assert (options.top, options.budget, options.memory_limit, options.cache) == (2, 60.0, 2**20, True)


def test_run_help_lists_the_algorithms_options_first_then_the_runs_in_groups(capsys):
    """`fragc run ALGO --help`: the config's own fields (PPO's, then the evaluation fields it inherits), before the
    run's own options, which come in groups."""
    with pytest.raises(SystemExit):
        main(["run", "ppo", "--help"])
    out = capsys.readouterr().out
    titles = [line[:-1] for line in out.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert titles == ["positional arguments", "options of ppo", "options", "where it runs", "run length and seed",
                      "output", "checkpoints", "several processes (jax.distributed)"]
    mine = out[out.index("options of ppo:"):out.index("\noptions:")]
    assert mine.index("--env STR") < mine.index("--clip-eps") < mine.index("--eval-every")
    assert out.index("--policy POLICY", out.index("where it runs:")) > out.index("--clip-eps")


def test_envs_keeps_a_packages_ids_per_installed_version(tmp_path, monkeypatch):
    """`fragc envs` asks jaxmarl and envpool for their ids once per installed version (importing them takes 13 s):
    the answer is kept in the user's cache, and asked again under another version."""
    import importlib.metadata

    from fragc.cli import lists

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    asked = []
    ids = lists.kept_per_version("gymnasium", lambda: asked.append(1) or ["A-v0", "B-v1"])
    assert ids() == ["A-v0", "B-v1"] and ids() == ["A-v0", "B-v1"] and len(asked) == 1
    monkeypatch.setattr(importlib.metadata, "version", lambda package: "99.0")
    assert ids() == ["A-v0", "B-v1"] and len(asked) == 2
