"""Gumbel AlphaZero on pgx's two-player games, as pgx's `examples/alphazero/train.py` writes it: two fragments,
`selfplay` (actor) and `learn` (learner).

Danihelka et al. 2022, "Policy improvement by planning with Gumbel". Each iteration starts `num_envs` fresh games and
plays `num_steps` moves in each (a finished game restarts: pgx's auto_reset). Every move is chosen by
`mctx.gumbel_muzero_policy` with the true game as the model: `num_simulations` simulations, each a step of the game
and a pass of the network, the reward the mover's, the discount -1 (the next node is the other player's). The
search lives inside the actor's fragment; each game searches with a key of its own, so the moves do not depend on
how the games are split over replicas. From the window of play come, per move:
  - the policy target: the search's improved policy (`action_weights`);
  - the value target: the game's outcome from the mover's side, computed backwards over the window; a game the
    window cut short has none (its value loss masked out).
The learner takes the window's moves once, shuffled, in minibatches of `batch_size`: the policy's cross-entropy
plus half the squared value error, Adam. The network is pgx's AZNet (a pre-activation ResNet, BatchNorm, a policy
and a tanh value head), in flax: BatchNorm's batch statistics are those of the whole minibatch over the learner's
replicas, and the actors act with its running averages (flax's, without haiku's zero-debiasing).

`episode_return` is pgx's evaluation: `eval_games` games of the network (sampling its raw logits, no search) as the
first player against a uniform random player, the mean of its outcomes (+1, 0, -1; an illegal move loses).
Defaults are pgx's at a CPU's scale (pgx's: 1024 games of 256 moves, 32 simulations, 128 channels, 6 blocks).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

import fragc
from fragc.algos import losses
from fragc.algos.board_games import make_game
from fragc.algos.minibatches import flatten_steps, shuffled
from fragc.algos.run_length import RunLength
from fragc.ir.errors import FragcError


@dataclasses.dataclass(frozen=True)
class Config(RunLength):
    env: str = "pgx:connect_four"
    """A pgx two-player game with board observations: pgx:connect_four, pgx:tic_tac_toe, pgx:othello (fragc envs)."""
    num_envs: int = 64
    """Games played at once in each iteration's self-play (pgx's selfplay_batch_size)."""
    num_steps: int = 64
    """Moves of each game slot per iteration (pgx's max_num_steps); games start afresh every iteration."""
    total_steps: int = 1_048_576
    """Moves over the whole run (num_envs * num_steps per iteration)."""
    num_simulations: int = 32
    """Search simulations per move."""
    max_considered_actions: int = 16
    """Actions the Gumbel search considers at the root (mctx's max_num_considered_actions)."""
    batch_size: int = 512
    """Moves per gradient step (pgx's training_batch_size); num_envs * num_steps must divide by it."""
    lr: float = 1e-3
    """Adam learning rate."""
    channels: int = 32
    """Channels of the residual network (pgx's num_channels)."""
    blocks: int = 2
    """Residual blocks (pgx's num_layers)."""
    eval_games: int = 64
    """Games against a uniform random player each iteration, for `episode_return` (0: none)."""

    def __post_init__(self) -> None:
        self.check_fields()
        if self.steps_per_iteration % self.batch_size:
            raise FragcError(f"alphazero: num_envs * num_steps ({self.steps_per_iteration}) must divide by "
                             f"batch_size ({self.batch_size})")


# ---------------------------------------------------------------- network: pgx's AZNet (resnet_v2)


class AZNet(nn.Module):
    """A 3x3 convolution, `blocks` pre-activation residual blocks, then a policy head (1x1 conv to 2 planes, a
    linear layer to the logits) and a value head (1x1 conv to 1 plane, a hidden layer, tanh). The convolutions have
    no biases: every one reaches the output only through a BatchNorm, which removes a constant (pgx's keep theirs,
    which change no output, and which Adam moves by its step size on gradients of rounding noise)."""

    num_actions: int
    channels: int
    blocks: int

    @nn.compact
    def __call__(self, obs: jax.Array, train: bool = False) -> tuple[jax.Array, jax.Array]:
        """(obs [B, H, W, C]) -> (logits [B, A], value [B]); `train`: batch statistics over the learner's replicas."""
        def norm(x: jax.Array) -> jax.Array:  # haiku's BatchNorm(create_scale, create_offset, decay 0.9, eps 1e-5)
            bn = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                              axis_name=fragc.REPLICA if train else None)
            return nn.relu(bn(x))

        conv = functools.partial(nn.Conv, use_bias=False)  # each feeds a BatchNorm, which would cancel its bias
        x = conv(self.channels, (3, 3))(obs.astype(jnp.float32))
        for _ in range(self.blocks):
            x = x + conv(self.channels, (3, 3))(norm(conv(self.channels, (3, 3))(norm(x))))
        x = norm(x)
        logits = nn.Dense(self.num_actions)(norm(conv(2, (1, 1))(x)).reshape(x.shape[0], -1))
        value = norm(conv(1, (1, 1))(x)).reshape(x.shape[0], -1)
        value = jnp.tanh(nn.Dense(1)(nn.relu(nn.Dense(self.channels)(value))))
        return logits, value[:, 0]


