"""Control flow and constants around fragment calls (tests/user_shapes.py): traced into `for`/`while`/`if` regions and
`const` nodes, compiled under each policy that applies, and checked against the reference interpreter (which runs
regions trip by trip and by the branch index's value) and against `jax.jit` of the iteration itself."""

import dataclasses
import functools
import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from fragc.algos import ppo
from conftest import assert_trees_close
from fragc.ir import parse, verify
from fragc.ir.module import For, If, While, walk
from fragc.passes import default_passes, resolve, run_pipeline
from test_golden_ir import check_golden
from held_out_shapes import HELD_OUT
from user_shapes import SHAPES as WRITTEN, Base

SHAPES = {**WRITTEN, **HELD_OUT}
"""tests/user_shapes.py's shapes and tests/held_out_shapes.py's, checked alike."""

ITERATIONS = 3
DEVICES = {"single": 1, "anakin": 4, "actor_learner": 8, "actor_learner_async": 8}
FAST = {  # the default suite; the whole matrix with -m slow
    "single": ("switch", "nested", "while_loss"),
    "anakin": ("scan", "scan_minibatches", "while_loss"),
    "actor_learner": ("cond", "actor_learner_scan", "spanning_cond", "while_spanning"),
    "actor_learner_async": ("nested", "while_loss"),
}
NO_ACTOR_READS_THE_STATE = ("actor_learner_scan", "while_spanning",  # refused under actor_learner_async: nothing
                            "target_inside_loss")  # to pipeline (the last updates its weights between fragments)
CASES = [pytest.param(name, policy, marks=() if name in FAST[policy] else pytest.mark.slow)
         for policy in DEVICES for name in SHAPES
         if not (name in NO_ACTOR_READS_THE_STATE and policy == "actor_learner_async")]
JIT_FAST = ("keywords", "scan", "cond", "nested", "while_loss", "while_spanning")


@functools.cache
def compiled(name, policy):
    return fragc.compile(SHAPES[name](), policy, devices=DEVICES[policy])


def history_of(metrics_list):
    """The reference's metrics per iteration -> rows per metric, nested dicts' keys joined with '.' as a program's
    history names them (`loss.mse`)."""
    def flat(metrics, prefix=""):
        for k, v in metrics.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    rows = [dict(flat(m)) for m in metrics_list]
    return {k: np.array([m[k] for m in rows]) for k in rows[0]}


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in JIT_FAST else pytest.mark.slow) for n in SHAPES])
def test_the_reference_with_one_replica_equals_jit_of_the_iteration(name):
    """Independent of fragc's graph: the algorithm's own iteration, jitted (fragments run as plain functions)."""
    algo = SHAPES[name]()
    module = fragc.trace(algo)
    state = algo.init(jax.random.key(0))
    for _ in range(ITERATIONS):
        expected = jax.jit(algo.iteration)(state)
        got = fragc.interpret(module, state, replicas=1)
        assert_trees_close(got, expected, rtol=1e-6, atol=1e-6)
        state = got[0]


