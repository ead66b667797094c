"""Gumbel MuZero on discrete-action environments (MinAtar's games), as two fragments: `rollout` (actor) and `learn`
(learner).

Schrittwieser et al. 2020 (MuZero) with Danihelka et al. 2022's Gumbel search. The agent learns a model in three
networks: representation h(obs) -> s, dynamics g(s, a) -> (s', reward) and prediction f(s) -> (policy, value). Every
environment step is chosen by `mctx.gumbel_muzero_policy` over that model (`num_simulations`, discount `gamma`),
inside the actor's fragment; each environment searches with a key of its own, so the steps do not depend on how the
environments are split over replicas. From the rollout come, per step:
  - the policy target: the search's improved policy (`action_weights`);
  - the value target: the TD(lambda) return (`returns.gae`) bootstrapped from the search's root values (and, where an
    episode was cut by its time limit or by the rollout's end, from the network's value of the state reached).
The learner takes every step of the rollout as the start of a `unroll_steps` unroll of the model: from h(obs_t) it
applies g with the actions taken, and at each unrolled step scores f's policy against the search's, f's value and g's
reward against their targets. A step past the episode's end or the rollout's is masked out. Value and reward are
categorical over `2 * support + 1` atoms of MuZero's transformed scale h(x) = sign(x)(sqrt(|x| + 1) - 1) + 0.001 x,
trained by cross-entropy against the two-hot target. The hidden state is min-max scaled to [0, 1] and its gradient
halved at each unrolled step, as MuZero's. It is on-policy: each rollout is learned from for `num_epochs`, then
dropped (no replay buffer, no reanalyse), as PQN's rollouts are, so the two compare at equal environment steps.

Deterministic actions (evaluation, inference) are the search's with its Gumbel noise off. `mctx` is an extra
(`pip install 'fragc[search]'`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

import fragc
from fragc.algos import losses, returns
from fragc.algos.actor_critic import Learner, State  # the model's parameters, Adam's state and a key; the runner
from fragc.algos.diagnostics import episode_metrics
from fragc.algos.envs import Runner, VecEnv, discrete_env
from fragc.algos.evaluation import EvalConfig, Evaluator
from fragc.algos.minibatches import flatten_steps, shuffled
from fragc.algos.run_length import RunLength
from fragc.ir.errors import FragcError


@dataclasses.dataclass(frozen=True)
class Config(RunLength, EvalConfig):
    env: str = "Breakout-MinAtar"
    """Environment: a gymnax id, or BACKEND:ID for a host backend (fragc envs); discrete actions."""
    num_envs: int = 64
    """Environments stepped in parallel, each searching every step."""
    num_steps: int = 32
    """Steps per environment in one rollout."""
    total_steps: int = 1_000_000
    """Environment steps over the whole run."""
    num_simulations: int = 8
    """Search simulations per step."""
    max_considered_actions: int = 16
    """Actions the Gumbel search considers at the root (mctx's max_num_considered_actions)."""
    value_scale: float = 0.02
    """mctx's value_scale: how far one search moves the policy target from the prior, in logits per unit of the
    tree's value range (times 50 + the most visits). mctx's 0.1 collapsed the policy to one action on
    Breakout-MinAtar within 200k steps."""
    ent_coef: float = 0.0
    """Weight of the policy's entropy bonus."""
    unroll_steps: int = 5
    """Steps the model is unrolled in the loss (MuZero's K)."""
    gamma: float = 0.99
    """Discount factor, of the search and of the targets."""
    td_lambda: float = 0.95
    """lambda of the value targets' TD(lambda) returns over the search's root values."""
    support: int = 10
    """Value and reward are categorical over the integers -support..support of MuZero's transformed scale h(x)."""
    num_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 8
    """Minibatches per epoch."""
    lr: float = 1e-3
    """Adam learning rate."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""
    value_coef: float = 0.25
    """Weight of the value loss (MuZero's 0.25)."""
    hidden: int = 256
    """Width of the networks' hidden layers."""
    embedding: int = 128
    """Size of the model's hidden state."""

    def __post_init__(self) -> None:
        self.check_fields()
        if self.steps_per_iteration % self.num_minibatches:
            raise FragcError(f"muzero: num_envs * num_steps ({self.steps_per_iteration}) must divide by "
                             f"num_minibatches ({self.num_minibatches})")


# ---------------------------------------------------------------- categorical values on MuZero's scale


def scale(x: jax.Array) -> jax.Array:
    """MuZero's h(x) = sign(x)(sqrt(|x| + 1) - 1) + 0.001 x."""
    return jnp.sign(x) * (jnp.sqrt(jnp.abs(x) + 1.0) - 1.0) + 1e-3 * x


def unscale(y: jax.Array) -> jax.Array:
    """h's inverse."""
    eps = 1e-3
    return jnp.sign(y) * (((jnp.sqrt(1.0 + 4.0 * eps * (jnp.abs(y) + 1.0 + eps)) - 1.0) / (2.0 * eps)) ** 2 - 1.0)


def two_hot(x: jax.Array, support: int) -> jax.Array:
    """h(x) as probabilities over the atoms -support..support, split between the two atoms around it."""
    y = jnp.clip(scale(x), -support, support)
    low = jnp.floor(y)
    high_weight = (y - low)[..., None]
    atoms = jnp.arange(-support, support + 1, dtype=y.dtype)
    return (atoms == low[..., None]) * (1.0 - high_weight) + (atoms == low[..., None] + 1.0) * high_weight


def expected(logits: jax.Array, support: int) -> jax.Array:
    """The value a categorical over h's atoms stands for: h's inverse of its mean."""
    atoms = jnp.arange(-support, support + 1, dtype=logits.dtype)
    return unscale(jnp.sum(jax.nn.softmax(logits) * atoms, -1))


# ---------------------------------------------------------------- networks


def _layer(n: int) -> nn.Module:
    return nn.Sequential([nn.Dense(n), nn.LayerNorm(), nn.relu])


def _min_max(s: jax.Array) -> jax.Array:
    """MuZero's scaling of a hidden state to [0, 1], per sample."""
    low, high = jnp.min(s, -1, keepdims=True), jnp.max(s, -1, keepdims=True)
    return (s - low) / jnp.maximum(high - low, 1e-8)


class MuZeroNet(nn.Module):
    """The learned model: `represent`, `dynamics` and `predict`, each an MLP with LayerNorm."""

    num_actions: int
    atoms: int
    hidden: int
    embedding: int

    def setup(self) -> None:
        self.represent_net = nn.Sequential([_layer(self.hidden), nn.Dense(self.embedding)])
        self.dynamics_net = nn.Sequential([_layer(self.hidden), nn.Dense(self.embedding)])
        self.reward_net = nn.Sequential([_layer(self.hidden), nn.Dense(self.atoms)])
        self.predict_net = _layer(self.hidden)
        self.policy_head = nn.Dense(self.num_actions)
        self.value_head = nn.Dense(self.atoms)

    def __call__(self, obs: jax.Array, action: jax.Array) -> tuple:
        """Every part once (what `init` runs)."""
        s = self.represent(obs)
        return self.predict(s), self.dynamics(s, action)

    def represent(self, obs: jax.Array) -> jax.Array:
        """obs [B, obs_size] -> hidden state [B, embedding]."""
        return _min_max(self.represent_net(obs))

    def dynamics(self, s: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(hidden state, action [B]) -> (next hidden state, the reward's logits over the atoms)."""
        x = jnp.concatenate([s, jax.nn.one_hot(action, self.num_actions)], -1)
        return _min_max(self.dynamics_net(x)), self.reward_net(x)

    def predict(self, s: jax.Array) -> tuple[jax.Array, jax.Array]:
        """hidden state -> (policy logits [B, A], the value's logits over the atoms)."""
        x = self.predict_net(s)
        return self.policy_head(x), self.value_head(x)


# ---------------------------------------------------------------- state


@struct.dataclass
class Trajectory:
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    done: jax.Array  # the episode ended at this step (terminated or truncated)
    policy_target: jax.Array  # the search's improved policy
    value_target: jax.Array  # TD(lambda) over the search's root values


@struct.dataclass
class _Steps:
    """What `returns.gae` reads of a rollout: the search's root values as the values."""

    reward: jax.Array
    value: jax.Array
    next_value: jax.Array
    terminated: jax.Array
    done: jax.Array


@struct.dataclass
class Unroll:
    """One start step's unroll: its observation, the K actions taken from it, and K + 1 targets with their masks."""

    obs: jax.Array
    actions: jax.Array  # [K]
    rewards: jax.Array  # [K]: the reward of each action
    policy_targets: jax.Array  # [K + 1, A]
    value_targets: jax.Array  # [K + 1]
    mask: jax.Array  # [K + 1]: the step lies in the start's episode and in the rollout


def unrolls(traj: Trajectory, k: int) -> Unroll:
    """Every step t of a [T, N] trajectory as the start of a k-step unroll -> [T, N] unrolls. The targets of step
    t + j are masked where an episode ended at t..t+j-1, or where t + j lies past the rollout's end."""
    T = traj.obs.shape[0]
    index = jnp.arange(T)[:, None] + jnp.arange(k + 1)[None, :]  # [T, K + 1]
    take = lambda x: jnp.moveaxis(x[jnp.minimum(index, T - 1)], 2, 1)  # noqa: E731  [T, N, K + 1, ...]
    done = take(traj.done).astype(jnp.float32)
    alive = jnp.cumprod(1.0 - done, axis=2)  # no episode end at t..t+j
    mask = jnp.concatenate([jnp.ones_like(alive[..., :1]), alive[..., :-1]], axis=2) * (index < T)[:, None, :]
    return Unroll(traj.obs, take(traj.action)[..., :k], take(traj.reward)[..., :k], take(traj.policy_target),
                  take(traj.value_target), mask)


def scale_gradient(x: jax.Array, factor: float) -> jax.Array:
    """x, its gradient multiplied by `factor` (MuZero halves it at each unrolled step of the dynamics)."""
    return x * factor + jax.lax.stop_gradient(x) * (1.0 - factor)


def qtransform_tree_min_max(tree: Any, node_index: jax.Array, value_scale: float = 0.1) -> jax.Array:
    """mctx's completed Q-values (`qtransform_completed_by_mix_value`'s, the mixed value for unvisited actions),
    scaled to [0, 1] by the least and greatest value anywhere in the search tree (MuZero's MinMaxStats) rather than
    among the node's children: with few actions (MinAtar's 3 to 6, CartPole's 2) the children's own range sends
    their smallest difference to the whole of [0, 1], and the policy target to one action whatever the values."""
    mctx = import_mctx()
    visits = tree.children_visits[node_index]
    visit_scale = 50.0 + jnp.max(visits)  # mctx's maxvisit_init + max(visit_counts)
    completed = mctx.qtransform_completed_by_mix_value(tree, node_index, value_scale=1.0, maxvisit_init=1.0,
                                                       rescale_values=False) / (1.0 + jnp.max(visits))
    known = jnp.concatenate([jnp.where(tree.node_visits > 0, tree.node_values, jnp.nan), completed])
    low, high = jnp.nanmin(known), jnp.nanmax(known)
    return visit_scale * value_scale * (completed - low) / jnp.maximum(high - low, 1e-8)


def import_mctx() -> Any:
    """mctx, an optional extra: refused in one line where it is not installed."""
    try:
        import mctx
    except ImportError as err:
        raise FragcError("muzero searches with mctx: pip install 'fragc[search]'") from err
    return mctx


# ---------------------------------------------------------------- algorithm


class MuZero:
    """Gumbel MuZero, its model learned, on-policy."""

    Config = Config

    def __init__(self, config: Config | None = None):
        self.config = c = self.Config() if config is None else config
        self.steps_per_iteration = c.steps_per_iteration
        self.evaluator = Evaluator(c.env, self.greedy_action, c.eval_every, c.eval_episodes)
        import_mctx()

    @functools.cached_property
    def env(self) -> VecEnv:
        return discrete_env(self.config.env, "muzero")

    @functools.cached_property
    def network(self) -> MuZeroNet:
        c = self.config
        return MuZeroNet(int(self.env.action_space.n), 2 * c.support + 1, c.hidden, c.embedding)

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """Built where it is used, not cached: a hyperparameter sweep traces it with each member's values."""
        return optax.chain(optax.clip_by_global_norm(self.config.max_grad_norm), optax.adam(self.config.lr))

    def init(self, key: jax.Array) -> State:
        k_params, k_env, k_learn = jax.random.split(key, 3)
        params = self.network.init(k_params, jnp.zeros((1, self.env.obs_size)), jnp.zeros((1,), jnp.int32))["params"]
        state = State(Learner(params, self.optimizer.init(params), k_learn), self.env.reset(k_env, self.config.num_envs))
        return self.evaluator.init(key, state)

    def iteration(self, state: State) -> tuple[State, dict]:
        state, eval_metrics = self.evaluator.maybe_evaluate(state, self.policy_params(state))  # when due
        traj, runner, rollout_metrics = self.rollout(state.learner.params, state.runner)
        learner, loss_metrics = self.learn(state.learner, traj)
        return state.replace(learner=learner, runner=runner), {**rollout_metrics, **loss_metrics, **eval_metrics}

    def apply(self, params: Any, method: str, *args: jax.Array) -> Any:
        return self.network.apply({"params": params}, *args, method=method)

    # SEARCH: Gumbel MuZero over the learned model
    def search(self, params: Any, key: jax.Array, obs: jax.Array, gumbel_scale: float = 1.0) -> Any:
        """The search from observations `obs` [B, obs_size] -> mctx's PolicyOutput."""
        mctx, c = import_mctx(), self.config
        s = self.apply(params, "represent", obs)
        logits, value_logits = self.apply(params, "predict", s)
        root = mctx.RootFnOutput(prior_logits=logits, value=expected(value_logits, c.support), embedding=s)
        return mctx.gumbel_muzero_policy(params, key, root, self.model_step, c.num_simulations,
                                         max_num_considered_actions=c.max_considered_actions, gumbel_scale=gumbel_scale,
                                         qtransform=functools.partial(qtransform_tree_min_max,
                                                                      value_scale=c.value_scale))

    def model_step(self, params: Any, key: jax.Array, action: jax.Array, s: jax.Array) -> tuple[Any, jax.Array]:
        """mctx's `recurrent_fn`: a step of the learned model, discounted by gamma."""
        mctx, c = import_mctx(), self.config
        s, reward_logits = self.apply(params, "dynamics", s, action)
        logits, value_logits = self.apply(params, "predict", s)
        out = mctx.RecurrentFnOutput(reward=expected(reward_logits, c.support),
                                     discount=jnp.full(action.shape, c.gamma), prior_logits=logits,
                                     value=expected(value_logits, c.support))
        return out, s

    # COLLECT TRAJECTORIES: a search per step, each environment with its own key; the value targets
    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None))
    def rollout(self, params: Any, runner: Runner) -> tuple[Trajectory, Runner, dict]:
        c = self.config

        def one_search(key: jax.Array, obs: jax.Array) -> tuple:
            out = self.search(params, key, obs[None])
            return out.action[0], out.action_weights[0], out.search_tree.summary().value[0]

        def step(runner: Runner, _: None) -> tuple[Runner, tuple]:
            keys = jax.vmap(lambda k: jax.random.split(k, 3))(runner.key)  # search, env, carried
            action, weights, root_value = jax.vmap(one_search)(keys[:, 0], runner.obs)
            obs = runner.obs
            runner, out = self.env.step(runner.replace(key=keys[:, 2]), action, keys[:, 1])
            return runner, (obs, action, weights, root_value, out.reward, out.terminated, out.episode_done,
                            out.final_obs)

        runner, (obs, action, weights, value, reward, terminated, done, final_obs) = jax.lax.scan(
            step, runner, None, c.num_steps)
        # the next step's root value within an episode; the network's value of the state reached where the episode
        # ended (a truncation bootstraps from it) or the rollout did
        final_value = expected(self.apply(params, "predict", self.apply(params, "represent", final_obs))[1], c.support)
        next_value = jnp.where(done, final_value, jnp.concatenate([value[1:], final_value[-1:]]))
        _, value_target = returns.gae(_Steps(reward, value, next_value, terminated, done), c.gamma, c.td_lambda)
        metrics = {**episode_metrics(runner), "root_value": fragc.pmean(jnp.mean(value))}
        return Trajectory(obs, action, reward, done, weights, value_target), runner, metrics

    # UPDATE MODEL: every step the start of an unroll, `num_epochs` passes in shuffled minibatches
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, traj: Trajectory) -> tuple[Learner, dict]:
        c = self.config
        batch = flatten_steps(unrolls(traj, c.unroll_steps))

        def minibatch_step(learner: Learner, mb: Unroll) -> tuple[Learner, dict]:
            return losses.gradient_step(learner, self.loss, (mb,), self.optimizer, self.config.lr)

        def epoch(learner: Learner, _: None) -> tuple[Learner, dict]:
            key, perm_key = jax.random.split(learner.key)
            return jax.lax.scan(minibatch_step, learner.replace(key=key), shuffled(perm_key, batch, c.num_minibatches))

        learner, metrics = jax.lax.scan(epoch, learner, None, c.num_epochs)
        return learner, fragc.pmean(jax.tree.map(jnp.mean, metrics))

    def loss(self, params: Any, mb: Unroll) -> tuple[jax.Array, dict]:
        """Over the K + 1 unrolled steps, each masked: the policy's cross-entropy against the search's, and the
        value's and the reward's against their two-hot targets; the mean over steps and samples."""
        c = self.config
        s = self.apply(params, "represent", mb.obs)
        terms = {"policy_loss": 0.0, "value_loss": 0.0, "reward_loss": 0.0, "entropy": 0.0}
        for j in range(c.unroll_steps + 1):
            logits, value_logits = self.apply(params, "predict", s)
            mask = mb.mask[:, j]
            terms["policy_loss"] += optax.softmax_cross_entropy(logits, mb.policy_targets[:, j]) * mask
            terms["entropy"] += -jnp.sum(jax.nn.softmax(logits) * jax.nn.log_softmax(logits), -1) * mask
            terms["value_loss"] += optax.softmax_cross_entropy(value_logits,
                                                               two_hot(mb.value_targets[:, j], c.support)) * mask
            if j < c.unroll_steps:
                s, reward_logits = self.apply(params, "dynamics", s, mb.actions[:, j])
                terms["reward_loss"] += optax.softmax_cross_entropy(reward_logits,
                                                                    two_hot(mb.rewards[:, j], c.support)) * mask
                s = scale_gradient(s, 0.5)
        terms = {name: jnp.mean(term) / (c.unroll_steps + 1) for name, term in terms.items()}
        loss = (terms["policy_loss"] + c.value_coef * terms["value_loss"] + terms["reward_loss"]
                - c.ent_coef * terms["entropy"])
        return loss, {"loss": loss, **terms}

    # THE DETERMINISTIC POLICY: the search without its Gumbel noise
    def policy_params(self, state: State) -> Any:
        """The model's parameters (the actors search with them)."""
        return state.learner.params

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        """The search's action for each of `obs[n, obs_size]`, its Gumbel noise off."""
        return self.search(params, jax.random.key(0), obs, gumbel_scale=0.0).action

