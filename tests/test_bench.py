"""`fragc bench`'s driver, and a smoke test of every script in bench/ at tiny sizes, so that none can rot.

Each script's `main()` runs in this process (its folder on sys.path, as running it puts it there) with its own
options at their smallest and the algorithms' configs shrunk (`tiny_configs`): the whole script runs, its
arithmetic on a few environments for a few iterations, and what it writes is read back. Programs compile through
the suite's compilation cache. The GPU experiments (bench/experiments/) are one-off scripts with their sizes
fixed; their CPU path runs too, with the same configs shrunk.
"""

import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types
from typing import Callable

import jax
import pytest

from fragc.algos import pqn, ppo, sac
from fragc.cli.bench import policy_list, run_bench
from fragc.passes.policy import resolve
from fragc.runtime.bench import format_table
from toy_algos import Regression

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"

TINY = {
    ppo: dict(num_envs=16, num_steps=16, num_minibatches=2, update_epochs=2),  # shared_programs.ppo_algo's
    pqn: dict(num_envs=4, num_steps=4, num_epochs=1, num_minibatches=2, hidden=16),
    sac: dict(num_envs=1, buffer_size=64, batch_size=4, learning_starts=0, hidden=8),
}
"""The configs' sizes in the smoke tests: each algorithm's `Config` defaults to these. PPO's are
tests/shared_programs.py's, so that a script's `fragc.compile(PPO(Config()), POLICY)` on 8 devices, 16 iterations a
dispatch, is the program test_policies.py compiles (XLA compiles it once a session: the compilation cache)."""


@pytest.fixture
def tiny_configs(monkeypatch):
    """Each algorithm's `Config` with TINY's defaults (a subclass: what a script builds and what `algos.make`
    builds are tiny)."""
    shrink(monkeypatch, TINY)


def shrink(monkeypatch, tiny: dict) -> None:
    for module, sizes in tiny.items():
        base = module.Config
        fields = [(name, base.__dataclass_fields__[name].type, dataclasses.field(default=value))
                  for name, value in sizes.items()]
        monkeypatch.setattr(module, "Config", dataclasses.make_dataclass("Config", fields, bases=(base,), frozen=True,
                                                                          namespace={"__module__": module.__name__}))