@pytest.mark.parametrize("name,policy", CASES)
def test_compiled_equals_the_reference(name, policy):
    prog = compiled(name, policy)
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    ref, ref_history = fragc.run_iterations(prog.module, state, ITERATIONS)  # the placed (pipelined) module
    assert_trees_close(out, ref, rtol=1e-5, atol=1e-6)
    ref_history = history_of(ref_history)
    assert sorted(history) == sorted(ref_history)
    for k in history:
        np.testing.assert_allclose(history[k], ref_history[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("name,policy", [
    ("actor_learner_scan", "actor_learner"),
    ("while_spanning", "actor_learner"),
    pytest.param("nested", "actor_learner_async", marks=pytest.mark.slow),
    pytest.param("switch", "actor_learner", marks=pytest.mark.slow),
])
def test_one_spmd_program_equals_the_reference(name, policy):
    """transfers='collective': the regions run inside one SPMD program over both groups (a loop's transfers
    are collectives every trip, an if's index is broadcast from its group's row)."""
    prog = fragc.compile(SHAPES[name](), policy, devices=8, transfers="collective")
    assert prog.module.schedule.executor == "spmd"
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    ref, ref_history = fragc.run_iterations(prog.module, state, ITERATIONS)
    assert_trees_close(out, ref, rtol=1e-5, atol=1e-6)
    for k, rows in history_of(ref_history).items():
        np.testing.assert_allclose(history[k], rows, rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_loop_spanning_actor_and_learner_is_run_from_the_schedule():
    """Under actor_learner the scan's body samples on the actors and learns on the learner: the loop is not in
    one program; its body has stages of its own and transfers that move every trip."""
    prog = compiled("actor_learner_scan", "actor_learner")
    i, loop = next((i, n) for i, n in enumerate(prog.module.graph.nodes) if isinstance(n, For))
    stages = prog.module.schedule.stages_of((i, 0))  # the schedule's, keyed by the body's path
    assert [s.group for s in stages] == ["actors", "learner"]  # its constant in the learner's stage
    moved = [n for n in loop.body.nodes if n.kind == "transfer"]
    assert {(n.src, n.dst) for n in moved} == {("learner", "actors"), ("actors", "learner")}
    assert prog.cost()["total"]["transfer_bytes"] == loop.trips * sum(n.nbytes for n in moved)


def test_a_branch_spanning_groups_is_chosen_by_the_schedule():
    """Under actor_learner the cond's branches run on different groups: each branch has stages of its own (the
    index is read on the host); compiled equals the reference in test_compiled_equals_the_reference."""
    prog = compiled("spanning_cond", "actor_learner")
    i, node = next((i, n) for i, n in enumerate(prog.module.graph.nodes) if isinstance(n, If))
    assert prog.module.group_of(node) is None
    assert [[s.group for s in prog.module.schedule.stages_of((i, k))] for k in range(2)] == [["learner"], ["actors"]]


def test_collective_bytes_of_a_loop_are_trips_times_a_trip():
    one = compiled("const_float", "anakin").cost()["total"]["collective_bytes"]
    three = compiled("scan", "anakin").cost()["total"]["collective_bytes"]
    assert one > 0 and three == pytest.approx(3 * one)  # one call of learn against three trips of it


def test_ppo_epochs_run_inside_learn_and_its_collectives_count_every_epoch():
    """PPO's update is one `learn` call (the advantages once, then the epochs as a scan inside the fragment, as
    PureJaxRL's `_update_epoch`): the trajectory moves to the learner once, and the cost model counts each epoch's
    gradient all-reduces (the scan's trips x one epoch's)."""
    from fragc.runtime.cost import fragment_collective_bytes
    from fragc.runtime.stages import stage_fragments

    def placed(epochs: int):
        algo = ppo.PPO(ppo.Config(num_envs=8, num_steps=8, num_minibatches=2, update_epochs=epochs))
        return run_pipeline(fragc.trace(algo), default_passes(resolve("actor_learner", 8), 4)).final

    one, two, three = placed(1), placed(2), placed(3)
    assert not [n for n in walk(three.graph.nodes) if isinstance(n, For)]
    assert stage_fragments(three.graph, range(len(three.graph.nodes))).count("learn") == 1
    assert len([n for n in three.graph.nodes if n.kind == "transfer" and n.dst == "learner"]) == 1
    b1, b2, b3 = (fragment_collective_bytes(m.fragments["learn"]) for m in (one, two, three))
    per_epoch = b2 - b1  # the epoch's gradient and metric means; the explained variance's sums once a call
    assert per_epoch > 0.9 * b1 and b3 - b2 == per_epoch


def test_the_fragment_that_reads_a_loop_constant_gets_it_moved_once():
    """What the body reads unchanged is moved before the loop, not every trip (a `for` hoists its constants)."""
    module = run_pipeline(fragc.trace(SHAPES["scan"]()), default_passes(resolve("actor_learner", 8), 4)).final
    loop = next(n for n in module.graph.nodes if isinstance(n, For))
    assert not [n for n in loop.body.nodes if n.kind == "transfer"]
    before = [n for n in module.graph.nodes if n.kind == "transfer" and n.dst == "learner"]
    assert before, "the sampled data crosses to the learner before the loop"


# ---------------------------------------------------------------- the IR: printed, parsed back, goldens


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_module_after_every_pass_parses_back(name):
    module = fragc.trace(SHAPES[name]())
    for policy in ("single", "anakin", "actor_learner"):
        for m in run_pipeline(module, default_passes(resolve(policy, 8), 4, "device_put")).modules:
            text = str(m)
            assert str(parse(text, bodies=m)) == text, m.label
            regions = [line for line in text.splitlines()
                       if " = for " in line or " = if " in line or " = while " in line or "^" in line]
            assert max(map(len, regions), default=0) <= 120, m.label
            verify(parse(text, bodies=m))


class DeadInLoop(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)

        def step(w, _):
            self.polyak(w, state.target)  # nothing reads it
            return self.learn(w, data.x, y, 0.1)[0], None

        w, _ = jax.lax.scan(step, state.w, None, length=2)
        return self.finish(state, w, data, {})


def test_canonicalize_drops_dead_runs_inside_regions():
    traced, canonical = run_pipeline(fragc.trace(DeadInLoop()), default_passes(resolve("single", 1), 4)).modules[:2]
    loop = next(n for n in canonical.graph.nodes if isinstance(n, For))
    assert "polyak" in traced.fragments and "polyak" not in canonical.fragments
    assert [n.fragment for n in loop.body.nodes if n.kind == "run"] == ["learn"]


def test_regions_are_drawn_with_what_they_run():
    from fragc.ir import to_dot

    text = to_dot(run_pipeline(fragc.trace(SHAPES["nested"]()), default_passes(resolve("actor_learner", 8), 4)).final)
    assert 'shape=box3d, label="for trips=4\\n@learn @polyak\\ntests/user_shapes.py:' in text
    assert "cluster_learner" in text


def test_constants_print_with_their_value():
    text = str(fragc.trace(SHAPES["const_float"]()))
    assert "= glue()   // const 0.05" in text
    assert "run @learn(%state.w, %data.x, %sample_0, %c)" in text


def test_golden_for_region_spanning_actor_and_learner():
    module = run_pipeline(fragc.trace(SHAPES["actor_learner_scan"]()),
                          default_passes(resolve("actor_learner", 8), 16)).final
    check_golden("user_scan_actor_learner.fir", str(module))


def test_golden_while_region_spanning_actor_and_learner():
    module = run_pipeline(fragc.trace(SHAPES["while_spanning"]()), default_passes(resolve("actor_learner", 8), 16)).final
    check_golden("user_while_actor_learner.fir", str(module))


def test_golden_if_region_under_actor_learner():
    module = run_pipeline(fragc.trace(SHAPES["cond"]()), default_passes(resolve("actor_learner", 8), 16)).final
    check_golden("user_cond_actor_learner.fir", str(module))


def test_a_while_loop_is_a_region_whose_trips_are_data():
    """`lax.while_loop` around a fragment: a `while` node holding its condition and body; on one group inside its
    group's program, spanning groups from the schedule (its body staged, its condition read on the host)."""
    module = fragc.trace(SHAPES["while_loss"]())
    node = next(n for n in module.graph.nodes if isinstance(n, While))
    assert [n.fragment for n in walk(node.body.nodes) if n.kind == "run"] == ["learn"]
    assert [u.type.dtype for u in node.cond.outputs] == [np.dtype(bool)] and len(node.outputs) == 1
    text = str(module)
    assert " = while body_consts(" in text and "} do {" in text and "^cond(" in text and "^body(" in text
    # every policy compiles it and counts its trips as data: two to five updates an iteration here
    _, history = compiled("while_loss", "single").run(compiled("while_loss", "single").init(0), 4)
    assert set(np.unique(history["updates"])) <= set(range(1, 6)) and history["updates"][0] > 1
    spanning = compiled("while_spanning", "actor_learner")
    i, loop = next((i, n) for i, n in enumerate(spanning.module.graph.nodes) if isinstance(n, While))
    assert spanning.module.group_of(loop) is None
    assert [s.group for s in spanning.module.schedule.stages_of((i, 1))] == ["actors", "learner", "actors"]
    _, history = spanning.run(spanning.init(0), 3)
    np.testing.assert_array_equal(history["trips"], [2, 3, 2])


@pytest.mark.parametrize("policy", ["gspmd", fragc.population("single", 2)], ids=["gspmd", "population"])
def test_a_while_loop_under_gspmd_and_in_a_population_equals_the_reference(policy):
    """The other built-in policies: GSPMD (single-device maths, XLA partitions) and a vectorised population, whose
    members take their own number of trips (a `while` vmapped over members runs until every member is done)."""
    algo = SHAPES["while_loss"]()
    prog = fragc.compile(algo, policy, devices=4)
    start = prog.init(0)
    out, history = prog.run(start, ITERATIONS)
    member = (lambda x: x[1]) if prog.population else (lambda x: x)
    state = jax.tree.map(member, start)
    ref, ref_history = fragc.run_iterations(fragc.trace(algo), state, ITERATIONS)
    assert_trees_close(jax.tree.map(member, out), ref, rtol=1e-5, atol=1e-6)
    updates = history["updates"][1] if prog.population else history["updates"]
    np.testing.assert_array_equal(updates, [m["updates"] for m in ref_history])


def test_the_printed_ir_names_metrics_reuses_aliases_and_prints_no_empty_operands():
    """Metrics made by a region print by their names, not as a run of a value's leaves (`%carry2#1..2`); a
    branch's operands share one alias (`!Ops`, not `!Ops1` for `%ops1`); a type that is an alias on one group
    prints as `!Alias@group`; an empty group of a loop's operands or an empty argument is not printed."""
    text = " ".join(str(fragc.trace(SHAPES["while_loss"]())).split())
    assert "metrics={loss: %carry2.1, updates: %carry2.2}" in text and "#" not in text[text.index("return"):]
    assert " = while body_consts(%data.x, %sample_0) carry(" in text  # its condition takes no constants
    cond = str(run_pipeline(fragc.trace(SHAPES["cond"]()), default_passes(resolve("actor_learner", 8), 4)).final)
    assert "^then(%ops1: !Ops):" in cond and "^else(%ops: !Ops):" in cond and "!Ops1" not in cond
    ppo_text = str(run_pipeline(fragc.trace(ppo.PPO(ppo.Config(num_envs=8, num_steps=8))),
                                default_passes(resolve("actor_learner", 8), 4)).final)
    assert "learner: !Learner@learner," in ppo_text
    assert "xs(())" not in ppo_text and ", ())" not in ppo_text


def test_regions_hold_what_the_user_wrote():
    nested = fragc.trace(SHAPES["nested"]())
    loop = next(n for n in nested.graph.nodes if isinstance(n, For))
    assert loop.trips == 4 and not loop.reverse
    inner = [n for n in loop.body.nodes if isinstance(n, If)]
    assert len(inner) == 1 and len(inner[0].branches) == 2
    assert [n.fragment for n in walk(inner[0].branches[1].nodes) if n.kind == "run"] == ["polyak"]
    switch = next(n for n in fragc.trace(SHAPES["switch"]()).graph.nodes if isinstance(n, If))
    assert len(switch.branches) == 3
    assert "switch" in str(fragc.trace(SHAPES["switch"]()))


# ---------------------------------------------------------------- what stays refused, in one line


class VmapOfOwn(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        ws = jax.vmap(lambda lr: self.learn(state.w, data.x, y, lr)[0])(jnp.array([0.1, 0.2]))
        return self.finish(state, ws[0], data, {})


class Nested(Base):
    @fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=None)
    def outer(self, w, x, y):
        return self.learn(w, x, y, 0.1)[0]

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        return self.finish(state, self.outer(state.w, data.x, y), data, {})


class GradThrough(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        g = jax.grad(lambda w: jnp.sum(self.learn(w, data.x, y, 0.1)[0]))(state.w)
        return self.finish(state, state.w - g, data, {})


class BadKeyword(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, learning_rate=0.1)
        return self.finish(state, w, data, m)


@pytest.mark.parametrize("algo,words", [
    (VmapOfOwn, ["fragment 'learn'", "jax.vmap", "in_axes", "test_control_flow.py:"]),
    (Nested, ["fragment 'learn'", "inside fragment 'outer'", "test_control_flow.py:"]),
    (BadKeyword, ["fragment 'learn'", "learning_rate", "test_control_flow.py:"]),
    (GradThrough, ["fragment 'learn'", "jax.grad", "inside the fragment", "test_control_flow.py:"]),
])
def test_unsupported_shapes_are_refused_in_one_line_naming_the_call(algo, words):
    with pytest.raises(fragc.FragcError) as err:
        fragc.trace(algo())
    message = str(err.value)
    assert "\n" not in message
    for w in words:
        assert w in message


class CondMetricKeys(Base):
    """Metrics from a cond whose branches return different keys: an extra metric on even iterations only."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, self.lr)
        metrics = jax.lax.cond(state.step % 2 == 0, lambda: {**m, "target_gap": jnp.sum(w - state.target)},
                               lambda: m)
        return self.finish(state, w, data, metrics)


class CondMetricStructure(Base):
    """Branches returning the same key, a scalar in one and a (loss, score) pair in the other."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, self.lr)
        metrics = jax.lax.cond(state.step % 2 == 0, lambda: {"loss": m["loss"]},
                               lambda: {"loss": (m["loss"], jnp.mean(y))})
        return self.finish(state, w, data, metrics)


class SwitchMetricKeys(Base):
    """A switch whose last case names its metric differently (as dicts of one size: JAX compares their keys)."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, self.lr)
        metrics = jax.lax.switch(state.step % 3, [lambda: {"loss": m["loss"]}, lambda: {"loss": 2 * m["loss"]},
                                                  lambda: {"score": jnp.mean(y)}])
        return self.finish(state, w, data, metrics)


def line_of(cls, text: str) -> str:
    """`tests/test_control_flow.py:N`, N the line of `cls`'s source that holds `text`."""
    lines, start = inspect.getsourcelines(cls)
    return f"tests/test_control_flow.py:{start + next(i for i, line in enumerate(lines) if text in line)}"


@pytest.mark.parametrize("algo,api,words", [
    (CondMetricKeys, "jax.lax.cond", ["lax.cond", "true_fun and false_fun", "'target_gap' in one branch only"]),
    (CondMetricStructure, "jax.lax.cond", ["lax.cond", "at ['loss']: true_fun returns a pytree leaf but false_fun a "
                                                       "tuple"]),
    (SwitchMetricKeys, "jax.lax.switch", ["lax.switch", "branch 0 and branch 2", "each of 'loss', 'score' in one "
                                                                                 "branch only"]),
])
def test_branches_returning_different_metrics_are_refused_in_one_line_naming_the_keys_and_the_line(algo, api, words):
    """JAX reports branches of different pytrees in eight lines from inside its cond; fragc in one, naming the
    keys (or the path) where the branches differ and the user's line of the cond."""
    with pytest.raises(fragc.FragcError) as err:
        fragc.trace(algo())
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{algo.__name__}.iteration: the branches")
    for w in words + [f" at {line_of(algo, api)} "]:
        assert w in message, w


class HostRolloutInLoop(ppo.PPO):
    """PPO on Gymnasium's CartPole whose rollout is called inside a scan (one trip)."""

    def iteration(self, state):
        def step(runner, _):
            traj, runner, m = self.rollout(state.learner.params, runner)
            return runner, (traj, m)

        runner, (traj, m) = jax.lax.scan(step, state.runner, None, length=1)
        learner, losses = self.learn(state.learner, jax.tree.map(lambda x: x[0], traj))
        return ppo.State(learner, runner), {**jax.tree.map(lambda x: x[0], m), **losses}


def test_host_environments_inside_a_region_step_in_program_or_are_refused_in_one_line():
    module = fragc.trace(HostRolloutInLoop(ppo.Config(env="gymnasium:CartPole-v1", num_envs=4, num_steps=4)))
    one = run_pipeline(module, default_passes(dataclasses.replace(resolve("single", 1), env_groups=1), 4)).final
    assert one.fragments["rollout"].placement.env_groups == 0  # synchronous, its host steps in the program
    with pytest.raises(fragc.FragcError, match=r"env_groups=2: fragment 'rollout' steps host environments inside "
                                               r"a for/while/if region, where its host loop cannot run"):
        run_pipeline(module, default_passes(dataclasses.replace(resolve("single", 1), env_groups=2), 4))


def test_keyword_call_equals_positional_call():
    positional = fragc.trace(SHAPES["const_float"]())
    keywords = fragc.trace(SHAPES["keywords"]())
    run = [n for n in keywords.graph.nodes if n.kind == "run" and n.fragment == "learn"][0]
    chex.assert_equal(len(run.inputs), len([n for n in positional.graph.nodes if n.kind == "run"][1].inputs))
