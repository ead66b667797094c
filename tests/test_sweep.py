"""Populations over hyperparameters (ir/sweep.py): each member is the single run of its configuration and seed,
the values are printed in the IR and refused in one line when they cannot be swept."""

import dataclasses
import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fragc
from conftest import as_numbers, assert_trees_close
from fragc.algos import ppo
from fragc.ir.parser import parse
from fragc.runtime.fused import population_devices

ITERATIONS = 2
LRS, ENTS, SEEDS = (1e-3, 3e-4), (0.0, 0.01), (0, 1)
TINY = dict(num_envs=4, num_steps=8, total_steps=4 * 8 * ITERATIONS, update_epochs=1, num_minibatches=2, hidden=16)


def tiny(**overrides) -> ppo.PPO:
    return ppo.PPO(ppo.Config(**{**TINY, **overrides}))


@functools.cache
def single_program(lr: float, ent_coef: float) -> fragc.Program:
    return fragc.compile(tiny(lr=lr, ent_coef=ent_coef), "single", iterations_per_dispatch=2)


@functools.cache
def single_run(lr: float, ent_coef: float, seed: int):
    """The reference: `fragc run ppo --lr LR --ent-coef E --seed S`, a program of its own."""
    prog = single_program(lr, ent_coef)
    return prog.run(prog.init(seed), ITERATIONS)


def grid_members():
    return list(itertools.product(LRS, ENTS, SEEDS))  # configuration-major, seeds adjacent


@pytest.mark.parametrize("devices", [1, 4])
def test_each_member_of_a_2x2x2_sweep_is_its_single_run_bit_for_bit(devices):
    prog = fragc.compile(tiny(), fragc.population("single", list(SEEDS), lr=list(LRS), ent_coef=list(ENTS), exact=True),
                         devices=devices, iterations_per_dispatch=2)
    state, history = prog.run(prog.init(0), ITERATIONS)
    assert "population loop seeds=[0, 1, 0, 1, 0, 1, 0, 1]" in prog.ir()
    assert state.hyper["lr"].sharding.mesh.devices.size == devices  # members spread over the devices given
    chex.assert_trees_all_equal(state.hyper, {"lr": np.repeat(np.float32(LRS), 4),
                                              "ent_coef": np.tile(np.repeat(np.float32(ENTS), 2), 2)})
    for m, (lr, ent, seed) in enumerate(grid_members()):
        want, want_history = single_run(lr, ent, seed)
        chex.assert_trees_all_equal(as_numbers(jax.tree.map(lambda x: x[m], state.state)), as_numbers(want))
        chex.assert_trees_all_equal({k: v[m] for k, v in history.items()}, want_history)
    # the grid reaches the maths: members that differ only in lr (or only in ent_coef) differ
    params = as_numbers(state.state.learner.params)
    assert not jax.tree.all(jax.tree.map(lambda p: np.array_equal(p[0], p[4]), params))
    assert not jax.tree.all(jax.tree.map(lambda p: np.array_equal(p[0], p[2]), params))


def test_vectorised_members_on_8_devices_are_their_single_runs_to_float_rounding_and_the_ir_shows_them():
    """vmap (the default) sums over a batched axis in another order than the single run: last bits only."""
    prog = fragc.compile(tiny(), fragc.population("single", list(SEEDS), lr=list(LRS), ent_coef=list(ENTS)),
                         devices=8, iterations_per_dispatch=2)
    assert ("population seeds=[0, 1, 0, 1, 0, 1, 0, 1] lr=[0.001, 0.001, 0.001, 0.001, 0.0003, 0.0003, 0.0003, "
            "0.0003] ent_coef=[0.0, 0.0, 0.01, 0.01, 0.0, 0.0, 0.01, 0.01]") in prog.ir()
    assert "%hyperparameters: " in prog.ir()  # every fragment takes the member's values as an argument
    back = parse(prog.ir())
    assert back.hyperparameters == prog.module.hyperparameters and not back.member_loop
    state, _ = prog.run(prog.init(0), ITERATIONS)
    assert state.hyper["lr"].sharding.mesh.devices.size == 8
    for m, (lr, ent, seed) in enumerate(grid_members()):
        assert_trees_close(jax.tree.map(lambda x: x[m], state.state), single_run(lr, ent, seed)[0], rtol=1e-4,
                           atol=1e-6)


def test_members_spread_over_the_most_devices_they_divide_over():
    assert [population_devices(m, 8) for m in (1, 2, 3, 6, 8, 12, 16, 64)] == [1, 2, 3, 6, 8, 6, 8, 8]
    assert population_devices(8, 4) == 4 and population_devices(7, 4) == 1


@pytest.mark.parametrize("grid, message", [
    ({"lrr": [1e-3]}, r"^sweep: PPO's config has no field 'lrr' \(did you mean 'lr'\?\)$"),
    ({"activation": ["relu"]}, r"population: activation must be a number or a list of numbers"),
    ({"anneal_lr": [0, 1]}, r"^sweep: PPO's 'anneal_lr' is bool, not a number"),
    ({"lr": [-1.0]}, r"^sweep: lr=-1.0: ppo: lr must be"),
    ({"update_epochs": [1.5]}, r"^sweep: PPO's 'update_epochs' is a whole number, got 1.5$"),
    ({"num_envs": [4, 8]}, r"^sweep: PPO uses 'num_envs' as a Python value \(a shape, a loop count or an `if`\), so "
                           r"members cannot share one program"),
    ({"lr": [1e-3], "num_minibatches": [2, 4]}, r"^sweep: PPO uses 'num_minibatches' as a Python value"),
])
def test_what_cannot_be_swept_is_refused_in_one_line(grid, message):
    with pytest.raises(fragc.FragcError, match=message):
        fragc.compile(tiny(), fragc.population("single", 1, **grid))


class CachedOptimizer(ppo.PPO):
    """A user's PPO that builds its optimizer once, in __init__: sweeping lr would change nothing."""

    def __init__(self, config):
        super().__init__(config)
        self._tx = optax.adam(config.lr)

    @property
    def optimizer(self):
        return self._tx


def test_a_field_copied_at_construction_is_refused_naming_it():
    with pytest.raises(fragc.FragcError, match=r"^sweep: CachedOptimizer never reads config.lr while tracing its iteration: it "
                                               r"was copied when the algorithm was built"):
        fragc.compile(CachedOptimizer(ppo.Config(**TINY)), fragc.population("single", 1, lr=[1e-3, 3e-4]))


def test_a_population_of_several_device_groups_is_refused_in_one_line():
    with pytest.raises(fragc.FragcError, match=r"^population\(actor_learner,\.\.\.\): a population vectorises one "
                                               r"program over its members"):
        fragc.compile(tiny(), fragc.population("actor_learner", 2, lr=[1e-3]), devices=2)
