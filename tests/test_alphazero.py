"""AlphaZero on pgx's games (src/fragc/algos/alphazero.py): the value targets against a loop over the moves, the
search's targets, the refusals, and the program under 8 replicas against the reference interpreter. Learning
against pgx's own examples/alphazero is bench/alphazero_reference.py's."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("pgx", reason="the optional extra fragc[search]")

import fragc  # noqa: E402
from conftest import assert_trees_close  # noqa: E402
from fragc.algos import alphazero, make  # noqa: E402
from fragc.cli import main  # noqa: E402
from fragc.ir.errors import FragcError  # noqa: E402
from shared_programs import small_algo, traced  # noqa: E402


def plain_targets(reward, terminated):
    """pgx's compute_loss_input, a move at a time: the outcome for the mover, its sign flipping each move back, 0
    past a game's end; the mask where the game ends within the window."""
    T, N = reward.shape
    z, mask = np.zeros((T, N)), np.zeros((T, N), bool)
    for n in range(N):
        future, ends = 0.0, False
        for t in reversed(range(T)):
            future = reward[t, n] + (0.0 if terminated[t, n] else -1.0) * future
            ends = ends or bool(terminated[t, n])
            z[t, n], mask[t, n] = future, ends
    return z, mask


def test_value_targets_are_the_outcome_for_the_mover():
    rng = np.random.default_rng(0)
    terminated = rng.random((12, 5)) < 0.25
    reward = np.where(terminated, rng.choice([-1.0, 0.0, 1.0], (12, 5)), 0.0).astype(np.float32)
    discount = np.where(terminated, 0.0, -1.0).astype(np.float32)
    z, mask = jax.jit(alphazero.value_targets)(reward, discount, terminated)
    want_z, want_mask = plain_targets(reward, terminated)
    np.testing.assert_allclose(z, want_z, atol=1e-6)
    np.testing.assert_array_equal(mask, want_mask)
    # a game won at its last move: +1 for the winner at that move, -1 for the loser a move before, and so on
    z, _ = alphazero.value_targets(jnp.array([[0.0], [0.0], [1.0]]), jnp.array([[-1.0], [-1.0], [0.0]]),
                                   jnp.array([[False], [False], [True]]))
    np.testing.assert_array_equal(z[:, 0], [1.0, -1.0, 1.0])


def test_the_search_improves_a_distribution_over_legal_moves():
    algo = small_algo("alphazero")
    state = algo.init(jax.random.key(0))
    games = jax.vmap(algo.game.init)(jax.random.split(jax.random.key(1), 6))
    games = jax.vmap(algo.game.step)(games, jnp.arange(6))  # the first player took square i of game i
    weights, action = jax.jit(jax.vmap(lambda k, g: algo.search(algo.policy_params(state), k, g)))(
        jax.random.split(jax.random.key(2), 6), games)
    legal = np.asarray(games.legal_action_mask)
    np.testing.assert_allclose(np.sum(weights, -1), 1.0, rtol=1e-5)
    assert np.all(np.asarray(weights)[~legal] == 0) and np.all(legal[np.arange(6), np.asarray(action)])


def test_anakin_equals_the_interpreter_on_8_replicas():
    """One game, one evaluation game per replica; BatchNorm's statistics over every replica's minibatch."""
    algo = small_algo("alphazero")
    prog = fragc.compile(algo, "anakin", devices=8)
    assert prog.k == 1  # the algorithm's own iterations per dispatch on the CPU: no loop around its learner
    state = prog.init(0)
    out, history = prog.run(state, 2)
    ref = state
    for i in range(2):
        ref, metrics = fragc.interpret(traced("alphazero"), ref, replicas=8)
        for name in ("episode_return", "games", "loss"):
            np.testing.assert_allclose(history[name][i], metrics[name], rtol=1e-4, atol=1e-4)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("args,says", [
    (["--env", "CartPole-v1"], r"alphazero plays pgx's two-player games; CartPole-v1 is a single-agent environment"),
    (["--env", "pgx:conect_four"], r"pgx: unknown game 'conect_four'; did you mean 'connect_four'\?"),
    (["--env", "pgx:kuhn_poker"], r"alphazero's network takes board observations .* pgx:kuhn_poker's are \(7,\)"),
    (["--env", "pgx:2048"], r"alphazero plays two-player games; pgx:2048 has 1 player"),
    (["--num-simulations", "0"], r"alphazero: num_simulations must be positive, got 0"),
])
def test_bad_input_is_one_line_before_compiling(capsys, args, says):
    assert main(["run", "alphazero", *args, "--iterations", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "compiling" not in err
    assert re.search(says, err), err


def test_a_single_agent_algorithm_refuses_a_board_game():
    with pytest.raises(FragcError, match=r"^pgx:connect_four is a two-player board game \(pgx\): use alphazero"):
        make("ppo", env="pgx:connect_four").env


@pytest.mark.slow
def test_tic_tac_toe_learns_against_a_random_player():
    """pgx's evaluation (the network's raw policy, sampled without search, as the first player against uniform
    moves): an untrained network loses most games, by illegal moves; after 100 iterations (30 s) it wins as often
    as it loses (measured: a mean outcome of -0.8 at the start, about 0.0 from iteration 50 on)."""
    algo = make("alphazero", env="pgx:tic_tac_toe", num_envs=64, num_steps=16, batch_size=128, channels=16,
                num_simulations=16, eval_games=256, total_steps=64 * 16 * 100)
    prog = fragc.compile(algo, "single", iterations_per_dispatch=10)
    _, history = prog.run(prog.init(0), 100)
    outcome = np.asarray(history["episode_return"])
    assert outcome[0] < -0.5 and np.mean(outcome[-10:]) > -0.2, (outcome[0], np.mean(outcome[-10:]))
