"""A `lax.switch` whose cases span device groups and one of whose cases calls no fragment (tests/user_shapes.py
`SwitchSpanning`): under actor_learner its other cases run on the actors and on the learner, so the schedule runs
the region case by case, and the fragment-free case has nothing to stage (it only passes the learner's step
through). Checked under every built-in policy against the reference interpreter; the verifier still refuses a
spanning region's graph that has something to stage but no stages. A `while` whose condition only reads a carried
flag (nothing to stage) met the same rule."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close
from fragc.ir import VerifyError, verify
from fragc.ir.module import If
from fragc.passes import default_passes, resolve, run_pipeline
from test_control_flow import history_of
from user_shapes import SHAPES, Base

ITERATIONS = 3
POLICIES = [("single", 1), ("anakin", 4), ("gspmd", 4), ("actor_learner", 8), ("actor_learner_async", 8),
            (fragc.population("single", 2), 2)]


@pytest.mark.parametrize("policy,devices", POLICIES, ids=[str(p) if isinstance(p, str) else "population"
                                                          for p, _ in POLICIES])
def test_a_switch_spanning_groups_with_a_fragment_free_case_equals_the_reference(policy, devices):
    algo = SHAPES["switch_spanning"]()
    prog = fragc.compile(algo, policy, devices=devices)
    start = prog.init(0)
    out, history = prog.run(start, ITERATIONS)
    if prog.population:  # member 1 against its own reference run (the unplaced module, one member)
        member = lambda x: x[1]  # noqa: E731
        ref, ref_history = fragc.run_iterations(fragc.trace(algo), jax.tree.map(member, start), ITERATIONS)
        out, history = jax.tree.map(member, out), {k: v[1] for k, v in history.items()}
    else:  # the placed (for actor_learner_async, pipelined) module, as the reference interpreter runs it
        ref, ref_history = fragc.run_iterations(prog.module, start, ITERATIONS)
    assert_trees_close(out, ref, rtol=1e-5, atol=1e-6)
    ref_history = history_of(ref_history)
    assert sorted(history) == sorted(ref_history) == ["case", "loss", "score"]
    for k in history:
        np.testing.assert_allclose(history[k], ref_history[k], rtol=1e-5, atol=1e-6, err_msg=k)
    if policy in ("single", "actor_learner"):  # every case is taken in these runs (seed 0)
        assert sorted(set(history["case"].tolist())) == [0, 1, 2]


def placed(policy: str = "actor_learner"):
    return run_pipeline(fragc.trace(SHAPES["switch_spanning"]()), default_passes(resolve(policy, 8), 4)).final


@pytest.mark.parametrize("policy", ["actor_learner", "actor_learner_async"])
def test_the_fragment_free_case_has_no_stages_and_the_others_have_their_groups(policy):
    module = placed(policy)
    i, node = next((i, n) for i, n in enumerate(module.graph.nodes) if isinstance(n, If))
    assert module.group_of(node) is None and len(node.branches) == 3
    keep = node.branches[0]
    assert all(n.kind == "transfer" for n in keep.nodes)  # it passes the learner's step through, moving it
    assert module.schedule.stages_of((i, 0)) == ()
    assert [s.group for s in module.schedule.stages_of((i, 1))] == ["actors"]
    assert [s.group for s in module.schedule.stages_of((i, 2))] == ["learner"]


def test_a_spanning_case_with_work_but_no_stages_is_still_refused():
    module = placed()
    i = next(i for i, n in enumerate(module.graph.nodes) if isinstance(n, If))
    stages = tuple((path, s) for path, s in module.schedule.stages if path != (i, 1))
    broken = module.replace(schedule=dataclasses.replace(module.schedule, stages=stages))
    with pytest.raises(VerifyError, match=rf"graph at \[{i}, 1\]: node \d+ \(run @sample.*\) lies in no stage "
                                          r"\[rule stages_close_over_the_graph\]"):
        verify(broken)


class WhileFlag(Base):
    """A while_loop spanning both groups whose condition is a carried flag the body sets (its graph has no node)."""

    def iteration(self, state):
        def body(carry):
            w, data, n, _, _ = carry
            y, data = self.sample(w, data)
            w, m = self.learn(w, data.x, y, self.lr)
            return w, data, n + 1, m["loss"], n + 1 < 2 + state.step % 2

        start = (state.w, state.data, jnp.int32(0), jnp.float32(0), jnp.bool_(True))
        w, data, n, loss, _ = jax.lax.while_loop(lambda carry: carry[4], body, start)
        return self.finish(state, w, data, {"loss": loss, "trips": n})


@pytest.mark.parametrize("transfers", ["device_put", "collective"])
def test_a_while_spanning_groups_whose_condition_is_a_carried_flag_equals_the_reference(transfers):
    prog = fragc.compile(WhileFlag(), "actor_learner", devices=8, transfers=transfers)
    assert prog.module.schedule.executor == ("staged" if transfers == "device_put" else "spmd")
    start = prog.init(0)
    out, history = prog.run(start, ITERATIONS)
    ref, ref_history = fragc.run_iterations(prog.module, start, ITERATIONS)
    assert_trees_close(out, ref, rtol=1e-5, atol=1e-6)
    for k, rows in history_of(ref_history).items():
        np.testing.assert_allclose(history[k], rows, rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_array_equal(history["trips"], [2, 3, 2])
