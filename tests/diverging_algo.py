"""A tiny algorithm that goes NaN at a chosen step, for the divergence tests; the command line
runs it as `fragc run tests/diverging_algo.py:Diverging --nan-at 4`."""

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

import fragc


@dataclasses.dataclass(frozen=True)
class Config:
    nan_at: int = -1
    """The step (0-based iteration) from which w is NaN; -1: never."""
    run_length: int = 12
    """Iterations of a run."""

    @property
    def iterations(self) -> int:
        return self.run_length


@struct.dataclass
class Walk:
    w: jax.Array  # [3]
    step: jax.Array


class Diverging:
    """w shrinks by 0.9 an iteration, and is NaN from step `nan_at` on; the `loss` metric is |w|^2
    of the iteration's incoming w, so a NaN shows in the metrics one iteration after it reaches
    the state, as a parameter's shows in the next loss."""

    Config = Config

    def __init__(self, config: Config = Config()):
        self.config = config

    def init(self, key):
        return Walk(jax.random.normal(key, (3,)), jnp.int32(0))

    @fragc.fragment(role="learner", in_axes=(None,), out_axes=(None, None))
    def learn(self, state):
        w = 0.9 * state.w
        if self.config.nan_at >= 0:
            w = jnp.where(state.step >= self.config.nan_at, jnp.nan, w)
        return Walk(w, state.step + 1), {"loss": jnp.sum(state.w**2)}

    def iteration(self, state):
        return self.learn(state)
