"""Held-out user code (tests/held_out_shapes.py) that once went wrong in the frontend: fragments inside the user's own
`jax.jit`, Python scalars in the state, non-array arguments, defaults left out. Each is traced as written and
computes what `jax.jit` of the iteration computes, or is refused in one line naming the user's code."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
import fragc.ir
from conftest import assert_trees_close
from fragc.ir.module import Run, walk
from fragc.passes import default_passes, resolve, run_pipeline
from held_out_shapes import HELD_OUT
from user_shapes import SHAPES as WRITTEN, Base


def runs(module):
    return [n.fragment for n in walk(module.graph.nodes) if isinstance(n, Run)]


# ---------------------------------------------------------------- a fragment inside the user's own jax.jit


CACHED = [("jit_method", ["learn"]), ("jit_helper", ["sgd_step", "sgd_step"]), ("scan_of_function", ["sgd_step"])]
"""Shapes whose fragment calls JAX's caches hold, with the fragments each runs."""


@pytest.mark.parametrize("name,learns", CACHED)
def test_a_jitted_helper_traced_by_jax_first_still_calls_its_fragments(name, learns):
    """`jax.jit(algo.iteration)` first runs the fragments as plain functions and JAX caches the helper's jaxpr;
    `fragc.trace` must not reuse it (its learner step would become glue, run on the actors, without a word)."""
    algo = HELD_OUT[name]()
    state = algo.init(jax.random.key(0))
    expected = jax.jit(algo.iteration)(state)
    module = fragc.trace(algo)
    assert runs(module) == ["sample"] + learns
    assert_trees_close(fragc.interpret(module, state), expected, rtol=1e-6, atol=1e-6)


CACHED = [("jit_method", ["learn"]), ("jit_helper", ["sgd_step", "sgd_step"]), ("scan_of_function", ["sgd_step"])]
"""Shapes whose fragment calls JAX's caches hold, with the fragments each runs."""


@pytest.mark.parametrize("name,learns", CACHED)
def test_a_jitted_helper_traces_twice_and_runs_under_jit_after(name, learns):
    """A second trace does not meet the first one's fragment calls in JAX's cache, nor does jax.jit after it."""
    algo = HELD_OUT[name]()
    first, second = fragc.trace(algo), fragc.trace(algo)
    assert runs(first) == ["sample"] + learns and str(first) == str(second)
    state = algo.init(jax.random.key(1))
    assert_trees_close(jax.jit(algo.iteration)(state), fragc.interpret(second, state), rtol=1e-6, atol=1e-6)


def test_a_jitted_method_compiles_twice_with_its_learner_on_the_learner_group():
    algo = HELD_OUT["jit_method"]()
    jax.jit(algo.iteration)(algo.init(jax.random.key(0)))
    for _ in range(2):
        prog = fragc.compile(algo, "actor_learner", devices=8)
        learn = [n for n in prog.module.graph.nodes if isinstance(n, Run) and n.fragment == "learn"]
        assert len(learn) == 1 and prog.module.fragments["learn"].placement.group == "learner"
    state = prog.init(0)
    out, history = prog.run(state, 2)
    ref, ref_history = fragc.run_iterations(prog.module, state, 2)
    assert_trees_close(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history["loss"], [m["loss"] for m in ref_history], rtol=1e-5)


# ---------------------------------------------------------------- Python numbers in the state


def test_a_train_states_python_int_step_is_an_array_to_interpret_and_run():
    """`TrainState.create` leaves `step` the Python int 0: taken as an array, as jax.jit takes it."""
    algo = HELD_OUT["flax_train_state"]()
    state = algo.init(jax.random.key(0))
    assert type(state.train.step) is int
    expected = jax.jit(algo.iteration)(state)
    assert_trees_close(fragc.interpret(fragc.trace(algo), state), expected, rtol=1e-6, atol=1e-6)
    prog = fragc.compile(algo, "anakin", devices=4)
    out, history = prog.run(state, 2)
    ref, _ = fragc.run_iterations(prog.module, state, 2)
    assert_trees_close(out, ref, rtol=1e-5, atol=1e-6)
    assert list(history["step"]) == [0, 1] and int(out.train.step) == 2


# ---------------------------------------------------------------- arguments as Python binds them


