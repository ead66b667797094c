"""`policy="auto"`: the placement search's pruning rules, its cache, and that its choice changes only speed.

Fast by design: a toy algorithm, a handful of candidates, the model's machine constants given (no
micro-benchmarks), at most two small programs compiled per test."""

import dataclasses

import jax
import numpy as np
import pytest

import fragc
from fragc import search
from fragc.options import CompileOptions, SearchOptions
from fragc.runtime.cost import Machine
from fragc.search import Candidate
from fragc.search import choose

from toy_algos import Regression

MACHINE = Machine(flops_per_s=1e10, bytes_per_s=1e10, speedup={"1": 1.0}, trip_s={"1": 1e-7}, collective_s={},
                  dispatch_s=1e-4, call_s=1e-5, collective_bytes_per_s=1e9, transfer_bytes_per_s=1e9,
                  host_call_s=1e-4)


def searched(algo, **options):
    """The search on 8 devices with the machine constants above (no micro-benchmarks)."""
    return search.search(algo, CompileOptions("auto", 8, search=SearchOptions(**{"machine": MACHINE, **options})))


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test's decisions in its own folder (JAX's compilation cache is configured already, and stays)."""
    monkeypatch.setenv("FRAGC_CACHE_DIR", str(tmp_path))


def test_a_candidate_whose_replicas_do_not_divide_is_pruned_with_the_reason():
    rows, _ = search.rank(Regression(num_envs=8), jax.devices()[:8],
                        [Candidate("anakin", 4), Candidate("actor_learner(actors=3)", 4)], machine=MACHINE)
    anakin, split = rows
    assert not anakin.pruned and anakin.predicted_s > 0
    assert "3 replicas do not divide" in split.pruned or "5 replicas do not divide" in split.pruned
    assert split.predicted_s is None


def test_a_candidate_over_the_memory_limit_is_pruned():
    algo = Regression(num_envs=4096)  # ~80 KiB of per-environment state: 10 KiB a device under anakin
    rows, _ = search.rank(algo, jax.devices()[:8], [Candidate("single", 4), Candidate("anakin", 4)],
                        memory_limit=40_000, machine=MACHINE)
    single, anakin = rows
    assert "over the limit" in single.pruned and single.memory_bytes > 40_000
    assert not anakin.pruned and anakin.memory_bytes < 40_000


def test_nothing_fits_is_one_line():
    with pytest.raises(fragc.FragcError, match="no candidate can run"):
        searched(Regression(num_envs=4096), candidates=[Candidate("single", 4)], memory_limit=1000)


def test_the_choice_is_cached_and_a_changed_config_searches_again():
    space = [Candidate("single", 4), Candidate("single", 8)]
    before = (search.COUNTERS.compiled, search.COUNTERS.timed)
    prog = searched(Regression(num_envs=8), candidates=space, repeats=1, timed_iterations=8)
    assert search.COUNTERS.compiled == before[0] + 1 and search.COUNTERS.timed > before[1]  # one k per placement
    assert not prog.auto.cached and prog.auto.chosen in space
    assert "// auto: chose single k=" in prog.ir().splitlines()[1]
    assert "pruned" in prog.auto.table() or "not timed" in prog.auto.table()

    after = (search.COUNTERS.compiled, search.COUNTERS.timed)
    again = searched(Regression(num_envs=8), candidates=space, repeats=1, timed_iterations=8)
    assert (search.COUNTERS.compiled, search.COUNTERS.timed) == after  # nothing compiled for the search, nothing timed
    assert again.auto.cached and again.auto.chosen == prog.auto.chosen and again.k == prog.k

    searched(Regression(num_envs=8, lr=0.05), candidates=space, repeats=1, timed_iterations=8)
    assert search.COUNTERS.timed > after[1]  # another configuration: searched again


def test_the_choice_computes_what_the_same_policy_compiled_by_hand_does(monkeypatch):
    monkeypatch.setattr(choose, "machine_constants", lambda *a, **k: MACHINE)  # no micro-benchmarks here
    algo = Regression(num_envs=8)
    prog = fragc.compile(algo, "auto", devices=8, auto_candidates=[Candidate("anakin", 2)], auto_cache=False)
    assert prog.auto.chosen == Candidate("anakin", 2)
    by_hand = fragc.compile(Regression(num_envs=8), "anakin", devices=8, iterations_per_dispatch=2)
    state, history = prog.run(prog.init(0), 3)
    state2, history2 = by_hand.run(by_hand.init(0), 3)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(state2)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(history["loss"], history2["loss"])


def test_the_default_space():
    space = search.default_candidates(8, hosted=True, iterations=10)
    labels = {c.label for c in space}
    assert {"single k=4 G=1", "anakin k=10 G=2", "actor_learner(actors=2) k=4 G=1",
            "actor_learner_async(actors=6) k=10 G=2", "gspmd k=4 G=1"} <= labels
    assert all(c.k <= 10 for c in space)
    assert {c.seeds for c in search.default_candidates(4, seeds=3)} == {3}


@pytest.mark.parametrize("bad, match", [({"budget": 0}, "budget"), ({"top": 0}, "top"),
                                        ({"memory_limit": -1}, "memory_limit"), ({"candidates": []}, "empty")])
def test_bad_arguments_are_one_line(bad, match):
    with pytest.raises(fragc.FragcError, match=match):
        searched(Regression(num_envs=8), **bad)


def test_the_model_charges_a_staged_schedule_its_stage_launches_and_leaf_transfers():
    machine = dataclasses.replace(MACHINE, stage_call_s={"4": 1e-3}, stage_leaf_s={"4": 1e-5},
                                  put_leaf_s={"4": 1e-4}, dispatch_leaf_s=1e-5, dispatch_metric_s=1e-4)
    rows, _ = search.rank(Regression(num_envs=8), jax.devices()[:8],
                        [Candidate("actor_learner(actors=4)", 4), Candidate("anakin", 4), Candidate("anakin", 8)],
                        machine=machine)
    staged, fused, fused8 = rows
    assert staged.terms["stages"] >= 2 * 1e-3  # two stages, each a launch (and its leaves)
    assert staged.terms["transfers"] >= 2 * 1e-4  # at least a leaf each way
    assert fused.terms["stages"] == 0 and fused.terms["transfers"] < 1e-4
    # the dispatch term: a base, the state's leaves and the metrics, once per k iterations
    assert fused.terms["dispatch"] > 1e-4 / 4 + 1e-4 / 4  # base + at least one metric
    assert fused8.terms["dispatch"] == pytest.approx(fused.terms["dispatch"] / 2)


def test_timing_stops_once_the_choice_is_settled():
    assert search.decided({1: [1.0, 1.02], 2: [1.2, 1.3]}, 0.1)
    assert not search.decided({1: [1.0, 1.05], 2: [1.1, 1.3]}, 0.1)
    assert search.decided({1: [1.0]}, 0.1)
