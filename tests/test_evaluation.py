"""Evaluation episodes (src/fragc/algos/evaluation.py): the `evaluate` fragment, role "evaluator", in an `if` region.

Most checks run a toy whose weights act in CartPole (`EvaluatedRegression`: tests/toy_algos.py's
regression, evaluated every 2 iterations), small enough to compile under several policies: its `eval_return`
against a plain gymnax loop outside fragc, the iterations that evaluate, the reference interpreter under
`single`, `anakin` and `actor_learner` (`-m slow`: the pipelined module under `actor_learner_async`), and
its training against the same toy without evaluation. PPO's first evaluation runs outside a program against
the plain loop; its evaluator's placement and delays are read from the placed IR (`-m slow` compiles it
under `anakin` and `actor_learner` against the interpreter, and with host environments). Programs are
compiled once each (module-level caches).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import fragc
import toy_algos
from conftest import assert_trees_close, traced_module
from fragc.algos import dqn, ppo, ppo_continuous
from fragc.algos.evaluation import Evaluator, EvaluatorState, with_evaluator
from fragc.ir.errors import FragcError
from fragc.ir.module import Delay, If, Run
from fragc.passes import default_passes, resolve, run_pipeline

EVERY, EPISODES = 2, 8  # 8 episodes: one per replica under anakin on 8 devices, two under actor_learner
REPLICAS = {"single": 1, "anakin": 8, "actor_learner": {"actor": 4, "learner": 4, "evaluator": 4}}


# ---------------------------------------------------------------- a toy with evaluation

_ACTED_AT: dict[int, list] = {}
"""Per toy (by id): the iteration of every greedy step of its evaluations (a host callback records it)."""


@struct.dataclass
class RegressionEvalState(toy_algos.State):
    evaluator: EvaluatorState


class EvaluatedRegression(toy_algos.Regression):
    """The regression toy, whose weights also act in CartPole: push right when the weighted observations are
    positive. Its parameters for evaluation are (weights, iteration); acting records the iteration."""

    def __init__(self, every: int = EVERY):
        super().__init__(num_envs=8)
        _ACTED_AT[id(self)] = []
        self.evaluator = Evaluator("CartPole-v1", self.greedy_action, every, EPISODES)

    def init(self, key):
        return self.evaluator.init(key, super().init(key), RegressionEvalState)

    def iteration(self, state):
        state, eval_metrics = self.evaluator.maybe_evaluate(state, (state.w, state.step))
        y, data = self.sample(state.data)
        w, metrics = self.learn(state.w, data.x, y)
        return state.replace(w=w, data=data, step=state.step + 1), {**metrics, **eval_metrics}

    def greedy_action(self, params, obs):
        w, step = params
        jax.debug.callback(lambda s: _ACTED_AT[id(self)].append(int(s)), step)
        return greedy_by_weights(w, obs)


@jax.jit
def greedy_by_weights(w, obs):
    return (obs[..., 1:] @ w > 0).astype(jnp.int32)


@functools.cache
def toy() -> EvaluatedRegression:
    return EvaluatedRegression(EVERY)


@functools.cache
def toy_program(policy: str) -> fragc.Program:
    return fragc.compile(toy(), policy, devices=1 if policy == "single" else 8, iterations_per_dispatch=1)


@functools.cache
def toy_run(policy: str, iterations: int):
    """(initial state, final state, history, the iterations its evaluations acted at) of the toy:
    `iterations` iterations from seed 0."""
    prog = toy_program(policy)
    start = prog.init(0)
    acted = _ACTED_AT[id(toy())]
    before = len(acted)
    out, history = prog.run(start, iterations)
    jax.effects_barrier()  # the debug callbacks have run
    return start, out, history, sorted(set(acted[before:]))


@functools.cache
def cartpole():
    import gymnax

    return gymnax.make("CartPole-v1")


def plain_gymnax_return(act, params, evaluator: EvaluatorState, episodes: int = EPISODES) -> float:
    """The mean return of an evaluation, outside fragc: the evaluator's key split as the evaluator splits it,
    then each episode in a Python loop over gymnax's CartPole with `act(params, obs) -> action` (jitted)."""
    env, env_params = cartpole()
    params, evaluator = jax.device_get((params, evaluator))  # from whichever devices a program left them on
    _, episodes_key = jax.random.split(evaluator.key)
    total = 0.0
    for key in jax.random.split(episodes_key, episodes):
        reset_key, key = jax.random.split(key)
        obs, env_state = env.reset(reset_key, env_params)
        for _ in range(env_params.max_steps_in_episode):
            step_key, key = jax.random.split(key)
            obs, env_state, reward, terminated, truncated, _ = env.step(step_key, env_state, act(params, obs),
                                                                         env_params)
            total += float(reward)
            if terminated or truncated:
                break
    return total / episodes


