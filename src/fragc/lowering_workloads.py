"""What decides fragc's CPU lowering rules (src/fragc/runtime/cpu_lowering.py): the threefry rule by a whole training iteration.

The straight threefry is several times faster than JAX's rolled loop in a micro-program, yet in a whole program it
changes how XLA's CPU runtime spreads the program's thunks over its threads: on a 2-core Xeon it made PPO's
iteration hand its work between the two threads, 1.6x the CPU time and slower in wall time, where on one core it is
14% faster (docs/benchmarks.md). So the rule is decided on the program it is for: PPO's iteration on CartPole-v1
(PureJaxRL's configuration), compiled with the rule and without, and timed alternately, once per processor.
"""

from __future__ import annotations

import sys
from typing import Callable

from fragc.compiler import build
from fragc.options import CompileOptions
from fragc.runtime import cpu_lowering, cpu_threads

ITERATIONS = 32
"""Iterations a timed round runs (about 0.1 s of CartPole PPO on a 2.5 GHz core)."""


def ppo_iterations() -> Callable[[], None]:
    """PPO's iteration, compiled by `fragc.compile` under the rules chosen now; -> run `ITERATIONS` of it."""
    import jax

    from fragc.algos import ppo

    prog = build(ppo.PPO(ppo.Config()), CompileOptions(policy="single", devices=1, iterations_per_dispatch=ITERATIONS))
    state = [prog.init(0)]

    def run() -> None:
        state[0] = jax.block_until_ready(prog.run(state[0], ITERATIONS)[0])

    return run


CHILD = [sys.executable, "-m", "fragc.lowering_workloads"]
"""A child that `cpu_threads.measure` times XLA's CPU threads with: PPO's iteration, under its own threads and the
lowering rules chosen for them."""


def register() -> None:
    cpu_lowering.WORKLOADS["threefry"] = ppo_iterations


if __name__ == "__main__":
    register()
    cpu_threads.serve(ppo_iterations())
