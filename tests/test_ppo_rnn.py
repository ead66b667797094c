"""Recurrent PPO: the GRU's hidden state reset at episode ends, the masked CartPole observation, the observations'
running statistics, the reference interpreter under anakin, the greedy evaluation carrying the hidden state, its
config's one-line errors, and (-m slow) learning masked CartPole."""

import dataclasses
import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close, traced_module
from fragc.algos import ppo, ppo_rnn
from fragc.algos.envs import VecEnv
from fragc.algos.evaluation import with_evaluator

ITERATIONS = 2


SB3_LAYOUT = {"lstm": True, "embed": False, "ortho_init": False, "critic_gru": True}
"""sb3-contrib's MlpLstmPolicy with enable_critic_lstm: an LSTM each for actor and critic, on the observation."""


@functools.cache
def tiny(normalize_obs: bool = False, sb3: bool = False) -> ppo_rnn.PPORNN:
    """16 environments: 2 per replica on 8 devices, one whole sequence per minibatch (`sb3`: SB3_LAYOUT)."""
    return ppo_rnn.PPORNN(ppo_rnn.Config(num_envs=16, num_steps=4, update_epochs=1, num_minibatches=2, hidden=8,
                                         total_steps=320, mask_velocity=True, normalize_obs=normalize_obs,
                                         **(SB3_LAYOUT if sb3 else {})))


@functools.cache
def tiny_params():
    """tiny()'s initial network parameters: those of every configuration below that changes only the losses."""
    return jax.jit(tiny().init)(jax.random.key(0)).learner.params


@functools.cache
def anakin_program(normalize_obs: bool = False, sb3: bool = False) -> fragc.Program:
    """tiny() on 8 replicas; its init gives the SB3 layout's parameters too."""
    return fragc.compile(tiny(normalize_obs, sb3), "anakin", devices=8, iterations_per_dispatch=ITERATIONS)


def gru_step(cell_params, carry, x):
    return nn.GRUCell(carry.shape[-1]).apply(cell_params, carry, x)


def lstm_step(cell_params, carry, x):
    """flax's LSTM cell on the scanned module's carry layout: the cell and hidden states side by side."""
    cell, hidden = jnp.split(carry, 2, -1)
    (cell, hidden), y = nn.OptimizedLSTMCell(hidden.shape[-1]).apply(cell_params, (cell, hidden), x)
    return jnp.concatenate([cell, hidden], -1), y


@pytest.mark.parametrize("scanned,cell_name,step,width", [
    (ppo_rnn.ScannedGRU, "GRUCell_0", gru_step, 1),
    (ppo_rnn.ScannedLSTM, "OptimizedLSTMCell_0", lstm_step, 2)])