def test_non_array_arguments_are_bound_into_the_body_like_jits_static_arguments():
    """A string, an enum member, a function in a dict: part of the fragment's definition (a new value defines
    another fragment; the same one reuses it), not arguments of the IR; numbers beside them stay arrays."""
    algo = HELD_OUT["static_arguments"]()
    module = fragc.trace(algo)
    assert runs(module) == ["sample", "fit", "fit_1", "fit"]
    assert module.fragments["fit"].arg_names == ("w", "x", "y", "config")
    assert [str(t) for t in module.fragments["fit"].in_types][-1] == "{lr: f32[]}"
    state = algo.init(jax.random.key(0))
    assert_trees_close(fragc.interpret(module, state, replicas=2), jax.jit(algo.iteration)(state), rtol=1e-5,
                       atol=1e-6)


def test_a_non_array_argument_that_cannot_be_static_is_refused_naming_it():
    @fragc.fragment(role="learner", in_axes=(None, None), out_axes=None)
    def scaled(w, options):
        return w * len(options["names"])

    with pytest.raises(fragc.FragmentError) as err:
        scaled(jax.numpy.ones(3), {"names": {"a", "b"}})
    message = str(err.value)
    assert "\n" not in message and "fragment 'scaled', argument 'options['names']'" in message, message
    assert "set" in message and "hashable" in message, message


def test_a_default_left_out_of_a_positional_call_is_filled_in():
    algo = HELD_OUT["default_left_out"]()
    module = fragc.trace(algo)
    assert runs(module) == ["sample", "masked_learn", "masked_learn_1"]
    assert module.fragments["masked_learn"].arg_names == ("w", "x", "y", "mask")
    state = algo.init(jax.random.key(0))
    assert_trees_close(fragc.interpret(module, state, replicas=2), jax.jit(algo.iteration)(state), rtol=1e-5,
                       atol=1e-6)


def test_a_positional_call_missing_an_argument_is_refused_naming_it():
    @fragc.fragment(role="learner", in_axes=(None, 0), out_axes=None)
    def needs_two(w, x):
        return w

    with pytest.raises(fragc.FragmentError, match=r"^fragment 'needs_two' called at .*test_user_shapes.py:\d+: "
                                                  r"missing a required argument: 'x'$"):
        needs_two(jax.numpy.ones(3))


# ---------------------------------------------------------------- per-environment values between fragments


def test_a_per_environment_value_computed_between_fragments_has_the_axis_its_reader_declares():
    """`(y > 0).astype(...)` in the iteration, passed where `masked_learn` declares axis 0: the glue's output is
    `f32[8@env]`, as a state leaf read there would be, and the program under anakin equals the reference."""
    algo = HELD_OUT["default_left_out"]()
    module = fragc.trace(algo)
    assert "%g: (f32[8@env]) = glue(%sample_0)" in str(module)
    prog = fragc.compile(algo, "anakin", devices=4)
    state = prog.init(0)
    out, history = prog.run(state, 2)
    ref, ref_history = fragc.run_iterations(prog.module, state, 2)
    assert_trees_close(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history["masked"], [m["masked"] for m in ref_history], rtol=1e-5)



def test_a_per_environment_constant_has_the_axis_its_reader_declares():
    module = fragc.trace(HELD_OUT["per_environment_constant"]())
    fragc.ir.verify(module)
    assert "%c: (f32[8@env]) = glue()" in str(module)


# ---------------------------------------------------------------- nothing to pipeline, said in the user's terms


class LearnThenAct(Base):
    """The actor acts with this iteration's update: it reads no state that the learner's group updates."""

    def iteration(self, state):
        w, m = self.learn(state.w, state.data.x, state.data.x @ state.w, self.lr)
        y, data = self.sample(w, state.data)
        return self.finish(state, w, data, {**m, "y": y.mean()})


class LearnerOnly(Base):
    def iteration(self, state):
        w, m = self.learn(state.w, state.data.x, state.data.x @ state.w, self.lr)
        return self.finish(state, w, state.data, m)


@pytest.mark.parametrize("algo,why", [
    (WRITTEN["actor_learner_scan"], r"in actorlearnerscan: @sample \(defined at tests/user_shapes.py:34\) runs only "
                                    r"inside the for at tests/user_shapes.py:174\. "),
    (LearnThenAct, r"in learnthenact: @sample \(defined at tests/user_shapes.py:34\) reads no state that another "
                   r"device group updates\. "),
    (LearnerOnly, r"in learneronly: it has no 'actor' fragment \(its fragments: @learn \(learner, "
                  r"tests/user_shapes.py:\d+\)\)\. "),
])
def test_nothing_to_pipeline_names_the_algorithms_fragments_and_lines(algo, why):
    policy = resolve("actor_learner_async", 8)
    if algo is LearnerOnly:  # a policy of the user's own placing every role, so that place passes it
        policy = dataclasses.replace(policy, roles={"*": policy.roles["*"]})
    with pytest.raises(fragc.FragcError) as err:
        run_pipeline(fragc.trace(algo()), default_passes(policy, 4))
    message = str(err.value)
    assert "\n" not in message and re.search("insert_delays: nothing to pipeline " + why, message), message
    assert message.endswith("use a synchronous policy such as actor_learner"), message


