"""Every test runs on 8 simulated CPU devices, set before JAX's backend starts."""

import functools
import gc
import os
import subprocess
import sys

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite compiles hundreds of small programs and runs each a few iterations, so compile time dominates. Three XLA
# flags halve it, each changing how XLA compiles, not what a program computes (no fast-math: each operation's
# result is IEEE's): LLVM's optimisation off (tests/test_sweep.py and test_program.py compiled in 64 s against 94 s),
# XLA's older CPU emitters (three programs in 5.5 s against 13.3 s; docs/benchmarks.md), and each program's machine
# code made in one piece, not split to be compiled by several threads, which two busy workers on 2 cores do not have
# (41 compiles of six programs, alternated: 16.6-17.0 s against 18.4-22.6 s; it moves the last bits of three of the
# six programs' states, as the emitters do). Inherited by the `fragc`
# subprocesses; benchmarks and users keep XLA's defaults.
# The flags change how operations are fused and vectorised, so two *different* programs that XLA's defaults make
# bit-equal (a sweep member and its single run, a host step and a device step, collective and device_put transfers) can differ
# in their last bits under them: those tests are marked `xla_defaults` and run in a process of their own with XLA's
# default emitters and LLVM's optimisation off, or with XLA's defaults whole, `xla_defaults(llvm_opt=True)`, where
# LLVM's optimisation matters to the bits too (DQN's population init). Every marked test is in -m slow: a child
# process compiles its programs again (20-40 s of the default suite's 2 cores each), so the default suite checks
# the same programs in its own process to float rounding.
OPT0 = "--xla_backend_optimization_level=0"
os.environ.setdefault("XLA_FLAGS", OPT0 + " --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1")
# JAX's own CPU lowering of threefry (a loop of 5 trips a draw), not fragc's straight one: the same bits, smaller
# programs, 6% less compile time in test_policies.py and test_sac.py (alternated, 2 pairs); tests/test_cpu_lowering.py
# checks the straight lowering itself. Inherited by the `fragc` subprocesses, as XLA_FLAGS is.
os.environ.setdefault("FRAGC_THREEFRY", "rolled")
# The packed sort decided, not measured per processor (src/fragc/runtime/cpu_lowering.py): the suite's programs are the same
# on every machine, and tests/test_cpu_lowering.py checks the measuring itself.
os.environ.setdefault("FRAGC_SORT", "packed")
# XLA's CPU threads decided, not measured (src/fragc/runtime/cpu_threads.py): the `fragc` subprocesses of one CPU
# device would otherwise time them on a fresh machine. tests/test_cpu_threads.py checks the choosing itself.
os.environ.setdefault("FRAGC_CPU_THREADS", "xla")
IN_A_CHILD = "FRAGC_TEST_XLA_DEFAULTS"
"""Set in the process that runs one marked test (it runs the test itself)."""
_MADE_CACHE_DIR = None
"""The session's compilation cache folder, when this process made it (the xdist controller, or a run with -n 0):
it removes the folder at the end. Workers and `fragc` subprocesses inherit it through FRAGC_CACHE_DIR."""
if "FRAGC_CACHE_DIR" not in os.environ:  # keep `fragc run`'s compilation cache out of the user's folder
    import tempfile

    os.environ["FRAGC_CACHE_DIR"] = _MADE_CACHE_DIR = tempfile.mkdtemp(prefix="fragc-test-cache-")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
# Every worker and every `fragc` subprocess compiles through one persistent cache (what `fragc run` sets up for
# a user): the suite compiles many programs more than once (the same small algorithm under several tests).
from fragc.runtime.reporting import enable_compilation_cache  # noqa: E402

enable_compilation_cache(os.environ["FRAGC_CACHE_DIR"])
# Tracing makes many short-lived objects, and Python's cyclic collector ran about 2,100 times in 98 s of three test
# files, taking 7.5 s of them. The modules' objects are frozen (the collector no longer scans them) and it runs
# every 20,000 new objects instead of 700: 2.4 s, the process's peak memory 907 MiB against 873 (2026-11-26).
gc.freeze()
gc.set_threshold(20_000, 10, 10)

LONGEST_FIRST = ["test_checkpoint.py", "test_algorithms_x_policies.py", "test_bench.py", "test_distributed.py", "test_tutorials.py",
                 "test_inference.py",
                 "test_policies.py", "test_sweep.py", "test_ppo_rnn.py", "test_host_loop.py", "test_dqn.py",
                 "test_host_envs.py", "test_semantics.py", "test_ppo_continuous.py", "test_reporting.py", "test_user_algo.py",
                 "test_impala.py", "test_policy_api.py", "test_program.py", "test_video.py", "test_muzero.py",
                 "test_device_suites.py"]
"""The test files that take longest (15 to 80 s each, run alone), about longest first; every other file after them.
pytest-xdist (addopts: `--dist loadfile --no-loadscope-reorder`) hands whole files to its 2 workers in this
order, so the long ones start first and the short ones fill the gaps at the end. The two files of subprocesses
(checkpoint, distributed) are not the first two, so that they do not start together on the 2 cores. An order led
by the longest files of 2026-11-26's durations (test_sweep, test_ppo_rnn, test_checkpoint, test_envs, ...), with
four new tests, took 610 s against 515 s for the tree before it with this order (clean clones, back to back, one run
each), so the first four stay; test_sweep and test_ppo_rnn (50-70 s each) come next, where before them collection
order put test_sweep among the last five files."""


