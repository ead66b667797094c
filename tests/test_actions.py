"""Periodic actions on the training driver (src/fragc/runtime/actions.py): when each hook runs, with what."""

import functools

import jax
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close
from toy_algos import Regression


@functools.cache
def program():
    return fragc.compile(Regression(), "single", iterations_per_dispatch=2)


class Recorder(fragc.actions.Action):
    """Every hook call, in order, as (hook, iteration, what it saw)."""

    def __init__(self, every=0, stop_after=None):
        self.every, self.stop_after, self.calls = every, stop_after, []

    def on_start(self, run):
        self.run = run
        self.calls.append(("start", run.start, run.stop_at))

    def on_dispatch(self, iteration, state):
        self.calls.append(("dispatch", iteration, int(state.step)))  # the state is on device, already advanced
        return state.step + 0  # a value computed from the state: the next dispatch reuses its buffers

    def on_metrics(self, iteration, metrics, queued):
        self.calls.append(("metrics", iteration, len(metrics["loss"]), int(queued)))

    def on_state(self, iteration, state, delays):
        assert isinstance(state.w, np.ndarray)  # a host copy
        self.calls.append(("state", iteration, int(state.step)))

    def wants_stop(self):
        return self.stop_after is not None and self.run.reached >= self.stop_after

    def on_end(self, run):
        self.calls.append(("end", run.reached))


def test_hooks_run_in_order_with_the_iterations_counted_from_the_runs_start():
    prog = program()
    recorder = Recorder(every=3)
    prog.run(prog.init(0), 5, [recorder], start=10)
    assert recorder.calls == [
        ("start", 10, 15),
        ("dispatch", 12, 2),
        ("dispatch", 14, 4), ("metrics", 12, 2, 2),  # metrics arrive one dispatch late
        ("metrics", 14, 2, 4), ("state", 14, 4),  # every 3, rounded up to the dispatch that passes it
        ("dispatch", 15, 5), ("metrics", 15, 1, 5), ("state", 15, 5),  # and at the run's last iteration
        ("end", 15),
    ]


def test_actions_do_not_change_the_run():
    prog = program()
    plain, plain_history = prog.run(prog.init(0), 5)
    acted, acted_history = prog.run(prog.init(0), 5, [Recorder(every=1), fragc.actions.CheckFinite()])
    assert_trees_close(plain, acted, rtol=0, atol=0)
    np.testing.assert_array_equal(plain_history["loss"], acted_history["loss"])


def test_a_stop_ends_the_run_at_that_dispatch_and_hands_the_state_to_periodic_actions():
    prog = program()
    recorder = Recorder(every=100, stop_after=4)
    state, history = prog.run(prog.init(0), 9, [recorder])
    # iteration 4's metrics arrive while the dispatch to 6 runs: the run ends after that dispatch in flight
    assert int(state.step) == 6 and history["loss"].shape == (6,)
    assert ("state", 6, 6) in recorder.calls and recorder.calls[-1] == ("end", 6)


def test_stop_at_return_stops_early_at_a_target():
    prog = program()
    state, history = prog.run(prog.init(0), 20, [fragc.actions.StopAtReturn(target=-np.inf, metric="loss")])
    assert int(state.step) == 4  # the first dispatch's metrics reach the target: the run ends after the one in flight


def test_on_end_runs_when_an_action_fails():
    prog = program()

    class Fails(fragc.actions.Action):
        def on_metrics(self, iteration, metrics, queued):
            raise RuntimeError("boom")

    recorder = Recorder()
    with pytest.raises(RuntimeError, match="boom"):
        prog.run(prog.init(0), 4, [recorder, Fails()])
    assert recorder.calls[-1][0] == "end"


def test_every_hands_host_states_and_train_runs_users_actions_after_its_own(tmp_path):
    prog = program()
    seen = []
    result = fragc.train(prog, prog.init(0), 6, actions=[fragc.actions.Every(4, lambda i, s: seen.append((i, int(s.step))))],
                         checkpoint_dir=tmp_path, checkpoint_every=2)
    assert seen == [(4, 4), (6, 6)] and result.iterations == 6


def test_bad_actions_are_refused_in_one_line():
    prog = program()
    with pytest.raises(fragc.FragcError, match="is not a fragc.actions.Action"):
        prog.run(prog.init(0), 2, [lambda i, m: None])
    with pytest.raises(fragc.FragcError, match="every must be a positive whole number"):
        fragc.actions.Every(0, print)
    bad = Recorder()
    bad.every = 1.5
    with pytest.raises(fragc.FragcError, match="Recorder.every must be a whole number"):
        prog.run(prog.init(0), 2, [bad])