# ---------------------------------------------------------------- more of what researchers write (issue 42, item 7)


def test_a_lambda_and_a_partial_are_fragments_named_in_the_ir():
    """A lambda is named after its role (`@<lambda>` did not parse back), a partial after its function, with its
    source line; the partial's keyword-only `lr` keeps the partial's value instead of being refused."""
    module = fragc.trace(HELD_OUT["lambda_and_partial"]())
    assert runs(module) == ["sample", "learner", "_sgd"]
    assert [module.fragments[f].source.split(":")[0] for f in ("learner", "_sgd")] == ["tests/held_out_shapes.py"] * 2
    assert str(fragc.ir.parse(str(module), bodies=module)) == str(module)


def test_a_state_leaf_the_iteration_only_writes_has_its_makers_axis():
    """PureJaxRL's runner tuple: `x` is made by the actor (out_axes 0) and read by no fragment, the keys per
    environment are split between fragments: both carry the environment axis, so the module verifies."""
    module = fragc.trace(HELD_OUT["runner_tuple"]())
    fragc.ir.verify(module)
    assert [str(t) for t in module.graph.inputs[0].type.leaves] == ["f32[3]", "f32[8@env,3]", "key<fry>[]"]
    assert "key<fry>[8@env]" in str(module.graph.nodes[0].outputs[0].type)


class FlagArgument(Base):
    @fragc.fragment(role="learner", in_axes=(None, 0, 0, None), out_axes=None)
    def learn_flag(self, w, x, y, normalize):
        if normalize:
            y = y / jnp.std(y)
        return w - 0.1 * fragc.pmean(jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w))

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w = self.learn_flag(state.w, data.x, y, True)
        return self.finish(state, w, data, {"w0": w[0]})


class SizeArgument(Base):
    @fragc.fragment(role="learner", in_axes=(None, 0, 0, None), out_axes=None)
    def learn_minibatch(self, w, x, y, num_minibatches):
        x, y = x.reshape(num_minibatches, -1, 3)[0], y.reshape(num_minibatches, -1)[0]
        return w - 0.1 * fragc.pmean(jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w))

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w = self.learn_minibatch(state.w, data.x, y, 2)
        return self.finish(state, w, data, {"w0": w[0]})


class PythonIfOnState(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, self.lr)
        if state.step % 2 == 0:
            w = self.polyak(state.target, w)
        return self.finish(state, w, data, m)


@dataclasses.dataclass
class MutableConfig:
    lr: float = 0.1


class MutableConfigArgument(Base):
    @fragc.fragment(role="learner", in_axes=(None, 0, 0, None), out_axes=None)
    def learn_config(self, w, x, y, config):
        return w - config.lr * fragc.pmean(jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w))

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w = self.learn_config(state.w, data.x, y, MutableConfig())
        return self.finish(state, w, data, {"w0": w[0]})


@pytest.mark.parametrize("algo,start,words", [
    (FlagArgument, "fragment 'learn_flag' uses argument 'normalize' (bool[]) as a Python value "
                   "(TracerBoolConversionError at tests/test_user_shapes.py:", ["self.config", "enum"]),
    (SizeArgument, "fragment 'learn_minibatch' uses argument 'num_minibatches' (i32[]) as a Python value "
                   "(TypeError at tests/test_user_shapes.py:", ["Python numbers passed to it too"]),
    (PythonIfOnState, "PythonIfOnState.iteration uses state leaf state.step as a Python value "
                      "(TracerBoolConversionError at tests/test_user_shapes.py:", ["lax.cond"]),
    (MutableConfigArgument, "fragment 'learn_config', argument 'config' (called at tests/test_user_shapes.py:",
     ["a MutableConfig is neither an array nor a hashable value", "frozen dataclass"]),
])
def test_a_python_value_where_fragc_traces_an_array_is_refused_in_one_line(algo, start, words):
    with pytest.raises(fragc.FragcError) as err:
        fragc.trace(algo())
    message = str(err.value)
    assert "\n" not in message and message.startswith(start), message
    assert all(w in message for w in words), message