def test_the_scanned_cell_resets_its_carry_where_an_episode_starts(scanned, cell_name, step, width):
    """The scanned GRU (LSTM) equals its cell stepped in a Python loop that zeroes the carry (the LSTM's cell and
    hidden states) where an episode starts."""
    T, B, D, H = 6, 3, 5, 4
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(T, B, D)), jnp.float32)
    resets = np.zeros((T, B), bool)
    resets[3, 0] = resets[1, 2] = True  # a done in the middle of two sequences
    carry = jnp.asarray(rng.normal(size=(B, width * H)), jnp.float32)
    module = scanned(H)
    params = module.init(jax.random.key(0), carry, (x, jnp.asarray(resets)))
    final, ys = module.apply(params, carry, (x, jnp.asarray(resets)))

    cell_params = {"params": params["params"][cell_name]}
    want, h = [], np.asarray(carry)
    for t in range(T):
        h = np.where(resets[t][:, None], 0.0, h)
        h, y = step(cell_params, jnp.asarray(h), x[t])
        want.append(np.asarray(y))
    chex.assert_shape(ys, (T, B, H))
    np.testing.assert_allclose(ys, np.stack(want), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(final, h, rtol=1e-5, atol=1e-6)
    # the reset matters: the sequence restarted at t=3 equals one started from zeros there
    _, fresh = module.apply(params, jnp.zeros((1, width * H)), (x[3:, :1], jnp.zeros((T - 3, 1), bool)))
    np.testing.assert_allclose(ys[3:, :1], fresh, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # 12 s of the default suite's 6 minutes, for one layout option
def test_the_sb3_layout_feeds_the_observation_to_an_lstm_with_pytorch_init():
    """lstm, embed=False, ortho_init=False (sb3-contrib's MlpLstmPolicy): the LSTMs' input kernels read the
    observation itself, the carry is both LSTMs' cell and hidden states, and the dense layers' weights lie within
    PyTorch's +-1/sqrt(fan_in); the defaults keep the embedding and orthogonal (wider) weights."""
    H, D = 8, 2
    algo = tiny(normalize_obs=True, sb3=True)  # the anakin test's program: its parameters, no compile of their own
    assert algo.config.hidden == H and algo.carry_size == 4 * H
    params = anakin_program(True, True).init(0).learner.params["params"]
    assert set(params) == {"ScannedLSTM_0", "ScannedLSTM_1", "Dense_0", "Dense_1", "Dense_2", "Dense_3"}
    for lstm in ("ScannedLSTM_0", "ScannedLSTM_1"):
        chex.assert_shape(params[lstm]["OptimizedLSTMCell_0"]["ii"]["kernel"], (D, H))  # the observation, unembedded
    for layer in ("Dense_0", "Dense_1", "Dense_2", "Dense_3"):  # heads and hidden layers, each on H features
        assert np.abs(params[layer]["kernel"]).max() <= 1 / np.sqrt(H)
    default = tiny_params()["params"]
    chex.assert_shape(default["Dense_0"]["kernel"], (D, H))  # the embedding
    chex.assert_shape(default["Dense_2"]["kernel"], (H, H))  # the actor's hidden layer (Dense_1: its logits)
    assert np.abs(default["Dense_2"]["kernel"]).max() > 1 / np.sqrt(H)  # orthogonal with gain 2


def test_the_critic_gru_is_the_critics_own():
    """With critic_gru the carry is both GRUs' hidden states; the critic's GRU moves the value, not the logits."""
    B, H = 3, 4
    net = ppo_rnn.ActorCritic(num_actions=2, hidden=H, critic_gru=True)
    obs = jax.random.normal(jax.random.key(1), (5, B, 2))
    resets, carry = jnp.zeros((5, B), bool), jax.random.normal(jax.random.key(2), (B, 2 * H))
    params = net.init(jax.random.key(0), carry, obs, resets)
    after, logits, value = net.apply(params, carry, obs, resets)
    assert after.shape == (B, 2 * H)
    params["params"]["ScannedGRU_1"] = jax.tree.map(lambda x: x + 0.1, params["params"]["ScannedGRU_1"])
    moved, new_logits, new_value = net.apply(params, carry, obs, resets)
    chex.assert_trees_all_close((moved[:, :H], new_logits), (after[:, :H], logits))  # the actor's half unchanged
    assert not np.allclose(new_value, value) and not np.allclose(moved[:, H:], after[:, H:])


def test_the_masked_observation_has_no_velocities():
    full = ppo_rnn.PPORNN(ppo_rnn.Config(num_envs=4))
    masked = ppo_rnn.PPORNN(ppo_rnn.Config(num_envs=4, mask_velocity=True))
    assert (full.env.obs_size, masked.env.obs_size) == (4, 2)
    key = jax.random.key(3)
    a, b = full.env.reset(key, 4), masked.env.reset(key, 4)
    np.testing.assert_array_equal(b.obs, a.obs[:, [0, 2]])  # x and theta; x_dot and theta_dot gone
    action = jnp.ones((4,), jnp.int32)
    (a, sa), (b, sb) = full.env.step(a, action), masked.env.step(b, action)
    np.testing.assert_array_equal(b.obs, a.obs[:, [0, 2]])
    np.testing.assert_array_equal(sb.final_obs, sa.final_obs[:, [0, 2]])
    assert not np.allclose(a.obs[:, [1, 3]], 0)  # the velocities the masked policy does not see


@pytest.mark.parametrize("clip_value,want", [(True, 0.5 * 1.3 ** 2), (False, 0.5 * 1.0 ** 2)])
def test_the_value_loss_clips_the_values_change_unless_clip_value_is_false(clip_value, want):
    """Rollout values 0.5 below the network's and targets 1 above: clipped, the value counts as having moved only
    clip_eps = 0.2 from the rollout's (1.3 from the target); unclipped (SB3's default), 1 from the target."""
    algo = ppo_rnn.PPORNN(dataclasses.replace(tiny().config, clip_value=clip_value))
    params = tiny_params()
    T, N = 3, 2
    zeros = jnp.zeros((T, N))
    obs = jax.random.normal(jax.random.key(1), (T, N, 2))
    hidden, reset = jnp.zeros((T, N, 8)), jnp.zeros((T, N), bool)
    _, _, value = algo.network.apply(params, hidden[0], obs, reset)
    traj = ppo_rnn.Transition(hidden, reset, obs, jnp.zeros((T, N), jnp.int32), zeros, value - 0.5, zeros, zeros,
                              reset, reset)
    _, metrics = ppo_rnn.loss(params, traj, zeros, value + 1.0, algo.config.clip_eps, algo.config, algo.network)
    np.testing.assert_allclose(metrics["value_loss"], want, rtol=1e-5)


def test_the_annealed_ratio_clip_is_sb3s_linear_schedule_and_reaches_the_loss():
    """anneal_clip: iteration i clips at clip_eps (1 - (i + 1) / iterations), the same in each of its epochs (SB3's
    lin_0.2 after each rollout); the loss's clip is that value. Advantages +-1 and every ratio e^0.5, above 1 + clip:
    the +1 half counts (1 + clip), the -1 half -e^0.5, so the actor loss is (e^0.5 - 1 - clip) / 2."""
    config = dataclasses.replace(tiny().config, anneal_clip=True, update_epochs=2)  # 320 steps: 5 iterations
    algo = ppo_rnn.PPORNN(config)
    assert config.iterations == 5
    clips = [float(ppo_rnn.ratio_clip(config, jnp.int32(e))) for e in range(2 * config.iterations)]
    np.testing.assert_allclose(clips, np.repeat([0.16, 0.12, 0.08, 0.04, 0.0], 2), atol=1e-7)
    assert ppo_rnn.ratio_clip(tiny().config, jnp.int32(7)) == 0.2  # not annealed: clip_eps throughout

    params = tiny_params()
    T, N = 2, 2
    obs, hidden, reset = jnp.ones((T, N, 2)), jnp.zeros((T, N, 8)), jnp.zeros((T, N), bool)
    action = jnp.zeros((T, N), jnp.int32)
    _, logits, value = algo.network.apply(params, hidden[0], obs, reset)
    log_prob = jax.nn.log_softmax(logits)[..., 0] - 0.5  # the rollout's: every ratio e^0.5
    traj = ppo_rnn.Transition(hidden, reset, obs, action, log_prob, value, value, value, reset, reset)
    advantages = jnp.array([[1.0, -1.0], [1.0, -1.0]])
    for clip in (0.2, 0.05):
        _, metrics = ppo_rnn.loss(params, traj, advantages, value, clip, config, algo.network)
        np.testing.assert_allclose(metrics["actor_loss"], (np.exp(0.5) - 1 - clip) / 2, rtol=1e-4)


class RolloutOnly(ppo_rnn.PPORNN):
    """One rollout an iteration and no learning; its actions and done flags are the iteration's metrics."""

    def iteration(self, state: ppo_rnn.State) -> tuple[ppo_rnn.State, dict]:
        traj, actor, _ = self.rollout(state.learner.params, state.actor)
        return state.replace(actor=actor), {"action": traj.action, "done": traj.done}


def test_the_observation_statistics_are_those_of_every_observation_the_rollout_saw():
    """8 replicas of 2 environments, 4 steps: the statistics merged step by step and over replicas equal the mean
    and variance of the 64 observations, recomputed by stepping gymnax's CartPole by hand with the rollout's
    actions (4 steps from a reset end no episode, so no environment resets in between)."""
    algo = RolloutOnly(tiny(normalize_obs=True).config)
    state = algo.init(jax.random.key(0))
    out, metrics = fragc.interpret(fragc.trace(algo), state, replicas=8)
    assert not np.asarray(metrics["done"]).any()

    cartpole, params = algo.env.env.env, algo.env.env.params
    env_state, seen = state.actor.runner.env_state, []
    for action in np.asarray(metrics["action"]):  # [T, N]
        seen.append(np.asarray(jax.vmap(cartpole.get_obs)(env_state))[:, [0, 2]])  # x and theta
        _, env_state, *_ = jax.vmap(cartpole.step_env, in_axes=(None, 0, 0, None))(
            jax.random.key(0), env_state, jnp.asarray(action), params)  # CartPole's step draws nothing
    seen = np.concatenate(seen).astype(np.float64)
    # SB3's start (mean 0, variance 1, weighing 1e-4 observations) merged with the 64 observations
    n, prior = len(seen), 1e-4
    mean = seen.sum(0) / (n + prior)
    var = (prior * (1 + mean ** 2) + ((seen - mean) ** 2).sum(0)) / (n + prior)
    assert seen.shape == (4 * 16, 2)
    chex.assert_trees_all_close(out.actor.obs_stats, ppo_rnn.ObsStats(np.float32(n + prior), mean, var),
                                rtol=1e-4, atol=1e-7)
    chex.assert_trees_all_close(mean, seen.mean(0), rtol=1e-5)  # 1e-4 observations weigh next to nothing
    assert np.all(var < 0.01)  # positions near 0: what the network sees unnormalized


# the fast cell has both the observation statistics and SB3's LSTMs; the GRU's program equals the interpreter on
# `single` in the fast suite (test_the_evaluating_program_equals_the_interpreter), on anakin with -m slow
@pytest.mark.parametrize("normalize_obs,sb3", [pytest.param(False, False, marks=pytest.mark.slow),
                                               pytest.param(True, False, marks=pytest.mark.slow), (True, True)])
def test_anakin_equals_interpreter(normalize_obs, sb3):
    """8 replicas: per-replica minibatches of whole sequences, the gradients' pmean, the return's psum (and with
    normalize_obs, the observation statistics' psums, replicated)."""
    prog = anakin_program(normalize_obs, sb3)
    module = traced_module(prog)
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    ref = state
    for i in range(ITERATIONS):
        ref, metrics = fragc.interpret(module, ref, replicas=8)
        for name in ("episode_return", "loss", "entropy"):
            np.testing.assert_allclose(history[name][i], metrics[name], rtol=1e-4, atol=1e-5)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)
    assert out.actor.hidden.shape == (16, tiny(normalize_obs, sb3).carry_size) and out.actor.runner.obs.shape == (16, 2)
    if normalize_obs:
        assert round(float(out.actor.obs_stats.count)) == ITERATIONS * 4 * 16  # every observation, once


# ---------------------------------------------------------------- evaluation: the greedy policy carries its memory


EVALUATED_ITERATIONS = 3
REPLICAS = {"single": 1, "anakin": 8}


@functools.cache
def evaluating_program(normalize_obs: bool, critic_gru: bool, policy: str) -> fragc.Program:
    """The tiny configuration evaluating 8 episodes (one per replica on 8) every 2 iterations, compiled for
    EVALUATED_ITERATIONS: the first iteration evaluates, the second carries it over, the third evaluates again.
    (Arguments always given in full: functools.cache keys `(a, b)` and `(a, b, "single")` apart.)"""
    algo = ppo_rnn.PPORNN(dataclasses.replace(tiny(normalize_obs).config, critic_gru=critic_gru, eval_every=2,
                                              eval_episodes=8))
    return fragc.compile(algo, policy, devices=REPLICAS[policy], iterations_per_dispatch=EVALUATED_ITERATIONS)


def hand_written_greedy_return(algo: ppo_rnn.PPORNN, state: ppo_rnn.State) -> float:
    """An evaluation outside fragc: the evaluator's key split as the evaluator splits it, then each episode in a
    Python loop over gymnax's CartPole, the network stepped on the masked observation (normalized by the state's
    statistics, when it has some) from a zero hidden state, acting with the argmax of its logits."""
    import gymnax

    env, env_params = gymnax.make("CartPole-v1")
    params, stats = state.learner.params, state.actor.obs_stats
    net = jax.jit(lambda hidden, obs: algo.network.apply(params, hidden, obs[None, None], jnp.zeros((1, 1), bool)))
    _, episodes_key = jax.random.split(state.evaluator.key)
    total = 0.0
    for key in jax.random.split(episodes_key, algo.config.eval_episodes):
        reset_key, key = jax.random.split(key)
        obs, env_state = env.reset(reset_key, env_params)
        hidden = jnp.zeros((1, algo.carry_size))
        for _ in range(env_params.max_steps_in_episode):
            seen = np.asarray(obs)[[0, 2]]  # x and theta
            if stats is not None:
                seen = np.clip((seen - stats.mean) / np.sqrt(stats.var + 1e-8), -10, 10)
            hidden, logits, _ = net(hidden, jnp.asarray(seen, jnp.float32))
            step_key, key = jax.random.split(key)
            obs, env_state, reward, terminated, truncated, _ = env.step(step_key, env_state,
                                                                         int(jnp.argmax(logits[0, 0])), env_params)
            total += float(reward)
            if terminated or truncated:
                break
    return total / algo.config.eval_episodes


@pytest.mark.parametrize("normalize_obs,critic_gru", [pytest.param(False, False, marks=pytest.mark.slow),
                                                       pytest.param(True, False, marks=pytest.mark.slow), (True, True)])
def test_the_greedy_evaluation_carries_the_hidden_state_as_a_hand_written_loop(normalize_obs, critic_gru):
    """After two iterations (statistics of 128 observations, with normalize_obs) an evaluation is due; its return is
    the hand-written loop's; it reads the statistics and leaves them, and the rest of training, as they were."""
    prog = evaluating_program(normalize_obs, critic_gru, "single")  # the next test's program
    algo = prog.algo
    state, _ = prog.run(prog.init(0), 2)
    assert type(state) is with_evaluator(ppo_rnn.State) and int(state.evaluator.iteration) == 2
    evaluated, metrics = jax.jit(lambda s: algo.evaluator.maybe_evaluate(s, algo.policy_params(s)))(state)
    chex.assert_trees_all_equal((evaluated.learner, evaluated.actor), (state.learner, state.actor))
    assert metrics["eval_return"] == hand_written_greedy_return(algo, state)
    if normalize_obs:
        assert round(float(state.actor.obs_stats.count)) == 2 * 4 * 16


@pytest.mark.parametrize("policy", ["single", pytest.param("anakin", marks=pytest.mark.slow)])
def test_the_evaluating_program_equals_the_interpreter(policy):
    """normalize_obs and critic_gru, evaluating every 2 iterations: 3 iterations, the second carrying the first's
    evaluation over. (That an evaluation leaves training as it was: the hand-written loop's test above, and
    test_evaluation's bit-for-bit test of the evaluator's key stream.)"""
    prog = evaluating_program(True, True, policy)
    state = prog.init(0)
    out, history = prog.run(state, EVALUATED_ITERATIONS)
    module, ref = traced_module(prog), state
    for i in range(EVALUATED_ITERATIONS):
        ref, metrics = fragc.interpret(module, ref, replicas=REPLICAS[policy])
        np.testing.assert_allclose(history["eval_return"][i], metrics["eval_return"], rtol=1e-6)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)
    returns = np.asarray(history["eval_return"])
    assert returns[1] == returns[0] and returns[0] > 0


