"""Periodic evaluation: whole episodes of the deterministic policy on environments of the evaluator's own.

An algorithm's config takes the `EvalConfig` mixin (`--eval-every K --eval-episodes N`); the algorithm makes an
`Evaluator` and calls it from `init` and `iteration`:

    self.evaluator = Evaluator(config.env, self.greedy_action, config.eval_every, config.eval_episodes)

    def init(self, key):
        return self.evaluator.init(key, State(learner, runner))  # with eval_every: the state and the evaluator's

    def iteration(self, state):
        state, eval_metrics = self.evaluator.maybe_evaluate(state, self.policy_params(state))
        ...

With `eval_every` 0 both are no-ops, so the program is exactly the one without evaluation. With K, the iterations
0, K, 2K, ... run the fragment `evaluate` (role "evaluator") under `lax.cond`, an `if` region of the IR: one whole
greedy episode in each of `eval_episodes` environments of its own, split over the evaluator's replicas; the metric
`eval_return` is the latest evaluation's mean return. docs/evaluation.md has the semantics and the placements.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct

import fragc
from fragc.algos.envs import VecEnv
from fragc.ir.errors import FragcError

EVAL_STREAM = 0x6576616C
"""Folded into the algorithm's init key for the evaluator's key: a stream of its own, so that turning
evaluation on leaves every key of training as it was."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Config mixin: the two fields that turn periodic evaluation on (`Evaluator`). Keyword-only, so that a
    config's own fields keep their places as positional arguments."""

    eval_every: int = 0
    """Evaluate the deterministic policy every K iterations (iterations 0, K, 2K, ...), reported as eval_return;
    0: never."""
    eval_episodes: int = 8
    """Episodes per evaluation, one per environment of the evaluator's own; must divide by the evaluator's
    replicas."""


@struct.dataclass
class EvaluatorState:
    """What the evaluator carries from one iteration to the next (replicated)."""

    key: jax.Array  # split every iteration; an evaluation's episodes start from keys split off it
    iteration: jax.Array  # int32: the iterations run so far; an evaluation is due when it divides by eval_every
    eval_return: jax.Array  # float32: the latest evaluation's mean return


@struct.dataclass
class Episodes:
    """One row per evaluation episode: the `evaluate` fragment's batch, split over its replicas."""

    key: jax.Array  # the episode's reset and step keys come from it
    index: jax.Array  # int32: the episode's environment in the evaluator's pool (host environments need it)


@functools.cache
def with_evaluator(state: type) -> type:
    """The training state with evaluation on: a subclass of the pytree dataclass `state` with the evaluator's own
    field `evaluator` (an `EvaluatorState`), named `state.__name__` + "WithEvaluator"; made once per class."""
    name = f"{state.__name__}WithEvaluator"
    return struct.dataclass(type(name, (state,), {"__annotations__": {"evaluator": EvaluatorState},
                                                  "__module__": state.__module__, "__qualname__": name}))