# ---------------------------------------------------------------- state


@struct.dataclass
class Learner:
    params: Any
    batch_stats: Any  # BatchNorm's running averages, what the actors act with
    opt_state: Any
    key: jax.Array  # replicated: the minibatch shuffles


@struct.dataclass
class State:
    learner: Learner
    game_keys: jax.Array  # [num_envs]: each game slot's own key, split every iteration
    eval_keys: jax.Array  # [eval_games]: each evaluation game's own key


@struct.dataclass
class Sample:
    obs: jax.Array
    policy_target: jax.Array  # the search's improved policy
    value_target: jax.Array  # the outcome for the mover, backwards over the window
    mask: jax.Array  # whether the game ended within the window (else no value target)


def value_targets(reward: jax.Array, discount: jax.Array, terminated: jax.Array) -> tuple[jax.Array, jax.Array]:
    """pgx's targets over [T, N] moves: z_t = r_t + d_t z_{t+1} from z_T = 0 (d_t: -1, 0 where the move ended the
    game), and whether a game ended at or after move t within the window (pgx's value mask)."""
    _, z = jax.lax.scan(lambda future, x: (x[0] + x[1] * future,) * 2, jnp.zeros_like(reward[0]), (reward, discount),
                        reverse=True)
    return z, jnp.cumsum(terminated[::-1], axis=0)[::-1] >= 1


# ---------------------------------------------------------------- algorithm