# ---------------------------------------------------------------- a fragment that only logs


class LogsLosses(Base):
    """A learner fragment that returns nothing and logs its argument through `jax.debug.callback` (what src/fragc/ir/traps.py
    tells a user to do with a print between fragments), once an iteration and once each trip of a scan."""

    logged: list

    def __init__(self):
        super().__init__()
        self.logged = []

    @fragc.fragment(role="learner", in_axes=(None,), out_axes=None)
    def log(self, loss):
        jax.debug.callback(lambda x: self.logged.append(float(x)), loss)

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, metrics = self.learn(state.w, data.x, y, self.lr)
        self.log(metrics["loss"])
        jax.lax.fori_loop(0, 2, lambda i, c: (self.log(metrics["loss"] + i), c)[1], 0)  # its result unused too
        return self.finish(state, w, data, metrics)


@pytest.mark.parametrize("policy,devices,replicas", [  # anakin with -m slow: actor_learner has replicas and stages
    ("single", 1, 1), pytest.param("anakin", 4, 4, marks=pytest.mark.slow), ("actor_learner", 8, 4)])
def test_a_fragment_whose_only_work_is_an_effect_runs_where_jit_runs_it(policy, devices, replicas):
    """Nothing reads the logging fragment's (empty) results: it stays in the graph after the passes and logs every
    iteration's loss as `jax.jit` of the iteration does, the loop's trips too (each of its replicas logs: 4 under
    anakin's 4 devices and on actor_learner's 4 learner devices)."""
    algo = LogsLosses()
    prog = fragc.compile(algo, policy, devices=devices)
    assert runs(prog.module).count("log") == 2  # the iteration's call and the loop's
    _, history = prog.run(prog.init(0), 3)
    by_fragc, algo.logged[:] = list(algo.logged), []
    state = algo.init(jax.random.key(0))
    for _ in range(3):
        state, _ = jax.jit(algo.iteration)(state)
    jax.effects_barrier()
    expected = [v for loss in history["loss"] for v in (loss, loss, loss + 1)]
    assert algo.logged == pytest.approx(expected, rel=1e-6)
    assert sorted(by_fragc) == pytest.approx(sorted(v for v in expected for _ in range(replicas)), rel=1e-6)


class LogsInOrder(LogsLosses):
    """The same log, ordered (`jax.debug.callback(..., ordered=True)`), which JAX runs on one device only."""

    @fragc.fragment(role="learner", in_axes=(None,), out_axes=None)
    def log(self, loss):
        jax.debug.callback(lambda x: self.logged.append(float(x)), loss, ordered=True)


def test_an_ordered_callback_runs_on_one_device_and_is_refused_on_more_in_one_line():
    algo = LogsInOrder()
    prog = fragc.compile(algo, "single")
    prog.run(prog.init(0), 2)
    jax.effects_barrier()
    assert len(algo.logged) == 6
    for policy, devices, where in [("anakin", 4, "its 4 replicas on 4 devices"),
                                   (fragc.population("single", 2), 1, "a population's vectorised members")]:
        with pytest.raises(fragc.FragcError) as refused:
            fragc.compile(algo, policy, devices=devices)
        message = str(refused.value)
        assert "fragment 'log' (tests/test_user_shapes.py:" in message and where in message
        assert "drop ordered=True, or use policy 'single'" in message and "\n" not in message


# ---------------------------------------------------------------- a Python number keeps JAX's weak type


class Bfloat16Weights(Base):
    """Weights kept in bfloat16 (mixed precision), the learning rate a Python float: `lr * grad` stays bfloat16, as
    under `jax.jit`, so the state's dtype does not change."""

    def init(self, key):
        state = super().init(key)
        return state.replace(w=state.w.astype(jnp.bfloat16), target=state.target.astype(jnp.bfloat16))

    def iteration(self, state):
        y, data = self.sample(state.w.astype(jnp.float32), state.data)
        w, metrics = self.learn(state.w, data.x, y, 0.05)
        return self.finish(state, w, data, metrics, self.polyak(state.target, w))


