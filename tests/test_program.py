"""The compiled single-device program against the reference interpreter.

Programs are shared: PPO's with test_policies.py (tests/shared_programs.py), Regression's
within this file (one per dispatch size).
"""

import functools
import threading

import jax
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close, traced_module
from shared_programs import ITERATIONS, ppo_run
from toy_algos import Regression
import user_shapes


@functools.cache
def regression_program(k=16):
    return fragc.compile(Regression(), "single", iterations_per_dispatch=k)


def test_compiled_single_equals_interpreter_over_three_iterations():
    prog, state, got, history = ppo_run("single", 1)
    module = traced_module(prog)
    ref = state
    for i in range(ITERATIONS):
        ref, metrics = fragc.interpret(module, ref)
        for name, value in metrics.items():
            np.testing.assert_allclose(history[name][i], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert_trees_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k,iterations", [(1, 3), (4, 3), (4, 9)])
def test_any_run_length_with_any_dispatch_size(k, iterations):
    algo = Regression()
    prog = regression_program(k)
    state = prog.init(0)
    got, history = prog.run(state, iterations)
    assert history["loss"].shape == (iterations,)
    assert int(got.step) == iterations
    ref = state
    for _ in range(iterations):
        ref, _ = jax.jit(algo.iteration)(ref)
    assert_trees_close(got, ref, rtol=1e-5, atol=1e-6)


def test_run_keeps_the_callers_state_and_reports_progress():
    prog = regression_program(2)
    state = prog.init(0)
    seen = []
    prog.run(state, 5, callback=lambda done, metrics: seen.append((done, len(metrics["loss"]))))
    assert seen == [(2, 2), (4, 2), (5, 1)]
    assert not state.w.is_deleted()


def test_ir_after_named_passes_and_stage_names():
    prog = regression_program()
    assert prog.ir(after="trace").startswith("// fragc.ir · regression · after 001_trace\n")
    assert "after 003_place{policy=single}" in prog.ir(after="place")
    assert "on @main shard_map replicas=1" in prog.ir()
    with pytest.raises(fragc.FragcError, match="no pass named 'plac'"):
        prog.ir(after="plac")


def test_hlo_and_cost():
    prog = regression_program()
    assert prog.stages == ["main"] and prog.executables == ["iteration"]  # fused: one executable runs the stage
    assert prog.hlo("main") == prog.hlo("iteration")
    assert "stablehlo" in prog.hlo("iteration")
    assert prog.hlo("iteration", optimized=True).startswith("HloModule")
    cost = prog.cost()["iteration"]
    assert cost["flops"] > 0 and cost["bytes"] > 0


def test_print_after_all_and_dump_dir(tmp_path):
    printed = []
    fragc.compile(Regression(), "single", print_after_all=True, dump_dir=str(tmp_path), printer=printed.append)
    assert [p.splitlines()[0].split("after ")[1] for p in printed] == [
        "001_trace", "002_canonicalize", "003_place{policy=single}", "004_insert_delays{staleness=0,role=actor}",
        "005_insert_transfers{carrier=device_put}", "006_fuse", "007_loop{k=16}",
        "008_lower_host_loops"]
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "001_trace.fir", "002_canonicalize.fir", "003_place.fir", "004_insert_delays.fir", "005_insert_transfers.fir",
        "006_fuse.fir", "007_loop.fir", "008_lower_host_loops.fir"]


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(fragc.FragcError, match=r"unknown policy 'singel' \(did you mean 'single'\?\); known policies: single, anakin, gspmd, actor_learner, actor_learner_async, agent_learners, population\(POLICY,SEEDS\)"):
        fragc.compile(Regression(), "singel")


def test_more_devices_than_exist_gives_the_simulation_hint():
    with pytest.raises(fragc.FragcError, match=r"16 devices were asked for but only 8 exist.*JAX_NUM_CPU_DEVICES=16"):
        fragc.compile(Regression(), "single", devices=16)


def test_policy_that_leaves_a_role_unplaced():
    policy = fragc.Policy("partial", {"main": (0,)}, {"actor": fragc.RolePlacement("main", 1)})
    with pytest.raises(fragc.FragcError, match=r"policy 'partial' leaves role 'learner' unplaced"):
        fragc.compile(Regression(), policy)


def test_policy_that_names_a_role_the_algorithm_lacks():
    policy = fragc.Policy("extra", {"main": (0,)}, {"*": fragc.RolePlacement("main", 1),
                                                   "buffer": fragc.RolePlacement("main", 1)})
    with pytest.raises(fragc.FragcError, match=r"places role\(s\) \['buffer'\] that the algorithm lacks"):
        fragc.compile(Regression(), policy)