def test_checkpoint_and_exact_resume(tmp_path):
    """Stopped after its first checkpoint and resumed, a run equals an uninterrupted one bit for bit: the GRU's
    hidden state and done flags per environment are part of the checkpointed state (the fast program above: the
    observation statistics and SB3's LSTMs' two carries too)."""
    prog = anakin_program(True, True)
    whole = fragc.train(prog, prog.init(0), 3 * ITERATIONS)
    fragc.train(prog, prog.init(0), 3 * ITERATIONS, checkpoint_dir=tmp_path, checkpoint_every=ITERATIONS,
                stop_after=ITERATIONS)
    resumed = fragc.train(prog, prog.init(0), 3 * ITERATIONS, checkpoint_dir=tmp_path, resume=True)
    assert resumed.resumed_from == ITERATIONS
    assert not np.allclose(np.asarray(whole.state.actor.hidden), 0)  # a hidden state that resuming must restore
    assert_trees_close(resumed.state, whole.state, rtol=0, atol=0)


@pytest.mark.parametrize("config,message", [
    ({"num_minibatches": 3}, "ppo_rnn: num_envs (16) must divide by num_minibatches (3): minibatches are whole "
                             "environment sequences"),
    ({"eval_every": -1}, "ppo_rnn: eval_every must be at least 0, got -1"),
    ({"gae_lambda": 1.5}, "ppo_rnn: gae_lambda must be in [0, 1], got 1.5"),
    ({"mask_velocity": 1}, "ppo_rnn: mask_velocity must be True or False, got 1"),
    ({"normalize_obs": "yes"}, "ppo_rnn: normalize_obs must be True or False, got 'yes'"),
    ({"clip_value": 0}, "ppo_rnn: clip_value must be True or False, got 0"),
    ({"critic_gru": None}, "ppo_rnn: critic_gru must be True or False, got None"),
    ({"lstm": "yes"}, "ppo_rnn: lstm must be True or False, got 'yes'"),
])
def test_a_bad_config_value_is_one_line(config, message):
    with pytest.raises(fragc.FragcError) as err:
        ppo_rnn.Config(**config)
    assert str(err.value) == message