def test_a_python_float_argument_keeps_a_bfloat16_state_bfloat16_as_jit_does():
    algo = Bfloat16Weights()
    prog = fragc.compile(algo, "single")
    state = prog.init(0)
    got, _ = prog.run(state, 3)
    assert got.w.dtype == jnp.bfloat16 and got.target.dtype == jnp.bfloat16
    expected = algo.init(jax.random.key(0))
    for _ in range(3):
        expected, _ = jax.jit(algo.iteration)(expected)
    assert_trees_close(got, expected, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- one function, two fragments; a batch taken whole


def test_one_function_decorated_twice_is_two_fragments_each_with_its_role_axes_and_group():
    """DQN's Q forward pass as the actor's (batch-split) and as the learner's target (whole): once, the second call
    became the first's fragment (its role, its axes, the actors' devices) without a word."""
    module = fragc.trace(HELD_OUT["same_function_two_roles"]())
    declared = {n: (f.role, f.in_axes, f.out_axes) for n, f in module.fragments.items() if n.startswith("advantage")}
    assert sorted(declared.values()) == [("actor", (None, 0), (0,)), ("learner", (None, None), (None,))]
    prog = fragc.compile(HELD_OUT["same_function_two_roles"](), "actor_learner", devices=8)
    groups = {f.role: f.placement.group for n, f in prog.module.fragments.items() if n.startswith("advantage")}
    assert groups == {"actor": "actors", "learner": "learner"}


def test_an_actors_batch_handed_whole_to_a_buffer_runs_as_jit_runs_it():
    """A per-environment output passed straight to an argument declared `None` is the whole batch, as when the user's
    own glue sits between them (it was refused by the IR verifier, naming no line)."""
    algo = HELD_OUT["whole_batch_to_buffer"]()
    prog = fragc.compile(algo, "single")
    got, _ = prog.run(prog.init(0), 3)
    expected = algo.init(jax.random.key(0))
    for _ in range(3):
        expected, _ = jax.jit(algo.iteration)(expected)
    assert_trees_close(got, expected, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- more user mistakes, each one line


class PmapStyle(Base):
    """pmap-era code: a collective over an axis name of the user's own."""

    @fragc.fragment(role="learner", in_axes=(None, 0, 0, None), out_axes=(None, None))
    def learn(self, w, x, y, lr):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - lr * jax.lax.pmean(grad, axis_name="batch"), {"loss": loss}

    iteration = WRITTEN["const_float"].iteration


@fragc.fragment(role="learner", in_axes=(None, 0, 0, None), out_axes=(None, None))
@functools.partial(jax.jit, static_argnames=("squared",))
def fit(w, x, y, squared=True):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2 if squared else jnp.abs(x @ w - y)))(w)
    return w - 0.1 * fragc.pmean(grad), {"loss": fragc.pmean(loss)}


class StaticFlagIntoJit(Base):
    """CleanRL's `@partial(jax.jit, static_argnames=...)` update made a fragment and given a Python bool."""

    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = fit(state.w, data.x, y, True)
        return self.finish(state, w, data, m)


class CollidingMetrics(Base):
    def iteration(self, state):
        y, data = self.sample(state.w, state.data)
        w, m = self.learn(state.w, data.x, y, self.lr)
        return self.finish(state, w, data, {"loss": {"mse": m["loss"]}, "loss.mse": 2 * m["loss"]})


class CheckpointedScan(Base):
    def iteration(self, state):
        @jax.checkpoint
        def step(data, _):
            y, data = self.sample(state.w, data)
            return data, y

        data, ys = jax.lax.scan(step, state.data, None, length=2)
        w, m = self.learn(state.w, data.x, ys[-1], self.lr)
        return self.finish(state, w, data, m)


@pytest.mark.parametrize("algo,words", [
    (PmapStyle, ["fragment 'learn' (tests/test_user_shapes.py:", "reduces over axis 'batch'", "fragc.pmean"]),
    (StaticFlagIntoJit, ["fragment 'fit' (tests/test_user_shapes.py:", "traced argument ('squared')",
                         "static argument"]),
    (CollidingMetrics, ["CollidingMetrics.iteration returns two metrics named 'loss.mse' (metrics['loss']['mse'] "
                        "and metrics['loss.mse'])"]),
    (CheckpointedScan, ["fragment 'sample' is called inside jax.checkpoint", "(at tests/test_user_shapes.py:"]),
])
def test_more_user_mistakes_are_refused_in_one_line_naming_their_code(algo, words):
    """Each was JAX's own error from deep inside (an unbound axis name, a traced static argument), a metric dropped
    without a word, or a refusal naming no line ("at ?")."""
    with pytest.raises(fragc.FragcError) as refused:
        fragc.compile(algo(), "single")
    message = str(refused.value)
    assert all(w in message for w in words) and "\n" not in message, message