def test_state_of_the_wrong_type_is_refused():
    prog = regression_program()
    with pytest.raises(fragc.FragcError, match="does not match the program's state type"):
        prog.run({"w": 1}, 1)
    with pytest.raises(fragc.FragcError, match="iterations must be a positive int"):
        prog.run(prog.init(0), 0)


def test_a_static_trip_dispatch_loop_runs_k_and_compiles_a_remainder_only_when_a_run_needs_one(monkeypatch):
    """Off the CPU the dispatch loop's trip count is k, fixed at compile time (src/fragc/runtime/fused.py): forced here,
    its optimised HLO has a known trip count, a run of whole dispatches uses it alone, and a run that ends with a
    shorter dispatch compiles the run-time-n loop once; both give the plain loop's state."""
    from fragc.runtime import fused

    run_time_n = regression_program(4).hlo("iteration", optimized=True)  # the CPU's loop
    monkeypatch.setattr(fused, "static_trip_count", lambda devices: True)
    algo = Regression()
    prog = fragc.compile(algo, "single", iterations_per_dispatch=4)
    assert '"known_trip_count":{"n":"4"}' in prog.hlo("iteration", optimized=True)
    assert '"known_trip_count":{"n":"4"}' not in run_time_n
    executor = prog._executor
    state = prog.init(0)
    ref = state
    for iterations in (8, 9):
        got, history = prog.run(state, iterations)
        assert (executor._remainder is None) == (iterations % 4 == 0)
        while int(ref.step) < iterations:
            ref, _ = jax.jit(algo.iteration)(ref)
        assert history["loss"].shape == (iterations,)
        assert_trees_close(got, ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- runs at once: executors keep no run state


RUN = 24  # iterations of each run, dispatched one at a time


class Rendezvous(fragc.actions.Action):
    """Holds each run after each dispatch's metrics until the other run has reached the same point, so that two
    runs' dispatches interleave."""

    def __init__(self, barrier):
        self.barrier = barrier

    def on_metrics(self, iteration, metrics, queued):
        self.barrier.wait(60)


def run_both(runs):
    """`runs`: (program, seed) pairs, run at once in threads that meet after every dispatch -> each one's result
    and `last_delays` (as that thread sees them)."""
    barrier = threading.Barrier(len(runs))
    results = [None] * len(runs)

    def one(k, prog, seed):
        out = prog.run(prog.init(seed), RUN, [Rendezvous(barrier)])
        results[k] = (out, prog.last_delays)

    threads = [threading.Thread(target=one, args=(k, p, s)) for k, (p, s) in enumerate(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(r is not None for r in results), "a run did not finish"
    return results


@functools.cache
def staged_program():
    """A staged program with delays: its actor reads the weights the learner makes, one iteration late."""
    return fragc.compile(user_shapes.ConstFloat(), "actor_learner_async", devices=4, iterations_per_dispatch=1)


@pytest.mark.parametrize("which", ["fused", "staged"])
def test_two_threads_running_one_program_get_what_each_gets_alone(which):
    """Two runs of one compiled program at once (an evaluator thread, a sweep driver): each gets, bit for bit, what
    it gets alone, its delay values too (a staged program's run state is the run's, not the executor's)."""
    prog = regression_program(1) if which == "fused" else staged_program()
    alone = [prog.run(prog.init(seed), RUN) for seed in (0, 1)]
    alone_delays = None if which == "fused" else prog.last_delays
    both = run_both([(prog, 0), (prog, 1)])
    for (out, _), want in zip(both, alone):
        assert_trees_close(out, want, rtol=0, atol=0)
    if which == "staged":
        assert_trees_close(both[1][1], alone_delays, rtol=0, atol=0)
        assert_trees_close(prog.run(prog.init(0), RUN), alone[0], rtol=0, atol=0)


def test_two_programs_at_once_get_what_each_gets_alone():
    first, second = regression_program(1), staged_program()
    alone = [first.run(first.init(3), RUN), second.run(second.init(4), RUN)]
    both = run_both([(first, 3), (second, 4)])
    for (out, _), want in zip(both, alone):
        assert_trees_close(out, want, rtol=0, atol=0)


def test_the_runs_copies_keep_an_empty_arrays_sharding():
    """XLA gives a copied empty array a replicated sharding; a state with one ([N, 0]: MJX's contacts of a model
    without any) would then not match the program's input shardings at the next dispatch."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from fragc.runtime.program import copies

    split = NamedSharding(Mesh(jax.devices()[:8], ("replica",)), PartitionSpec("replica"))
    empty, full = jax.device_put(np.zeros((8, 0), np.float32), split), jax.device_put(np.ones((8, 2)), split)
    copied = copies({"empty": empty, "full": full})
    assert copied["empty"].sharding == split and copied["full"].sharding == split
    np.testing.assert_array_equal(copied["full"], full)
