"""Every algorithm under the policies whose semantics differ, 2 iterations on 8 simulated devices.

The full algorithm x policy matrix runs for the policies that exercise a
different meaning of the program: `anakin` (8 replicas and their
collectives), `actor_learner_async` (transfers, stages and a delay) and a
population (seeds vectorised over one program, one replica). `single`,
`gspmd` and `actor_learner` compute what the interpreter computes with one
replica or with replicas by role, as those three do; they are checked on PPO
in test_policies.py, and `actor_learner` on DQN here (a third role and glue
between stages). Stage and transfer counts of every algorithm under every
built-in policy are checked without compiling in test_schedule.py.

Synchronous policies match the reference interpreter with the same replica
counts; the asynchronous one matches the interpreter on its pipelined module;
a population member matches the interpreter from its seed.

The default suite runs each algorithm under at least one of these policies and each policy with at
least two algorithms, PPO's in test_policies.py (`DEFAULT`); the rest of the matrix is marked slow (`pytest -m slow`).
"""

import jax
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close
from shared_programs import ALGOS, small_algo, traced

ITERATIONS = 2

REPLICAS = {"anakin": 8, "actor_learner": {"actor": 4, "buffer": 4, "learner": 4, "evaluator": 4}}  # the evaluator: on the actors
DEFAULT = {"anakin": {"dqn"}, "actor_learner_async": {"a2c"}, "population": {"ppo_continuous"}}
"""The cells of the matrix in the default suite: with PPO under every policy in test_policies.py, every
algorithm runs under at least one policy, the buffer role (DQN) under replicas (under roles: test_dqn.py's
`test_buffer_beside_the_actors`). IMPALA under
the policy it is made for is this file's cell in test_impala.py (`test_impala_async_equals_its_pipelined_module`:
the same small IMPALA, the same program, 3 iterations against the pipelined module, and its staleness), so
its cell here runs with -m slow and the program compiles once in the default suite."""


def cells(policy, names, xla_defaults=()):
    """One cell per algorithm, in -m slow unless DEFAULT lists it; `xla_defaults`: the algorithms whose cell
    compares two programs bit for bit (`xla_defaults`, tests/conftest.py)."""
    return [pytest.param(name, marks=[*(() if name in DEFAULT[policy] else [pytest.mark.slow]),
                                      *([pytest.mark.xla_defaults(llvm_opt=True)] if name in xla_defaults else [])])
            for name in names]


SYNC = [pytest.param(name, "anakin", marks=() if name in DEFAULT["anakin"] else pytest.mark.slow)
        for name in sorted(ALGOS)] + [pytest.param(name, "actor_learner", marks=pytest.mark.slow)
                                      for name in ("dqn", "alphazero") if name in ALGOS]
"""DQN's buffer under roles in the default suite is test_dqn.py's `test_buffer_beside_the_actors` (a policy of the
user's, the buffer with the actors, against the interpreter); its actor_learner cell here runs with -m slow."""


def interpret_n(module, state, replicas, iterations=ITERATIONS):
    history = []
    for _ in range(iterations):
        state, metrics = fragc.interpret(module, state, replicas=replicas)
        history.append(metrics)
    return state, history


@pytest.mark.parametrize("algo_name,policy", SYNC)
def test_synchronous_policy_equals_interpreter(algo_name, policy):
    algo = small_algo(algo_name)
    prog = fragc.compile(algo, policy, devices=8)
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    module = traced(algo_name)
    roles = {f.role for f in module.fragments.values()}
    replicas = REPLICAS[policy] if isinstance(REPLICAS[policy], int) else {
        r: n for r, n in REPLICAS[policy].items() if r in roles}
    ref, ref_history = interpret_n(module, state, replicas)
    for i, metrics in enumerate(ref_history):
        np.testing.assert_allclose(history["episode_return"][i], metrics["episode_return"], rtol=1e-4, atol=1e-4)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name", cells("actor_learner_async", sorted(ALGOS)))
def test_async_policy_equals_pipelined_interpreter(name):
    algo = small_algo(name)
    prog = fragc.compile(algo, "actor_learner_async", devices=8)
    state = prog.init(0)
    out, _ = prog.run(state, ITERATIONS)
    ref, _ = fragc.run_iterations(prog.pipeline.after("insert_delays"), state, ITERATIONS)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


# the vmapped init of the population against jit(init) bit for bit: DQN's differs in the last bits unless XLA runs
# with its defaults whole (LLVM's optimisation on)
@pytest.mark.parametrize("name", cells("population", sorted(ALGOS), xla_defaults=("dqn",)))
def test_population_member_equals_interpreter_from_its_seed(name):
    algo = small_algo(name)
    prog = fragc.compile(algo, fragc.population("single", 2))
    start = prog.init(0)
    own = jax.jit(algo.init)(jax.random.key(1))
    assert_trees_close(jax.tree.map(lambda x: x[1], start), own, rtol=0, atol=0)
    out, _ = prog.run(start, ITERATIONS)
    one, _ = interpret_n(traced(name), own, 1)
    assert_trees_close(jax.tree.map(lambda x: x[1], out), one, rtol=2e-4, atol=2e-5)