def pytest_sessionfinish(session, exitstatus):
    if _MADE_CACHE_DIR is not None and not hasattr(session.config, "workerinput"):  # not an xdist worker
        import shutil

        shutil.rmtree(_MADE_CACHE_DIR, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """An xdist worker ends here, without Python's shutdown. That shutdown collected the worker's garbage and freed
    every program it had compiled: 10 s or more after a whole suite, for nothing, while the controller waited
    (up to 10 s, then killed the worker). By now the worker has sent its results and its "workerfinished" event,
    after which xdist takes the end of the worker's channel as a normal one. (A plugin that writes when the
    process exits, as coverage does, would lose that: the suite uses none.)"""
    if hasattr(config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests keep their order
    if IN_A_CHILD not in os.environ:
        for item in items:
            if item.get_closest_marker("xla_defaults"):
                item.setup = lambda: None  # its fixtures are the child's
                item.runtest = functools.partial(_run_in_a_child, item)


def _run_in_a_child(item):
    """A test marked `xla_defaults`, run by pytest in a process of its own with XLA's default emitters (XLA_FLAGS
    is read once per process); its output where it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    flags = "" if item.get_closest_marker("xla_defaults").kwargs.get("llvm_opt") else OPT0
    env.update({"XLA_FLAGS": flags, IN_A_CHILD: "1"})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           item.nodeid], cwd=item.config.rootpath, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"in a process with XLA_FLAGS={flags!r}:\n{proc.stdout[-8000:]}{proc.stderr[-2000:]}",
                    pytrace=False)
    summary = (proc.stdout.strip().splitlines() or [""])[-1]
    if "passed" not in summary:  # skipped there: not a pass here
        pytest.skip(f"in a process with XLA_FLAGS={flags!r}: {summary}")


@pytest.fixture(scope="module")
def commands_compile_each_configuration_once():
    """`fragc run` and `fragc sweep` called in this process (`fragc.cli.main`), and `fragc.compile`, compile each
    configuration (the algorithm's class and config, the compile options) once in the module and reuse that
    program after: a file's tests stop, resume and damage runs of one configuration, and each call traced, lowered
    and read XLA's cache again (about 1 s). The tests check what the commands do with a program, and a command
    given the configuration of a program the module compiled in Python gets that program (the dict this yields
    shows what was compiled). A test that patches `compile_with` itself (refused before compiling) patches over
    this; `--policy auto` compiles as ever."""
    import dataclasses

    from fragc import api
    from fragc.cli import algorithm, sweep
    from fragc.options import SearchOptions, search_seeds

    programs = {}

    def once(compile_with):
        def compile_once(algo, options):
            config = getattr(algo, "config", None)
            if not dataclasses.is_dataclass(config) or search_seeds(options.policy) is not None:
                return compile_with(algo, options)
            key = (type(algo), repr(config), repr(dataclasses.replace(options, search=SearchOptions(), printer=print)))
            if key not in programs:
                programs[key] = compile_with(algo, options)
            return programs[key]

        return compile_once

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(algorithm, "compile_with", once(algorithm.compile_with))
        patch.setattr(sweep, "compile_with", once(sweep.compile_with))
        patch.setattr(api, "compile_with", once(api.compile_with))
        yield programs


def as_numbers(tree):
    """Leaves as float64 numpy arrays (typed PRNG keys through their key data)."""
    def conv(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x, dtype=np.float64)

    return jax.tree.map(conv, tree)


def assert_trees_close(a, b, rtol=1e-5, atol=1e-5):
    """Same structure, shapes and values (PRNG keys compared through their key data)."""
    import chex

    a, b = as_numbers(a), as_numbers(b)
    chex.assert_trees_all_equal_structs(a, b)
    chex.assert_trees_all_equal_shapes(a, b)
    chex.assert_trees_all_close(a, b, rtol=rtol, atol=atol)


@pytest.fixture(scope="session")
def ppo_algo():
    from fragc.algos import ppo

    return ppo.PPO(ppo.Config(num_envs=8, num_steps=16))


def traced_module(prog):
    """The module `prog` was compiled from, as `fragc.trace` made it (before any pass): the reference interpreter's
    input, without tracing the algorithm again. Its fragments keep the bodies that lowering traced at the policy's
    replica counts (`FragmentDef.body_for`), so the interpreter does not trace those again either (a recurrent
    PPO on 8 replicas: 6 s of a 20 s test)."""
    return prog.pipeline.modules[0]


def train_returns(algo, policy="single", devices=None, iterations_per_dispatch=32):
    """The per-iteration mean episode return of a full run of `algo`."""
    import fragc

    prog = fragc.compile(algo, policy, devices=devices, iterations_per_dispatch=iterations_per_dispatch)
    _, history = prog.run(prog.init(0), algo.config.iterations)
    return history["episode_return"]


def assert_return_rises(returns, early=slice(0, 10), late=slice(-10, None)):
    """Well above a random CartPole policy (about 20 steps) and at least twice the start."""
    start, end = returns[early].mean(), returns[late].mean()
    assert start < 40 and end > 2 * start and end > 60, (start, end)