class AlphaZero:
    """Gumbel AlphaZero with the true game as the model, pgx's examples/alphazero."""

    Config = Config

    def __init__(self, config: Config | None = None):
        self.config = self.Config() if config is None else config
        self.steps_per_iteration = self.config.steps_per_iteration

    @property
    def iterations_per_dispatch(self) -> int:
        """What `fragc.compile` and `fragc run` dispatch where not told: one iteration on the CPU, where the learner's
        convolution gradients inside the dispatch's loop of iterations ran 6x slower (jax-ml/jax#12868); an
        iteration takes seconds, so one dispatch each costs nothing."""
        return 1 if jax.default_backend() == "cpu" else 16

    @functools.cached_property
    def game(self) -> Any:
        """pgx's environment (made on first use: pgx imports JAX)."""
        return make_game(self.config.env, "alphazero")

    @functools.cached_property
    def network(self) -> AZNet:
        c = self.config
        return AZNet(self.game.num_actions, c.channels, c.blocks)

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """Built where it is used, not cached: a hyperparameter sweep traces it with each member's values."""
        return optax.adam(self.config.lr)

    def init(self, key: jax.Array) -> State:
        c = self.config
        k_params, k_learn, k_games, k_eval = jax.random.split(key, 4)
        variables = self.network.init(k_params, jnp.zeros((1,) + tuple(self.game.observation_shape)))
        params = variables["params"]
        learner = Learner(params, variables["batch_stats"], self.optimizer.init(params), k_learn)
        return State(learner, jax.random.split(k_games, c.num_envs), jax.random.split(k_eval, c.eval_games))

    def iteration(self, state: State) -> tuple[State, dict]:
        model = self.policy_params(state)
        eval_keys, eval_metrics = state.eval_keys, {}
        if self.config.eval_games:
            eval_metrics, eval_keys = self.vs_random(model, state.eval_keys)
        samples, game_keys, metrics = self.selfplay(model, state.game_keys)
        learner, loss_metrics = self.learn(state.learner, samples)
        state = state.replace(learner=learner, game_keys=game_keys, eval_keys=eval_keys)
        return state, {**eval_metrics, **metrics, **loss_metrics}

    def evaluate(self, model: tuple[Any, Any], obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The network with the running BatchNorm averages (as the actors act): (logits, value)."""
        params, batch_stats = model
        return self.network.apply({"params": params, "batch_stats": batch_stats}, obs)

    # SELF-PLAY: a Gumbel search per move, the true game as the model
    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None))
    def selfplay(self, model: tuple[Any, Any], game_keys: jax.Array) -> tuple[Sample, jax.Array, dict]:
        c, env = self.config, self.game
        init_keys, play_keys, game_keys = jax.vmap(lambda k: jax.random.split(k, 3), out_axes=1)(game_keys)
        move_keys = jax.vmap(lambda k: jax.random.split(k, c.num_steps), out_axes=1)(play_keys)  # [T, N]

        def move(games: Any, keys: jax.Array) -> tuple[Any, tuple]:
            search_keys, reset_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
            weights, action = jax.vmap(functools.partial(self.search, model))(search_keys, games)
            obs, mover = games.observation, games.current_player
            games = jax.vmap(auto_reset(env))(games, action, reset_keys)
            return games, (obs, weights, mover_reward(games, mover), jnp.where(games.terminated, 0.0, -1.0),
                           games.terminated)

        _, (obs, weights, reward, discount, ended) = jax.lax.scan(move, jax.vmap(env.init)(init_keys), move_keys)
        z, mask = value_targets(reward, discount, ended)
        return Sample(obs, weights, z, mask), game_keys, {"games": fragc.psum(jnp.sum(ended))}

    def search(self, model: tuple[Any, Any], key: jax.Array, game: Any) -> tuple[jax.Array, jax.Array]:
        """One game's Gumbel search from its state -> (the improved policy over actions, the action to play)."""
        import mctx

        one = jax.tree.map(lambda x: x[None], game)
        logits, value = self.evaluate(model, one.observation)
        root = mctx.RootFnOutput(prior_logits=logits, value=value, embedding=one)
        out = mctx.gumbel_muzero_policy(model, key, root, self.game_model, self.config.num_simulations,
                                        invalid_actions=~one.legal_action_mask,
                                        qtransform=mctx.qtransform_completed_by_mix_value, gumbel_scale=1.0,
                                        max_num_considered_actions=self.config.max_considered_actions)
        return out.action_weights[0], out.action[0]

    @functools.cached_property
    def game_model(self) -> Callable[..., tuple[Any, Any]]:
        """The search's model: the true game, the network's prior and value (`game_model`)."""
        return game_model(self.game, lambda model, key, games: self.evaluate(model, games.observation))

    # UPDATE NETWORK: one pass over the window's moves in shuffled minibatches
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, samples: Sample) -> tuple[Learner, dict]:
        c = self.config
        key, perm_key = jax.random.split(learner.key)
        minibatches = shuffled(perm_key, flatten_steps(samples), c.steps_per_iteration // c.batch_size)

        def minibatch_step(learner: Learner, mb: Sample) -> tuple[Learner, dict]:
            grads, (batch_stats, metrics) = jax.grad(self.loss, has_aux=True)(learner.params, learner.batch_stats, mb)
            learner = losses.apply_gradients(learner, fragc.pmean(grads), self.optimizer)
            return learner.replace(batch_stats=batch_stats), metrics

        # unrolled on the CPU, where a convolution's gradient in a loop body runs many times slower (networks.py,
        # ChosenNetwork.unroll)
        unroll = jax.default_backend() == "cpu"
        learner, metrics = jax.lax.scan(minibatch_step, learner.replace(key=key), minibatches, unroll=unroll)
        return learner, fragc.pmean(jax.tree.map(jnp.mean, metrics))

    def loss(self, params: Any, batch_stats: Any, mb: Sample) -> tuple[jax.Array, tuple[Any, dict]]:
        """The policy's cross-entropy against the search's policy, plus half the squared error of the value against
        the outcome where the game ended in the window (pgx's loss_fn); BatchNorm on the minibatch's statistics."""
        (logits, value), updates = self.network.apply({"params": params, "batch_stats": batch_stats}, mb.obs,
                                                      train=True, mutable=["batch_stats"])
        policy_loss = jnp.mean(optax.softmax_cross_entropy(logits, mb.policy_target))
        value_loss = jnp.mean(optax.l2_loss(value, mb.value_target) * mb.mask)
        total = policy_loss + value_loss
        return total, (updates["batch_stats"], {"loss": total, "policy_loss": policy_loss, "value_loss": value_loss})

    # EVALUATION: the network (no search) as the first player against a uniform random player (pgx's evaluate)
    @fragc.fragment(role="evaluator", in_axes=(None, 0), out_axes=(None, 0))
    def vs_random(self, model: tuple[Any, Any], keys: jax.Array) -> tuple[dict, jax.Array]:
        env = self.game
        init_keys, play_keys, keys = jax.vmap(lambda k: jax.random.split(k, 3), out_axes=1)(keys)
        games = jax.vmap(env.init)(init_keys)

        def play(carry: tuple) -> tuple:
            games, keys, total = carry
            logits, _ = self.evaluate(model, games.observation)
            uniform = jnp.where(games.legal_action_mask, 0.0, jnp.finfo(jnp.float32).min)
            logits = jnp.where((games.current_player == 0)[:, None], logits, uniform)
            keys, draw = jax.vmap(jax.random.split, out_axes=1)(keys)
            action = jax.vmap(jax.random.categorical)(draw, logits)
            games = jax.vmap(env.step)(games, action)
            return games, keys, total + games.rewards[:, 0]

        _, _, total = jax.lax.while_loop(lambda carry: ~jnp.all(carry[0].terminated), play,
                                         (games, play_keys, jnp.zeros(keys.shape[0])))
        played = fragc.psum(jnp.float32(keys.shape[0]))
        rate = lambda outcome: fragc.psum(jnp.sum(total == outcome)) / played  # noqa: E731
        return {"episode_return": fragc.psum(jnp.sum(total)) / played, "win_rate": rate(1.0), "draw_rate": rate(0.0),
                "loss_rate": rate(-1.0)}, keys

    # THE DETERMINISTIC POLICY: the network's most probable move, without search
    def policy_params(self, state: State) -> tuple[Any, Any]:
        """The network's parameters and BatchNorm's running averages."""
        return state.learner.params, state.learner.batch_stats

    def greedy_action(self, model: tuple[Any, Any], obs: jax.Array) -> jax.Array:
        """The network's most probable move for each board of `obs[n, H, W, C]` (no search; legal or not)."""
        return jnp.argmax(self.evaluate(model, obs)[0], -1)


def mover_reward(games: Any, mover: jax.Array) -> jax.Array:
    """Each game's reward to the player who made the move just played (`mover` [B])."""
    return jnp.take_along_axis(games.rewards, mover[:, None], -1)[:, 0]


def game_model(env: Any, evaluate: Callable[[Any, jax.Array, Any], tuple[jax.Array, jax.Array]]
               ) -> Callable[..., tuple[Any, Any]]:
    """mctx's `recurrent_fn` with the true game as the model (pgx's): a move is the game's own step, its reward the
    mover's, its discount -1 (the next node is the other player's; 0 once the game ended); `evaluate(params, key,
    games) -> (logits, value)` gives the prior (masked to the legal moves) and the value (0 once the game ended)."""
    import mctx

    def recurrent_fn(params: Any, key: jax.Array, action: jax.Array, games: Any) -> tuple[Any, Any]:
        mover = games.current_player
        games = jax.vmap(env.step)(games, action)
        logits, value = evaluate(params, key, games)
        logits = logits - jnp.max(logits, -1, keepdims=True)
        logits = jnp.where(games.legal_action_mask, logits, jnp.finfo(logits.dtype).min)
        out = mctx.RecurrentFnOutput(reward=mover_reward(games, mover), discount=jnp.where(games.terminated, 0.0, -1.0),
                                     prior_logits=logits, value=jnp.where(games.terminated, 0.0, value))
        return out, games

    return recurrent_fn


def auto_reset(env: Any) -> Any:
    """pgx's `auto_reset(env.step, env.init)`: a step that ends the game starts a new one (its reward kept)."""
    from pgx.experimental import auto_reset as pgx_auto_reset

    return pgx_auto_reset(env.step, env.init)