def test_mask_velocity_is_for_cartpole_only():
    with pytest.raises(fragc.FragcError, match="mask_velocity is for CartPole"):
        ppo_rnn.PPORNN(ppo_rnn.Config(env="Acrobot-v1", mask_velocity=True)).env


def test_the_command_line_lists_ppo_rnn(capsys):
    from fragc.cli import main

    assert main(["algos"]) == 0
    assert "ppo_rnn" in capsys.readouterr().out
    assert main(["run", "ppo_rnn", "--num-minibatches", "3"]) == 2
    assert "num_envs (16) must divide by num_minibatches (3)" in capsys.readouterr().err
    assert main(["run", "ppo_rnn", "--normalize-obs", "true", "--print-config"]) == 0
    assert "normalize_obs = true" in capsys.readouterr().out


@pytest.mark.slow
def test_masked_cartpole_learns_with_memory():
    """The memory task (positions only): the GRU gets far past a random policy (~22) in 5e5 steps; about 75 s on
    2 CPU cores. 8 environments in 4 minibatches and lr 5e-4 (the defaults learn more slowly in this budget)."""
    algo = ppo_rnn.PPORNN(ppo_rnn.Config(mask_velocity=True, total_steps=500_000, num_envs=8, num_minibatches=4,
                                         lr=5e-4))
    prog = fragc.compile(algo, "single", iterations_per_dispatch=algo.config.iterations)
    _, history = prog.run(prog.init(0), algo.config.iterations)
    returns = np.asarray(history["episode_return"])
    assert returns[-len(returns) // 4:].mean() > 150, returns[::20]


@pytest.mark.slow
def test_feed_forward_ppo_does_not_solve_masked_cartpole():
    """The same budget and settings without memory: ppo's MLP on the masked observation stays far below (~50)."""

    class FeedForward(ppo.PPO):
        @functools.cached_property
        def env(self):
            return ppo_rnn.MaskedVelocity(VecEnv(self.config.env))

    algo = FeedForward(ppo.Config(total_steps=500_000, num_envs=8, num_minibatches=4, lr=5e-4))
    prog = fragc.compile(algo, "single", iterations_per_dispatch=algo.config.iterations)
    _, history = prog.run(prog.init(0), algo.config.iterations)
    returns = np.asarray(history["episode_return"])
    assert returns[-len(returns) // 4:].mean() < 100, returns[::20]