class Evaluator:
    """Evaluation episodes of `greedy_action(params, obs[n, obs_size]) -> actions` on `episodes` fresh
    environments of `env` every `every` iterations (0: never); `Evaluator.recurrent` for a policy that carries
    a state from step to step. The environments are made on first use, a `VecEnv` of the evaluator's own: host
    environments step a pool apart from the training runner's."""

    def __init__(self, env: str, greedy_action: Callable[[Any, jax.Array], jax.Array] | None, every: int = 0,
                 episodes: int = 8):
        self.env_name, self.greedy_action, self.every, self.episodes = env, greedy_action, every, episodes
        self.initial_carry = self.greedy_step = None

    @classmethod
    def recurrent(cls, env: str, initial_carry: Callable[[int], Any],
                  greedy_step: Callable[[Any, Any, jax.Array, jax.Array], tuple[Any, jax.Array]], every: int = 0,
                  episodes: int = 8) -> Evaluator:
        """The evaluator of a recurrent policy: `initial_carry(n)` is the carry of n environments at an episode's
        start, made afresh at each evaluation's start, and `greedy_step(params, carry, obs[n, obs_size],
        reset[n]) -> (carry, actions)` one step of the deterministic policy, where `reset` marks the
        environments whose carry must start afresh (the policy's own reset: its rollout's done flags)."""
        evaluator = cls(env, None, every, episodes)
        evaluator.initial_carry, evaluator.greedy_step = initial_carry, greedy_step
        return evaluator

    @functools.cached_property
    def env(self) -> VecEnv:
        return VecEnv(self.env_name)

    @functools.cached_property
    def max_steps(self) -> int:
        steps = self.env.max_episode_steps
        if not steps:
            raise FragcError(f"evaluation plays whole episodes, but {self.env_name} sets no time limit "
                             "(max_episode_steps); use eval_every 0, or an environment with a time limit")
        return steps

    def init(self, key: jax.Array, state: Any, eval_state: type | None = None) -> Any:
        """The initial training state: `state` as it is when evaluation is off, else the same fields and the
        evaluator's (`with_evaluator(type(state))`, or a subclass of `state`'s class with a field `evaluator` given
        as `eval_state`), whose key comes from `key` (the algorithm's init key) by a stream of its own."""
        if not self.every:
            return state
        eval_state = with_evaluator(type(state)) if eval_state is None else eval_state
        if not (dataclasses.is_dataclass(eval_state) and issubclass(eval_state, type(state))
                and "evaluator" in {f.name for f in dataclasses.fields(eval_state)}):
            raise FragcError(f"Evaluator.init: {getattr(eval_state, '__name__', eval_state)!r} must be a subclass "
                             f"of {type(state).__name__} with a field `evaluator` (src/fragc/algos/evaluation.py)")
        evaluator = EvaluatorState(jax.random.fold_in(key, EVAL_STREAM), jnp.int32(0), jnp.float32(0.0))
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
        return eval_state(**fields, evaluator=evaluator)

    def maybe_evaluate(self, state: Any, params: Any) -> tuple[Any, dict]:
        """Evaluate `params` if this iteration is due -> (`state` with the evaluator's next state,
        {"eval_return": the latest evaluation's mean return}); (`state`, {}) when evaluation is off."""
        if not self.every:
            return state, {}
        evaluator = state.evaluator
        key, episodes_key = jax.random.split(evaluator.key)
        episodes = Episodes(jax.random.split(episodes_key, self.episodes), jnp.arange(self.episodes, dtype=jnp.int32))
        eval_return = jax.lax.cond(evaluator.iteration % self.every == 0,
                                   lambda: self.evaluate(params, episodes), lambda: evaluator.eval_return)
        evaluator = EvaluatorState(key, evaluator.iteration + 1, eval_return)
        return state.replace(evaluator=evaluator), {"eval_return": eval_return}

    @fragc.fragment(role="evaluator", in_axes=(None, 0), out_axes=None)
    def evaluate(self, params: Any, eval_episodes: Episodes) -> jax.Array:
        """One episode per row of `eval_episodes` with the greedy policy -> the mean return over all of them.

        Every environment steps until each of this replica's episodes has ended, at most the environment's
        time limit; an environment's reward counts while its first episode runs (environments reset
        themselves when an episode ends). An episode is what the training statistics count (`Step.counted`):
        an Atari game's unclipped score over the whole game, every life. A `lax.while_loop`, not a scan over
        the time limit: early in training episodes end long before it (CartPole's greedy policy at
        initialisation: about 10 steps of 500), and the result is the same."""
        runner = self.env.reset_each(eval_episodes.key, eval_episodes.index)

        def not_over(carry: tuple) -> jax.Array:
            t, _, running, _, _ = carry
            return (t < self.max_steps) & jnp.any(running)

        def step(carry: tuple) -> tuple:
            t, runner, running, returns, policy_carry = carry
            policy_carry, actions = self.act(params, policy_carry, runner.obs, running)
            runner, out = self.env.step(runner, actions)
            score, over = out.counted()  # as the training statistics count
            returns = returns + jnp.where(running, score, 0.0)
            return t + 1, runner, running & ~over, returns, policy_carry

        n = runner.obs.shape[0]
        policy_carry = None if self.greedy_step is None else self.initial_carry(n)
        carry = (jnp.int32(0), runner, jnp.ones(n, bool), jnp.zeros_like(runner.episode_return), policy_carry)
        returns = jax.lax.while_loop(not_over, step, carry)[3]
        return fragc.psum(jnp.sum(returns)) / self.episodes

    def act(self, params: Any, policy_carry: Any, obs: jax.Array, running: jax.Array) -> tuple[Any, jax.Array]:
        """One greedy step -> (the policy's next carry, actions); a feed-forward policy's carry is None. A
        recurrent policy's `reset` is where the environment's first episode has ended: exact at the step that
        starts its next episode, and the steps after it do not count (no done flags to carry)."""
        if self.greedy_step is None:
            return None, self.greedy_action(params, obs)
        return self.greedy_step(params, policy_carry, obs, ~running)
