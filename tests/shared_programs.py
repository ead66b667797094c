"""Small algorithms, their traced modules, and compiled PPO programs, shared by the test files.

Compiling is most of what a policy test costs, and tracing most of what a
passes-only test costs; every file takes them from here, so each is made once
per test session (PPO programs are run once from seed 0).
"""

import functools
import importlib.util

import pytest

import fragc
from fragc.algos import a2c, dqn, impala, ppo, ppo_continuous

ALGOS = {
    "ppo": lambda: ppo.PPO(ppo.Config(num_envs=8, num_steps=8, num_minibatches=2, update_epochs=1)),
    "a2c": lambda: a2c.A2C(a2c.Config(num_envs=8, num_steps=8)),
    "dqn": lambda: dqn.DQN(dqn.Config(num_envs=8, num_steps=2, buffer_size=64, batch_size=16, learning_starts=0)),
    "impala": lambda: impala.IMPALA(impala.Config(num_envs=8, num_steps=8)),
    "ppo_continuous": lambda: ppo_continuous.PPOContinuous(
        ppo_continuous.Config(num_envs=8, num_steps=8, num_minibatches=2, update_epochs=1)),
}
"""Every algorithm, small enough for 2-iteration tests on 8 devices."""

if importlib.util.find_spec("jaxmarl") is not None:  # the optional extra fragc[marl]
    from fragc.algos import ippo, ippo_rnn, mappo, mappo_rnn

    ALGOS["ippo"] = lambda: ippo.IPPO(ippo.Config(num_envs=8, num_steps=4, num_minibatches=2, update_epochs=1,
                                                  hidden=16, shared_params=False))
    ALGOS["mappo"] = lambda: mappo.MAPPO(mappo.Config(env="jaxmarl:SMAX_3m", num_envs=8, num_steps=4,
                                                      num_minibatches=2, update_epochs=1, hidden=16))
    ALGOS["ippo_rnn"] = lambda: ippo_rnn.IPPORNN(ippo_rnn.Config(num_envs=16, num_steps=4, num_minibatches=2,
                                                                 update_epochs=1, hidden=8))
    ALGOS["mappo_rnn"] = lambda: mappo_rnn.MAPPORNN(mappo_rnn.Config(env="jaxmarl:SMAX_3m", num_envs=16, num_steps=4,
                                                                     num_minibatches=2, update_epochs=1, hidden=8))

if importlib.util.find_spec("pgx") is not None:  # the optional extra fragc[search]
    from fragc.algos import alphazero

    ALGOS["alphazero"] = lambda: alphazero.AlphaZero(alphazero.Config(
        env="pgx:tic_tac_toe", num_envs=8, num_steps=4, num_simulations=2, batch_size=16, channels=4, blocks=1,
        eval_games=8))

if importlib.util.find_spec("mctx") is not None:  # the optional extra fragc[search]
    from fragc.algos import muzero

    ALGOS["muzero"] = lambda: muzero.MuZero(muzero.Config(num_envs=8, num_steps=4, num_simulations=2, unroll_steps=2,
                                                          num_minibatches=2, hidden=16, embedding=8, support=3))

MARL = frozenset({"ippo", "mappo", "ippo_rnn", "mappo_rnn"})
SLOW_TO_TRACE = MARL | {"alphazero", "muzero"}
"""The multi-agent algorithms, AlphaZero and MuZero (mctx's search): their cells of the passes-only tables (test_parser.py,
test_schedule.py) run in -m slow, where tracing them would add seconds to the default suite; test_marl.py and
test_alphazero.py check their IR in the default suite."""


def algo_params():
    """`ALGOS`' names as pytest params, those slow to trace marked slow."""
    return [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_TO_TRACE else name for name in sorted(ALGOS)]


@functools.cache
def small_algo(name: str):
    return ALGOS[name]()


@functools.cache
def traced(name: str) -> fragc.Module:
    return fragc.trace(small_algo(name))

ITERATIONS = 3


@functools.cache
def ppo_algo() -> ppo.PPO:
    return ppo.PPO(ppo.Config(num_envs=16, num_steps=16, num_minibatches=2, update_epochs=2))


@functools.cache
def ppo_program(policy, devices: int = 8) -> fragc.Program:
    return fragc.compile(ppo_algo(), policy, devices=devices)


@functools.cache
def ppo_run(policy, devices: int = 8, seed: int = 0):
    """(program, initial state, final state, history) of ITERATIONS iterations from `seed`."""
    prog = ppo_program(policy, devices)
    state = prog.init(seed)
    out, history = prog.run(state, ITERATIONS)
    return prog, state, out, history
