"""Recurrent PPO (PureJaxRL's ppo_rnn.py design), as two fragments: `rollout` (actor) and `learn` (learner).

A GRU (flax `nn.GRUCell` scanned over time) sits between an embedding layer and the actor and critic heads. Its hidden
state lives per environment beside the runner, and is reset to zeros where the previous step ended an episode. Each
rollout stores the hidden state it started from, and the learner replays whole environment sequences from it:
minibatches split the environment axis, not time. Config fields give sb3-contrib's RecurrentPPO instead (`critic_gru`,
`lstm`, `embed=False`, `ortho_init=False`, `normalize_obs`: VecNormalize) and the memory task (`mask_velocity`: a
feed-forward policy sees only CartPole's positions and cannot solve it). With `eval_every` the greedy policy is
evaluated carrying the hidden state through each episode (`Evaluator.recurrent`), on observations normalized by the
statistics of the moment, frozen.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

import fragc
from fragc.algos import actor_critic, losses, ppo
from fragc.algos.actor_critic import count_episodes, log_prob_of
from fragc.algos.diagnostics import episode_metrics, explained_variance
from fragc.algos.envs import Runner, Step, VecEnv, discrete_env
from fragc.algos.evaluation import Evaluator
from fragc.algos.networks import dense
from fragc.algos.returns import gae
from fragc.algos.sac import TORCH_INIT
from fragc.algos.validation import algo_name
from fragc.ir.errors import FragcError

CARTPOLE_VELOCITIES = (1, 3)
"""CartPole's observation is (x, x_dot, theta, theta_dot): the velocities are indices 1 and 3."""


