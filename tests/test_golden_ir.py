"""Printed IR against golden text (passes only, no XLA). To update after a deliberate change:
FRAGC_UPDATE_GOLDEN=1 pytest tests/test_golden_ir.py, then review the diff."""

import os
import pathlib

import pytest

import fragc
from fragc.algos import dqn, ppo
from fragc.ir import format_module, to_dot
from fragc.passes import default_passes, pass_name, resolve, run_pipeline
from toy_algos import Regression

GOLDEN = pathlib.Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FRAGC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with FRAGC_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def final_module(algo, policy, devices):
    return run_pipeline(fragc.trace(algo), default_passes(resolve(policy, devices), 16)).final


def test_regression_ir_after_each_pass_that_changes_it():
    """One golden per pass whose module prints differently from the one before it (header aside)."""
    modules = run_pipeline(fragc.trace(Regression()), default_passes(resolve("single", 1), 16)).modules
    previous = None
    for module in modules:
        text = str(module)
        body = text.split("\n", 1)[1]
        name = f"regression_{pass_name(module) if module.label != '001_trace' else 'trace'}.fir"
        if body != previous:
            check_golden(name, text)
        else:
            assert not (GOLDEN / name).exists(), f"{name} only differs from the module before it in its header"
        previous = body


def test_ppo_traced_ir():
    check_golden("ppo_trace.fir", str(fragc.trace(ppo.PPO())))


def test_ppo_actor_learner_async_ir():
    """A delay, transfers and two stages."""
    algo = ppo.PPO(ppo.Config(num_envs=8, num_steps=16))
    check_golden("ppo_actor_learner_async.fir", str(final_module(algo, "actor_learner_async", 8)))


def test_dqn_actor_learner_ir():
    """Glue placed by the leaves it reads: two stages, three transfers."""
    algo = dqn.DQN(dqn.Config(num_envs=8))
    check_golden("dqn_actor_learner.fir", str(final_module(algo, "actor_learner", 8)))


def test_regression_dot():
    check_golden("regression.dot", to_dot(fragc.trace(Regression())))


def test_bodies_are_printed_on_request_at_per_replica_shapes():
    traced = format_module(fragc.trace(Regression()), bodies=True)
    assert "psum[" in traced  # the pmean inside @learn, one replica (src/fragc/ir/collectives.py)
    assert "random_split" in traced
    assert "{ lambda ; a:f32[3] b:f32[8,3] c:f32[8]. let" in traced  # @learn(w, x, y) at global shapes
    placed = format_module(final_module(Regression(), "anakin", 8), bodies=True)
    assert "{ lambda ; a:f32[3] b:f32[1,3] c:f32[1]. let" in placed  # 8 environments, one per replica