def test_eval_return_is_the_greedy_policys_mean_return_at_iterations_0_k_2k():
    start, out, history, acted_at = toy_run("single", 5)
    assert acted_at == [0, 2, 4]  # evaluate ran at these iterations, and only these
    assert int(start.evaluator.iteration) == 0 and int(out.evaluator.iteration) == 5
    returns = history["eval_return"]
    np.testing.assert_array_equal(returns, np.repeat(returns[[0, 2, 4]], [2, 2, 1]))  # carried over between
    assert returns[0] == plain_gymnax_return(greedy_by_weights, start.w, start.evaluator)
    after_two, _ = toy_program("single").run(start, 2)
    assert returns[2] == plain_gymnax_return(greedy_by_weights, after_two.w, after_two.evaluator)
    assert returns[2] != returns[0]  # the weights learned in between act differently


# anakin with -m slow (the default suite's 6 minutes): actor_learner's cell runs the evaluation on replicas too, on
# the actors' devices, apart from the learner
@pytest.mark.parametrize("policy", ["single", pytest.param("anakin", marks=pytest.mark.slow), "actor_learner"])
def test_equals_the_reference_interpreter(policy):
    """Three iterations: one that evaluates, one that carries the evaluation over, one that evaluates."""
    state, out, history, _ = toy_run(policy, 3)
    module = traced_module(toy_program(policy))
    expected = []
    for _ in range(3):
        state, metrics = fragc.interpret(module, state, replicas=REPLICAS[policy])
        expected.append(metrics["eval_return"])
    chex.assert_trees_all_equal_structs(out, state)
    assert_trees_close(out, state, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(history["eval_return"], expected)
    # the same weights and the same episodes under every policy: the same evaluations
    np.testing.assert_array_equal(history["eval_return"][[0, 2]], toy_run("single", 5)[2]["eval_return"][[0, 2]])


@pytest.mark.slow
def test_under_actor_learner_async_an_evaluation_acts_with_the_actors_stale_weights():
    prog = toy_program("actor_learner_async")
    start, out, history, _ = toy_run("actor_learner_async", 3)
    ref, ref_metrics = fragc.run_iterations(prog.pipeline.after("insert_delays"), start, 3)
    assert_trees_close(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(history["eval_return"], [m["eval_return"] for m in ref_metrics])
    # iteration 2 evaluates the weights after one iteration: those its rollout acts with, one iteration late
    after_one, _ = fragc.interpret(fragc.trace(toy()), start, replicas=REPLICAS["actor_learner"])
    after_two, _ = prog.run(start, 2)
    assert history["eval_return"][2] == plain_gymnax_return(greedy_by_weights, after_one.w, after_two.evaluator)


def test_evaluation_leaves_training_bit_for_bit_as_it_was():
    start, evaluated, _, _ = toy_run("single", 5)
    prog = fragc.compile(toy_algos.Regression(num_envs=8), "single", devices=1, iterations_per_dispatch=1)
    plain, history = prog.run(toy_algos.State(start.w, start.data, start.step), 5)
    assert "eval_return" not in history
    chex.assert_trees_all_equal((evaluated.w, evaluated.data, evaluated.step), (plain.w, plain.data, plain.step))


# ---------------------------------------------------------------- PPO


@functools.cache
def ppo_evaluating() -> ppo.PPO:
    return ppo.PPO(ppo.Config(num_envs=8, num_steps=8, num_minibatches=2, update_epochs=1, eval_every=EVERY,
                              eval_episodes=EPISODES))


def test_ppo_evaluates_its_greedy_policy():
    """PPO's wiring, outside a compiled program: its initial state and one `maybe_evaluate` under jax.jit."""
    algo = ppo_evaluating()
    start = jax.jit(algo.init)(jax.random.key(0))
    assert type(start) is with_evaluator(ppo.State) and isinstance(start, ppo.State)
    evaluated, metrics = jax.jit(lambda s: algo.evaluator.maybe_evaluate(s, algo.policy_params(s)))(start)
    chex.assert_trees_all_equal((evaluated.learner, evaluated.runner), (start.learner, start.runner))
    assert int(evaluated.evaluator.iteration) == 1
    argmax_logits = jax.jit(lambda params, obs: jnp.argmax(algo.model.network.apply(params, obs)[0], -1))
    assert metrics["eval_return"] == plain_gymnax_return(argmax_logits, start.learner.params, start.evaluator)


def test_the_evaluator_runs_on_the_actors_under_actor_learner_or_on_a_group_of_its_own():
    traced = fragc.trace(ppo_evaluating())
    placed = str(run_pipeline(traced, default_passes(resolve("actor_learner", 8), 1)).final)
    assert "fragment @evaluate role=evaluator on @actors shard_map replicas=4" in placed
    own = str(run_pipeline(traced, default_passes(resolve("actor_learner(actors=2,evaluators=2)", 8), 1)).final)
    assert "fragment @rollout role=actor on @actors shard_map replicas=2" in own
    assert "fragment @evaluate role=evaluator on @evaluators shard_map replicas=2" in own
    assert "fragment @learn role=learner on @learner shard_map replicas=4" in own


def test_without_evaluation_the_state_and_the_program_are_the_plain_ones():
    algo = ppo.PPO(ppo.Config(num_envs=8, num_steps=8))
    assert type(jax.eval_shape(algo.init, jax.random.key(0))) is ppo.State
    traced = fragc.trace(algo)
    assert "evaluate" not in traced.fragments and " if " not in str(traced)


def test_under_actor_learner_async_evaluation_reads_the_parameters_the_rollout_reads():
    """PPO: one delay feeds the rollout and the evaluation's `if` region, so neither waits for the learner."""
    module = run_pipeline(fragc.trace(ppo_evaluating()), default_passes(resolve("actor_learner_async", 8), 1)).after(
        "insert_delays")
    (delay,) = [n for n in module.graph.nodes if isinstance(n, Delay)]
    (branch,) = [n for n in module.graph.nodes if isinstance(n, If)]
    (rollout,) = [n for n in module.graph.nodes if isinstance(n, Run) and n.fragment == "rollout"]
    for node in (branch, rollout):
        assert any(u.value is delay.outputs[0] for u in node.inputs)
        assert not any(u.value is module.graph.inputs[0] and u.type.group == "learner" for u in node.inputs)


def test_eval_episodes_that_the_replicas_do_not_divide_are_refused_in_one_line():
    algo = ppo.PPO(ppo.Config(num_envs=8, num_steps=8, eval_every=1, eval_episodes=4))
    with pytest.raises(FragcError) as err:
        run_pipeline(fragc.trace(algo), default_passes(resolve("anakin", 8), 1))
    message = str(err.value)
    assert "\n" not in message
    assert "eval_episodes" in message and "length 4, which 8 replicas do not divide" in message


def test_config_ranges():
    with pytest.raises(FragcError, match=r"^ppo: eval_every must be at least 0, got -1$"):
        ppo.Config(eval_every=-1)
    with pytest.raises(FragcError, match=r"^dqn: eval_episodes must be positive, got 0$"):
        dqn.Config(eval_episodes=0)


def test_policy_parameters_by_name():
    policy = resolve("actor_learner(actors=3,evaluators=1)", 8)
    assert policy.name == "actor_learner(actors=3,evaluators=1)"
    assert dict(policy.groups) == {"actors": (0, 1, 2), "evaluators": (3,), "learner": (4, 5, 6, 7)}
    assert resolve("actor_learner", 8).name == resolve("actor_learner()", 8).name == "actor_learner"
    assert resolve("actor_learner_async(evaluators=2)", 8).staleness == 1
    for bad, says in [("actor_learner(learners=2)", "takes actors=INT, staleness=INT, evaluators=INT; got 'learners=2"),
                      ("actor_learner(actors=two)", "got 'actors=two'"),
                      ("anakin(evaluators=1)", "policy 'anakin' takes no parameters"),
                      ("actor_learner(evaluators=7)", "needs at least 9 devices")]:
        with pytest.raises(FragcError, match=says.replace("(", r"\(").replace(")", r"\)")):
            resolve(bad, 8)


def test_greedy_action_of_continuous_ppo_is_the_mean_clipped_as_env_action_clips():
    algo = ppo_continuous.PPOContinuous(ppo_continuous.Config(num_envs=8))
    obs = jnp.linspace(-1, 1, 5 * algo.env.obs_size).reshape(5, -1)

    @jax.jit
    def actions_and_means(key):
        params = algo.model.network.init(key, obs[:1])
        (mean, _), _ = algo.model.network.apply(params, obs)
        shifted = jax.tree.map(lambda x: x, params)
        shifted["params"]["actor"]["Dense_2"]["bias"] += 10.0  # a mean beyond Pendulum's bound of 2
        return algo.greedy_action(params, obs), mean, algo.greedy_action(shifted, obs)

    action, mean, beyond = actions_and_means(jax.random.key(0))
    chex.assert_trees_all_equal(action, jnp.clip(mean, -2.0, 2.0))
    chex.assert_trees_all_equal(beyond, jnp.full((5, 1), 2.0))


# ---------------------------------------------------------------- -m slow: PPO compiled, host environments


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["anakin", "actor_learner", "actor_learner(actors=2,evaluators=2)"])
def test_ppo_equals_the_reference_interpreter(policy):
    algo = ppo_evaluating()
    prog = fragc.compile(algo, policy, devices=8, iterations_per_dispatch=1)
    state = prog.init(0)
    out, history = prog.run(state, 3)
    roles = {"anakin": 8, "actor_learner": {"actor": 4, "learner": 4, "evaluator": 4}}.get(
        policy, {"actor": 2, "learner": 4, "evaluator": 2})
    module, expected = fragc.trace(algo), []
    for _ in range(3):
        state, metrics = fragc.interpret(module, state, replicas=roles)
        expected.append(metrics["eval_return"])
    assert_trees_close(out, state, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(history["eval_return"], expected, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.xla_defaults
def test_ppo_training_is_bit_for_bit_the_same_with_evaluation():
    outs = []
    for every in (0, EVERY):
        algo = ppo.PPO(ppo.Config(num_envs=8, num_steps=8, num_minibatches=2, update_epochs=1, eval_every=every))
        prog = fragc.compile(algo, "single", devices=1)
        outs.append(prog.run(prog.init(0), 5)[0])
    chex.assert_trees_all_equal((outs[0].learner, outs[0].runner), (outs[1].learner, outs[1].runner))


@pytest.mark.slow
@pytest.mark.parametrize("policy,env_groups", [("single", 1), ("anakin", 2)])
def test_host_environments_evaluate_in_the_program(policy, env_groups):
    """The evaluator steps a Gymnasium pool of its own in-program, whatever env_groups the rollout uses."""
    outs = []
    for every in (0, EVERY):
        algo = ppo.PPO(ppo.Config(env="gymnasium:CartPole-v1", num_envs=8, num_steps=8, num_minibatches=2,
                                  update_epochs=1, eval_every=every))
        prog = fragc.compile(algo, policy, devices=1 if policy == "single" else 2, env_groups=env_groups)
        out, history = prog.run(prog.init(0), 3)
        outs.append(out)
    assert "evaluate" in prog.module.fragments and prog.module.fragments["evaluate"].placement.env_groups == 0
    assert np.all(history["eval_return"] > 5) and history["eval_return"][0] == history["eval_return"][1]
    chex.assert_trees_all_equal(outs[0].learner, outs[1].learner)