@dataclasses.dataclass(frozen=True)
class Config(actor_critic.Config):
    """The actor-critics' fields (actor_critic.py) and the recurrent network's, at PureJaxRL's ppo_rnn.py values."""

    num_envs: int = 16
    """Environments stepped in parallel (PureJaxRL uses 4; 16 leaves each of up to 8 replicas whole sequences
    for `num_minibatches`)."""
    num_steps: int = 128
    """Steps per environment in one rollout (the length of the sequences the GRU is trained on)."""
    update_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 2
    """Minibatches per epoch, each a set of whole environment sequences (num_envs must divide by it)."""
    clip_eps: float = 0.2
    """PPO ratio clip (at the start, when annealed)."""
    anneal_clip: bool = False
    """Anneal the ratio clip linearly towards zero, as SB3's `lin_0.2` clip range (the zoo's): iteration i's update
    clips at clip_eps * (1 - (i + 1) / iterations), since SB3 evaluates its schedule after each rollout. The value's
    clip (clip_value) stays clip_eps."""
    clip_value: bool = True
    """Clip the value's change from the rollout's value to `clip_eps` in the value loss (PureJaxRL's); SB3's
    default (clip_range_vf=None) does not."""
    hidden: int = 128
    """Width of the embedding, of the GRU's hidden state and of the actor's and critic's hidden layer."""
    critic_gru: bool = False
    """Give the critic an embedding and GRU (or LSTM) of its own (SB3's enable_critic_lstm) instead of sharing the
    actor's."""
    lstm: bool = False
    """An LSTM cell (SB3's RecurrentPPO) in place of the GRU (PureJaxRL's); its carry is twice the hidden width."""
    embed: bool = True
    """A dense relu layer between the observation and the recurrent cell (PureJaxRL's); SB3's MlpLstmPolicy feeds
    the observation to its LSTM directly (False)."""
    ortho_init: bool = True
    """Orthogonal init of the dense layers (PureJaxRL's; SB3's ortho_init=True); False: PyTorch's default nn.Linear
    init, which SB3 keeps with ortho_init=False (the recurrent cells keep flax's init either way)."""
    mask_velocity: bool = False
    """Remove CartPole's velocities (observation indices 1 and 3): the memory task."""
    normalize_obs: bool = False
    """Normalize observations as SB3's VecNormalize(norm_obs=True): a running mean and variance of every
    observation seen (all environments, all steps), each observation fed to the network (and stored for the
    learner) as (obs - mean) / sqrt(var + 1e-8), clipped to [-10, 10]."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_envs % self.num_minibatches:
            raise FragcError(f"ppo_rnn: num_envs ({self.num_envs}) must divide by num_minibatches "
                             f"({self.num_minibatches}): minibatches are whole environment sequences")


# ---------------------------------------------------------------- masked observations


class MaskedVelocity:
    """A VecEnv whose observations lose the entries at `drop` (CartPole's velocities)."""

    def __init__(self, env: VecEnv, drop: tuple[int, ...] = CARTPOLE_VELOCITIES):
        self.env = env
        self.keep = np.array([i for i in range(env.obs_size) if i not in drop])

    def __getattr__(self, name: str) -> Any:  # action_space, is_discrete, max_episode_steps, ...
        return getattr(self.env, name)

    @property
    def obs_size(self) -> int:
        return len(self.keep)

    def mask(self, obs: jax.Array) -> jax.Array:
        return obs[..., self.keep]

    def reset(self, key: jax.Array, num_envs: int) -> Runner:
        runner = self.env.reset(key, num_envs)
        return runner.replace(obs=self.mask(runner.obs))

    def step(self, runner: Runner, action: jax.Array, step_keys: jax.Array | None = None) -> tuple[Runner, Step]:
        runner, out = self.env.step(runner, action, step_keys)  # the step reads env_state, not obs
        return runner.replace(obs=self.mask(runner.obs)), out.replace(final_obs=self.mask(out.final_obs))


# ---------------------------------------------------------------- network


class ScannedGRU(nn.Module):
    """A GRU cell scanned over time (axis 0): inputs ([T, B, D] features, [T, B] resets), carry [B, H].

    Where `resets[t]` is set, the hidden state is zeroed before step t: the step starts a new episode.
    """

    hidden: int

    @functools.partial(nn.scan, variable_broadcast="params", in_axes=0, out_axes=0, split_rngs={"params": False})
    @nn.compact
    def __call__(self, carry: jax.Array, x: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        features, resets = x
        carry = jnp.where(resets[:, None], jnp.zeros_like(carry), carry)
        return self.cell(carry, features)

    def cell(self, carry: jax.Array, features: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One step: (carry, features [B, D]) -> (carry, output [B, H])."""
        return nn.GRUCell(self.hidden)(carry, features)


class ScannedLSTM(ScannedGRU):
    """An LSTM cell scanned over time, as ScannedGRU: its carry [B, 2H] is the cell state and the hidden state
    side by side (one array, as the GRU's, so that the runner keeps one per environment); outputs the hidden state."""

    def cell(self, carry: jax.Array, features: jax.Array) -> tuple[jax.Array, jax.Array]:
        cell, hidden = jnp.split(carry, 2, -1)
        (cell, hidden), out = nn.OptimizedLSTMCell(self.hidden)((cell, hidden), features)
        return jnp.concatenate([cell, hidden], -1), out


class ActorCritic(nn.Module):
    """Embedding, GRU, then separate actor and critic heads on the GRU's output (PureJaxRL's ActorCriticRNN).

    With `critic_gru` the critic has an embedding and GRU of its own, and the carry is the two GRUs' hidden
    states side by side ([B, 2H]). `lstm`, `embed` and `ortho_init` as the Config's fields.
    """

    num_actions: int
    hidden: int = 128
    critic_gru: bool = False
    lstm: bool = False
    embed: bool = True
    ortho_init: bool = True

    @nn.compact
    def __call__(self, carry: jax.Array, obs: jax.Array, resets: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(carry [B, H or 2H], obs [T, B, D], resets [T, B]) -> (carry after T steps, logits [T, B, A],
        value [T, B])."""
        actor_carry, critic_carry = jnp.split(carry, 2, -1) if self.critic_gru else (carry, None)
        carry, x = self.memory(actor_carry, obs, resets)
        logits = self.dense(self.num_actions, 0.01)(nn.relu(self.dense(self.hidden, 2.0)(x)))
        if self.critic_gru:
            critic_carry, x = self.memory(critic_carry, obs, resets)
            carry = jnp.concatenate([carry, critic_carry], -1)
        value = self.dense(1, 1.0)(nn.relu(self.dense(self.hidden, 2.0)(x)))
        return carry, logits, jnp.squeeze(value, -1)

    def memory(self, carry: jax.Array, obs: jax.Array, resets: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The embedding and the recurrent cell: (carry [B, H or 2H], obs [T, B, D], resets) -> (carry,
        features [T, B, H])."""
        x = nn.relu(self.dense(self.hidden, np.sqrt(2))(obs)) if self.embed else obs
        cell = ScannedLSTM(self.hidden) if self.lstm else ScannedGRU(self.hidden)
        return cell(carry, (x, resets))

    def dense(self, features: int, scale: float) -> nn.Dense:
        """A dense layer, orthogonal with gain `scale` (PureJaxRL's) or PyTorch's default (ortho_init=False)."""
        return dense(features, scale) if self.ortho_init else nn.Dense(features, kernel_init=TORCH_INIT)


# ---------------------------------------------------------------- state


@struct.dataclass
class ObsStats:
    """The running mean and variance of every observation seen (SB3's RunningMeanStd), the same on every replica.

    It starts from mean 0 and variance 1 weighed as 1e-4 observations (SB3's epsilon), and merges each step's
    observations of all environments in (Chan et al.'s parallel update of mean and variance).
    """

    count: jax.Array  # []
    mean: jax.Array  # [obs_size]
    var: jax.Array  # [obs_size]

    @classmethod
    def initial(cls, obs_size: int) -> ObsStats:
        return cls(jnp.float32(1e-4), jnp.zeros(obs_size), jnp.ones(obs_size))

    def update(self, obs: jax.Array) -> ObsStats:
        """Merged with one step's observations [N, obs_size] of every replica's environments."""
        n = fragc.psum(jnp.float32(obs.shape[0]))
        mean = fragc.psum(jnp.sum(obs, 0)) / n
        var = fragc.psum(jnp.sum((obs - mean) ** 2, 0)) / n
        delta, count = mean - self.mean, self.count + n
        m2 = self.var * self.count + var * n + delta ** 2 * self.count * n / count
        return ObsStats(count, self.mean + delta * n / count, m2 / count)

    def normalize(self, obs: jax.Array) -> jax.Array:
        return jnp.clip((obs - self.mean) / jnp.sqrt(self.var + 1e-8), -10.0, 10.0)


@struct.dataclass
class Learner:
    params: Any
    opt_state: Any
    key: jax.Array  # replicated: minibatch shuffling
    epochs: jax.Array  # [] int32: passes over rollouts so far (the annealed clip's clock)


@struct.dataclass
class Actor:
    """Per-environment state (axis 0): the environments' runner, the GRU's hidden state, and whether the
    last step ended an episode (the next step resets the hidden state); beside them the observations' running
    statistics (replicated; None unless `normalize_obs`)."""

    runner: Runner
    hidden: jax.Array  # [N, carry_size]: the recurrent cell's carry (both cells' with critic_gru)
    done: jax.Array  # [N] bool
    obs_stats: ObsStats | None = None


ACTOR_AXES = Actor(runner=0, hidden=0, done=0, obs_stats=None)
"""The actor's axes: its environments' state split over replicas, the observation statistics replicated."""


@struct.dataclass
class State:
    learner: Learner
    actor: Actor


@struct.dataclass
class Transition:
    hidden: jax.Array  # the hidden state before step t (the learner replays from hidden[0], the rollout's start)
    reset: jax.Array  # whether step t starts a new episode (the previous step's done)
    obs: jax.Array  # as the network saw it (normalized where normalize_obs)
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    next_value: jax.Array  # V(s_{t+1}) under the acting parameters, from the hidden state after step t
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array  # terminated or truncated


def observe(obs_stats: ObsStats | None, obs: jax.Array) -> jax.Array:
    """The observation as the network sees it: normalized by `obs_stats` where there are some."""
    return obs if obs_stats is None else obs_stats.normalize(obs)


# ---------------------------------------------------------------- algorithm


class PPORNN:
    """Recurrent PPO with a GRU, PureJaxRL's ppo_rnn.py."""

    def __init__(self, config: Config = Config()):
        self.config = config
        self.steps_per_iteration = config.steps_per_iteration
        self.evaluator = Evaluator.recurrent(config.env, self.initial_carry, self.greedy_step, config.eval_every,
                                             config.eval_episodes)

    @functools.cached_property
    def env(self) -> VecEnv | MaskedVelocity:
        env = discrete_env(self.config.env, "ppo_rnn")
        if self.config.mask_velocity:
            if "CartPole" not in self.config.env or env.obs_size != 4:
                raise FragcError(f"ppo_rnn: mask_velocity is for CartPole (velocities at observation indices 1 "
                                 f"and 3), not {self.config.env}")
            env = MaskedVelocity(env)
        return env

    @functools.cached_property
    def network(self) -> ActorCritic:
        c = self.config
        return ActorCritic(self.env.action_space.n, c.hidden, c.critic_gru, c.lstm, c.embed, c.ortho_init)

    @property
    def carry_size(self) -> int:
        """Width of the network's carry: the recurrent cell's (the GRU's hidden state, the LSTM's cell and hidden
        states), or both cells' (critic_gru)."""
        c = self.config
        return c.hidden * (2 if c.lstm else 1) * (2 if c.critic_gru else 1)

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """PPO's (ppo.py); built where it is used, not cached: a hyperparameter sweep traces it with each member's
        values."""
        return ppo.optimizer(self.config)

    def init(self, key: jax.Array) -> State:
        c = self.config
        k_params, k_env, k_learn = jax.random.split(key, 3)
        params = self.network.init(k_params, jnp.zeros((1, self.carry_size)), jnp.zeros((1, 1, self.env.obs_size)),
                                   jnp.zeros((1, 1), bool))
        learner = Learner(params, self.optimizer.init(params), k_learn, jnp.int32(0))
        obs_stats = ObsStats.initial(self.env.obs_size) if c.normalize_obs else None
        actor = Actor(self.env.reset(k_env, c.num_envs), jnp.zeros((c.num_envs, self.carry_size)),
                      jnp.zeros((c.num_envs,), bool), obs_stats)
        return self.evaluator.init(key, State(learner, actor))

    def iteration(self, state: State) -> tuple[State, dict]:
        state, eval_metrics = self.evaluator.maybe_evaluate(state, self.policy_params(state))  # when due
        traj, actor, episode_metrics = self.rollout(state.learner.params, state.actor)
        learner, loss_metrics = self.learn(state.learner, traj)
        return state.replace(learner=learner, actor=actor), {**episode_metrics, **loss_metrics, **eval_metrics}

    # COLLECT TRAJECTORIES: one GRU step per environment step
    @fragc.fragment(role="actor", in_axes=(None, ACTOR_AXES), out_axes=(1, ACTOR_AXES, None))
    def rollout(self, params: Any, actor: Actor) -> tuple[Transition, Actor, dict]:
        return collect(self.network, self.env, params, actor, self.config.num_steps)

    # UPDATE NETWORK: the advantages once, then `update_epochs` passes in minibatches of whole environment sequences
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, traj: Transition) -> tuple[Learner, dict]:
        return update(learner, traj, self.config, self.network, self.optimizer)

    # THE DETERMINISTIC POLICY: what evaluation episodes and videos act with (`Evaluator.recurrent`). There is no
    # `greedy_action(params, obs)`: a recurrent policy carries its hidden state from step to step.
    def policy_params(self, state: State) -> tuple[Any, ObsStats | None]:
        """What the actors act with: the network's parameters and the observations' statistics of the moment
        (None unless normalize_obs), which an evaluation reads and does not update (SB3 evaluates with
        VecNormalize(training=False))."""
        return state.learner.params, state.actor.obs_stats

    def initial_carry(self, n: int) -> jax.Array:
        """The hidden state of `n` environments at an episode's start."""
        return jnp.zeros((n, self.carry_size))

    def greedy_step(self, params: tuple[Any, ObsStats | None], hidden: jax.Array, obs: jax.Array,
                    reset: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One step of the deterministic policy on the environment's observations `obs[n, ...]` (masked and
        normalized here as the rollout's are) -> (next hidden, the most probable action each)."""
        network_params, obs_stats = params
        obs = self.env.mask(obs) if self.config.mask_velocity else obs
        hidden, logits, _ = self.network.apply(network_params, hidden, observe(obs_stats, obs)[None], reset[None])
        return hidden, jnp.argmax(logits[0], -1)


# ---------------------------------------------------------------- the rollout and the update: IPPO-RNN calls them too


def collect(network: Any, env: Any, params: Any, actor: Actor, num_steps: int,
            episode_stats: Callable[[Runner], dict] = episode_metrics,
            episodes_ended: Callable[[jax.Array], jax.Array] = count_episodes) -> tuple[Transition, Actor, dict]:
    """`num_steps` steps of every environment, one step of the recurrent network (`network.apply(params, carry,
    obs [T, B..., D], resets [T, B...])`) each, with per-environment keys -> (trajectory [T, N, ...], actor,
    metrics). The environments' arrays may have an agent axis after the environment axis ([N, A, ...]: IPPO-RNN's
    agents, each a sequence of its own)."""

    def step(actor: Actor, _: None) -> tuple[Actor, tuple]:
        runner = actor.runner
        keys = jax.vmap(lambda k: jax.random.split(k, 3))(runner.key)  # acting, environment step, carried
        # as VecNormalize: the statistics take each observation in before it is normalized
        obs_stats = None if actor.obs_stats is None else actor.obs_stats.update(runner.obs)
        obs = observe(obs_stats, runner.obs)
        hidden, logits, value = network.apply(params, actor.hidden, obs[None], actor.done[None])
        logits, value = logits[0], value[0]
        action = jax.vmap(jax.random.categorical)(keys[:, 0], logits)
        log_prob = log_prob_of(jax.nn.log_softmax(logits), action)
        new_runner, out = env.step(runner.replace(key=keys[:, 2]), action, keys[:, 1])
        record = (actor.hidden, actor.done, obs, action, log_prob, value, hidden,
                  observe(obs_stats, out.final_obs), out.reward, out.terminated, out.episode_done)
        return Actor(new_runner, hidden, out.episode_done, obs_stats), record

    actor, (h, reset, obs, action, log_prob, value, h_after, next_obs, reward, terminated, done) = \
        jax.lax.scan(step, actor, None, num_steps)
    # V(s_{t+1}) for every step at once: one GRU step from the hidden state after step t on the observation
    # reached (before any reset), all of them as one batch; a truncated episode bootstraps from it
    lead = reward.shape
    n = int(np.prod(lead))
    _, _, next_value = network.apply(params, h_after.reshape(n, -1), next_obs.reshape((1, n) + next_obs.shape[len(lead):]),
                                     jnp.zeros((1, n), bool))
    traj = Transition(h, reset, obs, action, log_prob, value, next_value.reshape(lead), reward, terminated, done)
    return traj, actor, {**episode_stats(actor.runner), "episodes": episodes_ended(done)}


def update(learner: Learner, traj: Transition, config: Any, network: Any,
           tx: optax.GradientTransformation) -> tuple[Learner, dict]:
    """The advantages once, then `update_epochs` passes over the rollout in minibatches of whole environment
    sequences (with their agents', where there are any), the gradients averaged over the learner's replicas."""
    c = config
    T, N = traj.reward.shape[:2]
    if N % c.num_minibatches:
        raise FragcError(f"{algo_name(c)}: each replica's environments ({N}) must divide by num_minibatches "
                         f"({c.num_minibatches}): use more environments or fewer minibatches")
    advantages, targets = gae(traj, c.gamma, c.gae_lambda)  # from the rollout's values: the same every epoch

    def epoch(learner: Learner, _: None) -> tuple[Learner, dict]:
        clip = ratio_clip(c, learner.epochs)

        def minibatch_step(learner: Learner, mb: Any) -> tuple[Learner, dict]:
            minibatch_loss = functools.partial(loss, clip=clip, config=c, network=network)
            return losses.gradient_step(learner, minibatch_loss, mb, tx, ppo.learning_rate(c))

        key, perm_key = jax.random.split(learner.key)
        # the same shuffle of its own environments on every replica, as ppo's shuffle of its own steps is; drawn
        # as N + 1 uniforms, as a draw of exactly N from the replicated key reads as a per-environment stream
        perm = jnp.argsort(jax.random.uniform(perm_key, (N + 1,))[:N])
        # [T, N, ...] -> [M, T, N / M, ...]: the environments shuffled, each keeps its whole sequence
        split = lambda x: jnp.swapaxes(x[:, perm].reshape((T, c.num_minibatches, -1) + x.shape[2:]), 0, 1)
        shuffled = jax.tree.map(split, (traj, advantages, targets))
        learner, metrics = jax.lax.scan(minibatch_step, learner.replace(key=key), shuffled)
        return learner.replace(epochs=learner.epochs + 1), fragc.pmean(jax.tree.map(jnp.mean, metrics))

    learner, metrics = jax.lax.scan(epoch, learner, None, c.update_epochs)
    metrics = jax.tree.map(jnp.mean, metrics)  # over epochs
    return learner, {**metrics, "explained_variance": explained_variance(targets, traj.value)}


def ratio_clip(config: Any, epochs: jax.Array) -> jax.Array | float:
    """The ratio clip of the epoch after `epochs` passes: clip_eps, or with anneal_clip clip_eps times the
    fraction of the run left after the current iteration's rollout (SB3's progress_remaining)."""
    c = config
    if not c.anneal_clip:
        return c.clip_eps
    iteration = epochs // c.update_epochs
    return c.clip_eps * (1.0 - (iteration + 1) / c.iterations)


def loss(params: Any, traj: Transition, advantages: jax.Array, targets: jax.Array, clip: jax.Array | float,
         config: Any, network: Any) -> tuple[jax.Array, dict]:
    """PPO's clipped loss on a minibatch of whole sequences, replayed from their start; `clip`: the ratio clip."""
    c = config
    _, logits, value = network.apply(params, traj.hidden[0], traj.obs, traj.reset)  # replay from the start
    log_probs = jax.nn.log_softmax(logits)
    log_prob = log_prob_of(log_probs, traj.action)
    entropy = jnp.mean(-jnp.sum(jnp.exp(log_probs) * log_probs, -1))
    value_loss = losses.value_loss(value, targets, traj.value, c.clip_eps if c.clip_value else None)
    actor_loss, diagnostics = losses.clipped_surrogate(log_prob, traj.log_prob, advantages, clip)
    total = actor_loss + c.vf_coef * value_loss - c.ent_coef * entropy
    return total, {"loss": total, "actor_loss": actor_loss, "value_loss": value_loss, "entropy": entropy,
                   **diagnostics}