def bench_module(name: str):
    """bench/NAME.py, imported as a module of its own (under sys.modules, where its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location("bench_" + name.replace("/", "_"), BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch, tmp_path):
    """`bench(name, *argv)`: bench/NAME.py's main() with `argv` (and `--out` in a folder of the test's) -> that
    folder; `before(module)` runs first. The JAX settings a script changes are put back."""
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.syspath_prepend(str(BENCH.parent / "tests"))
    cache = jax.config.jax_enable_compilation_cache
    loaded = set(sys.modules)

    def run(name: str, *argv: str, out: bool = True, before: Callable | None = None) -> pathlib.Path:
        module = bench_module(name)
        if before is not None:
            before(module)
        monkeypatch.setattr(sys, "argv", [str(BENCH / f"{name}.py"), *argv, *(["--out", str(tmp_path)] if out else [])])
        module.main()
        return tmp_path

    yield run
    jax.config.update("jax_enable_compilation_cache", cache)
    for name in set(sys.modules) - loaded:  # bench/'s modules go with its path (purejaxrl_ppo is tests/'s too)
        if str(BENCH) in (getattr(sys.modules[name], "__file__", None) or ""):
            del sys.modules[name]


def test_bench_times_an_algorithm_that_says_neither_its_steps_nor_a_return():
    """Regression has no `steps_per_iteration` and no `episode_return` metric: iterations per second stand in for
    env steps per second, and the return is left out."""
    rows = run_bench(lambda: Regression(num_envs=8), ["single"], None, iterations=2, repeats=1, log=lambda line: None)
    row = rows["single"]
    assert row["unit"] == "iterations/s" and row["median"] == row["iterations_per_s"][0] > 0
    assert row["env_steps_per_s"] is None and row["final_return"] is None
    line = format_table(rows).splitlines()[1]
    assert line.split()[:2] == ["single", "1"] and line.split()[-1] == "-", line


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow (7-8 s; the suite
# was at 349 s of its 360)
def test_lowering(bench, tiny_configs):
    """purejaxrl_ppo.FragcPort (PureJaxRL's PPO as two fragments) compiles under `single` and runs beside jit."""
    result = json.loads((bench("lowering", "--repeats", "1", "--iterations", "2", "--k", "2")
                         / "lowering.json").read_text())
    assert set(result["env_steps_per_s"]) == {"fragc", "plain_jit"} and len(result["ratios"]) == 1


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow
def test_ppo_single(bench, tiny_configs, capsys):
    result = json.loads((bench("ppo_single", "--repeats", "1", "--iterations", "16", "--k", "16", "--compile-repeats",
                               "0", "--sides", "fragc,plain_jit,purejaxrl,fragc_no_trunc") / "ppo_single.json").read_text())
    assert set(result["env_steps_per_s"]) == {"fragc", "plain_jit", "purejaxrl", "fragc_no_trunc"}
    bench("ppo_single", "--compile-only", "fragc", "--k", "16", out=False)  # what each cold-compile process runs
    assert float(capsys.readouterr().out.splitlines()[-1]) > 0


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow
def test_population(bench, tiny_configs):
    result = json.loads((bench("population", "--sizes", "2", "--iterations", "1", "--repeats", "1", "--no-trunc",
                               "--fragc-rolled", "--purejaxrl-straight") / "population.json").read_text())
    [row] = result["rows"]
    assert row["members"] == 2 and set(row["seconds"]) == {"fragc", "purejaxrl", "fragc_no_trunc", "fragc_rolled",
                                                            "purejaxrl_straight"}
    assert len(row["ratios"]) == 1 and "purejaxrl/fragc_no_trunc" in row["other_ratio_medians"]


# slow, as it must be: 3 programs compiled, over the default suite's 6 minutes; the fragc calls it makes (compile,
# init, run) are test_ppo_single's and test_lowering's too
@pytest.mark.slow
def test_pqn_plain(bench, tiny_configs):
    result = json.loads((bench("pqn_plain", "--repeats", "1", "--iterations", "2", "--k", "2") / "pqn_plain.json")
                        .read_text())
    assert set(result["env_steps_per_s"]) == {"fragc", "plain_jit", "purejaxql"}


# slow, as it must be: 5 programs compiled, over the default suite's 6 minutes; the fragc calls it makes (compile,
# init, run) are test_ppo_single's and test_lowering's too
@pytest.mark.slow
def test_sac_plain(bench, tiny_configs):
    result = json.loads((bench("sac_plain", "--repeats", "1", "--iterations", "2", "--k", "2", "--buffer-size", "64")
                         / "sac_plain.json").read_text())
    assert set(result["env_steps_per_s"]) == {"fragc", "fragc_rolled", "plain_jit", "cleanrl", "cleanrl_unrolled"}


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow
def test_policies(bench, tiny_configs, tmp_path, capsys):
    """`fragc bench` of the single run and a population of it (a comma inside parentheses): the table, bench.json
    with every repeat's number, and bench.png; every policy the script names by default resolves (each is
    compiled by test_policies.py)."""
    policies = bench_module("policies").POLICIES
    assert [resolve(p, 8).name for p in policy_list(policies)] == policy_list(policies)
    with pytest.raises(SystemExit) as done:
        bench("policies", "--policies", "single,population(single,4)", "--devices", "8", "--iterations", "1",
              "--repeats", "2", "--num-envs", "16", "--num-steps", "16")
    assert done.value.code == 0
    table = capsys.readouterr().out
    assert "env-steps/s" in table and "population(single,4)" in table
    rows = json.loads((tmp_path / "bench.json").read_text())["policies"]
    assert list(rows) == ["single", "population(single,4)"]
    row = rows["population(single,4)"]
    assert len(row["env_steps_per_s"]) == 2 and row["min"] <= row["median"] <= row["max"] and row["devices"] == 1
    assert rows["single"]["transfer_bytes_per_iteration"] == 0
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow
def test_throughput(bench, tiny_configs, tmp_path):
    """The population row, shrunk to 4 members of 4 environments (256 of shared_programs' PPO would take the
    suite seconds to run)."""
    def shrunk(module):
        module.ROWS["ppo-cartpole-population-256"] = ("ppo", "single", {"num_envs": 4, "num_steps": 8}, 4)

    out = tmp_path / "throughput.json"
    bench("throughput", "--rows", "ppo-cartpole-population-256", "--iterations", "1", "--repeats", "1", "--out",
          str(out), out=False, before=shrunk)
    [row] = json.loads(out.read_text())
    assert row["population"] == 4 and row["env_steps_per_s"] > 0


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow (this one 16 s)
def test_host_envs(bench, tiny_configs):
    """Gymnasium's CartPole through the host loop (EnvPool's Pong is skipped by the script where EnvPool is not
    installed, and run where it is)."""
    rows = json.loads((bench("host_envs", "--envs", "gymnasium:CartPole-v1", "--num-envs", "2", "--num-steps", "4",
                             "--iterations", "1", "--repeats", "1", "--modes", "1") / "host_envs.json").read_text())
    assert [(r["env"], r["env_groups"]) for r in rows] == [("gymnasium:CartPole-v1", 1)] and rows[0]["train_ratio"]


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow
def test_host_loop_calls(bench):
    """The host loop's own time, at the smallest sizes."""
    row = json.loads((bench("host_loop_calls", "--groups", "2", "--num-envs", "4", "--num-steps", "4", "--calls", "2",
                            "--repeats", "1", "--iterations", "2") / "host_loop_calls.json").read_text())
    assert row["groups"] == 2 and 0 < row["rollout_call_ms"] and 0 < row["iteration_ms"]


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow
def test_auto(bench, monkeypatch, tmp_path):
    """The search against the exhaustive bench on 2 devices, for the toy regression."""
    monkeypatch.setenv("FRAGC_CACHE_DIR", str(tmp_path / "cache"))  # the machine constants of 2 devices: measured
    result = json.loads((bench("auto", "--algos", "regression", "--devices", "2", "--iterations", "2", "--repeats",
                               "1") / "auto.json").read_text())
    regression = result["algos"]["regression"]
    assert regression["runnable"] >= 2 and regression["chosen"] in regression["calibration"]


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow
def test_results(bench, tiny_configs):
    """A learning run of every seed as one population, its statistics (rliable) and its curves; summarised again
    from its saved curves (`--from-curves`), the same row."""
    out = bench("results", "--only", "ppo", "--seeds", "0-1", "--steps", "64")
    [row] = json.loads((out / "results.json").read_text())
    assert row["run"] == "ppo" and len(row["final_returns"]) == 2 and (out / "ppo.png").stat().st_size > 0
    (out / "results.json").unlink()
    assert json.loads((bench("results", "--only", "ppo", "--from-curves") / "results.json").read_text()) == [row]


# pbt slow, as it must be: 2 programs over the default suite's 6 minutes; PBT's populations are tests/test_sweep.py's
@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow
@pytest.mark.parametrize("what", ["throughput", "pbt"])
def test_sweep(bench, tiny_configs, what):
    argv = ["--members", "8", "--k", "1"] if what == "throughput" else ["--seeds", "1", "--iterations", "10"]
    result = json.loads((bench("sweep", what, "--repeats", "1", "--iterations", "1", *argv) / f"sweep_{what}.json")
                        .read_text())
    assert result["rows"] if what == "throughput" else result["pbt"]["final"]


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow
def test_rnn_screen(bench):
    """The screens' rule and report. The script's own options are parsed as `fragc sweep ppo_rnn`'s; its sweeps
    then run in this process (the script starts each in one of its own) on PPO at tiny sizes, two seeds each: a
    screen of one configuration, and the run it picks (the same program, one iteration a dispatch: compiled
    once). A recurrent PPO's population would cost the suite a compile of seconds for the same script lines."""
    def shrunk(module):
        def in_process(argv, timeout):
            argv = ["ppo" if a == "ppo_rnn" else a for a in argv[argv.index("sweep"):]]
            return subprocess.CompletedProcess(argv, main(argv))

        module.subprocess = types.SimpleNamespace(run=in_process, TimeoutExpired=subprocess.TimeoutExpired)
        module.SCREEN_SEEDS, module.TEN_SEEDS = "20-21", "0-1"
        module.BASE = ["--num-envs", "4", "--num-steps", "8", "--hidden", "16", "--update-epochs", "1",
                       "--num-minibatches", "2", "--iterations-per-dispatch", "1"]
        module.SCREENS = {"lr": ["--lr", "1e-3"]}

    from fragc.cli import main
    from fragc.cli.commands import parse

    screens = bench_module("rnn_screen")
    for options in screens.SCREENS.values():  # the script's own options are ppo_rnn's
        parse(["sweep", "ppo_rnn", *screens.BASE, *options, "--seeds", screens.SCREEN_SEEDS], "ppo_rnn")
    out = bench("rnn_screen", "--only", "lr", "--iterations", "1", before=shrunk)
    screen = json.loads((out / "screen.json").read_text())
    assert len(screen["screens"]) == 1 and screen["pick"]["screen"] == "lr" and len(screen["final"]) == 1
    assert screen["final"][0]["seeds"] == [0, 1]


@pytest.mark.slow  # must be: 17 programs compiled (about 40 s of the default suite's 6 minutes), for one-off scripts
@pytest.mark.parametrize("name, argv", [
    ("sac_learn_gpu", ["--seeds", "1"]),
    ("sac_plain_loops_gpu", ["--k", "2", "--iterations", "2", "--repeats", "1"]),
    ("sac_variants_gpu", ["--k", "2", "--iterations", "2", "--repeats", "1"]),
    ("sac_profile_gpu", ["--k", "2", "--iterations", "2"]),
    ("ppo_profile_gpu", ["--k", "2", "--iterations", "2"]),
    ("cpu_thunks", ["--members", "2", "--iterations", "1", "--sides", "fragc,purejaxrl_straight", "--top", "2"]),
    ("repeated_compiles", []),
    ("sort_lowering", ["--rows", "2", "--length", "8", "--repeats", "1", "--calls", "1"]),
])
def test_gpu_experiment_on_the_cpu(bench, monkeypatch, capsys, name, argv):
    """bench/experiments/: the GPU experiments behind docs/benchmarks.md, their CPU path at tiny sizes (the profile
    finds no GPU kernels here; SAC's whole run is TINY's 16 steps)."""
    shrink(monkeypatch, {**TINY, sac: {**TINY[sac], "total_steps": 16}})
    bench(f"experiments/{name}", *argv, out=name.endswith("_profile_gpu"))  # (repeated_compiles: no options)
    assert capsys.readouterr().out.strip()


def test_gpu_script_refuses_a_machine_without_a_gpu_and_an_unknown_stage(tmp_path):
    """bench/gpu.sh: a CPU table is never mistaken for a GPU one, and a misspelt stage is one line before anything
    runs (its stages themselves: the dry run, `DRY_RUN=1 bash bench/gpu.sh DIR`, checked by hand before a lease)."""
    env = {**os.environ, "PYTHON": sys.executable}
    no_gpu = subprocess.run(["bash", str(BENCH / "gpu.sh"), str(tmp_path / "a")], env=env, capture_output=True,
                            text=True, timeout=120)
    assert no_gpu.returncode == 1 and "no GPU visible to JAX" in no_gpu.stderr
    assert not (tmp_path / "a" / "gpu.tgz").exists()
    typo = subprocess.run(["bash", str(BENCH / "gpu.sh"), str(tmp_path / "b"), "throughput", "profil"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert typo.returncode == 2 and "unknown stage profil" in typo.stdout and not (tmp_path / "b").exists()


@pytest.mark.slow  # the default suite's 6 minutes: bench/ smoke tests over 10 s run with -m slow
@pytest.mark.skipif(importlib.util.find_spec("jaxmarl") is None, reason="jaxmarl is the optional extra fragc[marl]")
def test_jaxmarl_ippo_with_its_maths_side(bench):
    """The JaxMARL-style side against fragc's IPPO and fragc's IPPO with JaxMARL's maths (`--no-trunc`), timed."""
    result = json.loads((bench("jaxmarl_ippo", "--repeats", "1", "--iterations", "1", "--no-trunc")
                         / "jaxmarl_ippo.json").read_text())
    assert set(result["env_steps_per_s"]) == {"jaxmarl", "fragc", "fragc_no_trunc"}
    assert set(result["per_repeat_ratio_medians"]) == {"fragc", "fragc_no_trunc"}


@pytest.mark.parametrize("script", ["ppo_reference", "ippo_reference", "pqn_reference"])
def test_a_reference_bench_without_its_reference_says_so_and_runs_no_rewrite(script, tmp_path):
    """Where bench/references/build.py has not built the reference, each bench stops with one line naming the
    command that builds it; none substitutes a rewrite."""
    env = dict(os.environ, FRAGC_REFERENCES_BUILD=str(tmp_path))
    proc = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--repeats", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in said, said[-2000:]
    assert "not built" in said and "bench/references/build.py" in said, said[-2000:]
