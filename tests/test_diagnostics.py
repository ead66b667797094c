"""The diagnostics the algorithms log (docs/metrics.md), each against numpy on the same inputs."""

import functools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fragc
from fragc.algos import ALGOS, dqn, impala, make, ppo, ppo_rnn, pqn, returns, sac
from fragc.algos.diagnostics import approx_kl, clip_fraction, episode_metrics, explained_variance, scheduled_lr
from fragc.algos.networks import QModel
from fragc.algos.replay import Transition as ReplayTransition
from fragc.algos.vec_env import VecEnv

RNG = np.random.default_rng(0)
LOG_RATIO = np.array([-0.5, -0.1, 0.0, 0.05, 0.15, 0.3], np.float32)
"""log(pi_new / pi_old) of six samples: ratios 0.61, 0.90, 1, 1.05, 1.16, 1.35; two lie outside [0.8, 1.2]."""


def one_replica(f, *args):
    """`f(*args)` as a fragment's one replica runs it (fragc.psum over one replica)."""
    return jax.tree.map(lambda x: x[0], replicas(f, *jax.tree.map(lambda x: x[None], args)))


def replicas(f, *args):
    """`f` run by as many replicas as `args` have rows (fragc.psum over them), compiled."""
    return jax.jit(jax.vmap(f, axis_name=fragc.REPLICA))(*args)


def cleanrl_kl(log_ratio):
    return np.mean((np.exp(log_ratio) - 1) - log_ratio)


def cleanrl_explained_variance(targets, values):
    return 1 - np.var(targets - values) / np.var(targets)


def test_approx_kl_and_clip_fraction_are_cleanrls():
    np.testing.assert_allclose(approx_kl(LOG_RATIO), cleanrl_kl(LOG_RATIO), rtol=1e-5)
    ratio = np.exp(LOG_RATIO)
    np.testing.assert_allclose(clip_fraction(ratio, 0.2), np.mean(np.abs(ratio - 1) > 0.2), rtol=1e-7)
    np.testing.assert_allclose(clip_fraction(ratio, 0.1), 3 / 6, rtol=1e-7)
    assert float(approx_kl(np.zeros(3, np.float32))) == 0.0


def test_explained_variance_is_over_every_replicas_batch():
    targets = RNG.normal(size=(8, 6)).astype(np.float32)
    values = (targets + RNG.normal(scale=0.5, size=(8, 6))).astype(np.float32)
    want = cleanrl_explained_variance(targets, values)
    np.testing.assert_allclose(one_replica(explained_variance, targets, values), want, rtol=1e-5)
    # two replicas, three environments each: the variance of the whole batch, not the mean of two variances
    split = lambda x: np.stack([x[:, :3], x[:, 3:]])  # noqa: E731
    both = replicas(explained_variance, split(targets), split(values))
    np.testing.assert_allclose(both, [want, want], rtol=1e-5)
    per_half = [cleanrl_explained_variance(t, v) for t, v in zip(split(targets), split(values))]
    assert abs(np.mean(per_half) - want) > 1e-3  # which the per-replica mean would have given
    constant = np.full((4, 2), 3.0, np.float32)  # CleanRL's NaN, which would stop a fragc run: 0
    assert float(one_replica(explained_variance, constant, constant - 1)) == 0.0


def after_updates(optimizer, params, n):
    """The optimizer's state after `n` updates of `params` (gradients 0.1)."""
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
    step = lambda state, _: (optimizer.update(grads, state, params)[1], None)  # noqa: E731
    return jax.jit(lambda: jax.lax.scan(step, optimizer.init(params), None, n)[0])()


def test_scheduled_lr_is_the_schedule_at_the_optimizers_step():
    params = {"w": jnp.ones(3)}
    for lr, want in ((optax.linear_schedule(1e-3, 0.0, 10), 1e-3 * (1 - 3 / 10)), (5e-4, 5e-4)):
        optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(lr, eps=1e-5))
        np.testing.assert_allclose(scheduled_lr(lr, after_updates(optimizer, params, 3)), want, rtol=1e-6)


def test_episode_length_counts_each_episodes_steps():
    """Four environments, done flags over seven steps; the lengths against a plain loop."""
    done = np.array([[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0],
                     [1, 0, 0, 0]], bool)
    runner = VecEnv._new_runner(None, jnp.zeros((4, 1)), jnp.zeros(4))
    step = jax.jit(lambda runner, d: VecEnv._advance(runner, None, runner.obs, runner.key, jnp.full(4, 0.5), d,
                                                     jnp.zeros(4, bool), runner.obs)[0])
    for d in done:
        runner = step(runner, d)
    running, last = [0] * 4, [0] * 4
    for d in done:
        for n in range(4):
            running[n] += 1
            if d[n]:
                last[n], running[n] = running[n], 0
    assert (list(np.asarray(runner.episode_length)), list(np.asarray(runner.last_length))) == (running, last)
    assert last == [4, 3, 3, 0]  # the third's second episode took 3 steps; the fourth has not finished one
    metrics = one_replica(episode_metrics, runner)
    np.testing.assert_allclose(metrics["episode_length"], np.mean([4, 3, 3]), rtol=1e-6)
    np.testing.assert_allclose(metrics["episode_return"], 0.5 * np.mean([4, 3, 3]), rtol=1e-6)


# ---------------------------------------------------------------- the algorithms' wiring
# Each algorithm with its networks replaced by a few scalars (no environment, no flax), so that the diagnostics
# it reports can be computed by hand from the same inputs.

OBS = RNG.normal(size=(6, 2)).astype(np.float32)
ACTION = np.array([0, 1, 1, 0, 1, 0], np.int32)


def log_softmax_np(logits):
    return logits - np.log(np.sum(np.exp(logits), -1, keepdims=True))


class LinearNetwork:
    """`apply(params, obs)`: one output per action, params["w"] * obs ([n, 2] -> [n, 2])."""

    @staticmethod
    def apply(params, obs):
        return params["w"] * obs


class ScriptedModel:
    """The actor-critics' model (src/fragc/algos/actor_critic.py): log pi(a|s) = w s_0 for every action, V(s) = v s_1."""

    unroll = False

    @staticmethod
    def evaluate(params, obs, action):
        return params["w"] * obs[..., 0], jnp.zeros(obs.shape[:-1]), params["v"] * obs[..., 1]

    @staticmethod
    def apply(params, obs):
        return None, params["v"] * obs[..., 1]


def scripted(algo):
    algo.model = ScriptedModel()
    return algo


SCALARS = {"w": jnp.float32(0.5), "v": jnp.float32(-1.0)}


def test_ppo_loss_reports_approx_kl_and_clip_fraction_of_its_ratios():
    zeros = np.zeros(6, np.float32)
    old_log_prob = 0.5 * OBS[:, 0] - LOG_RATIO
    traj = ppo.Transition(OBS, ACTION, old_log_prob, zeros, OBS, zeros, zeros, zeros, zeros)
    _, metrics = ppo.loss(SCALARS, traj, zeros + 1, zeros, ppo.Config(), ScriptedModel())
    np.testing.assert_allclose(metrics["approx_kl"], cleanrl_kl(LOG_RATIO), rtol=1e-3)
    np.testing.assert_allclose(metrics["clip_fraction"], 2 / 6, rtol=1e-6)


def rollout(T=4, N=2):
    """A [T, N] trajectory of scripted numbers; episodes end at (1, 0) and (T - 1, 1)."""
    done = np.zeros((T, N), bool)
    done[1, 0] = done[T - 1, 1] = True
    f = lambda *shape: RNG.normal(size=(T, N) + shape).astype(np.float32)  # noqa: E731
    return ppo.Transition(f(2), np.zeros((T, N), np.int32), f(), f(), f(2), f(), f(), done, done)


def test_ppo_learn_reports_the_learning_rate_and_explained_variance():
    """One update (2 epochs x 2 minibatches) from the optimizer's step 0 of 5 iterations x 2 epochs x 2
    minibatches: the mean of lr (1 - k/20), k = 0..3; the explained variance of the GAE targets by the rollout's
    values."""
    algo = scripted(ppo.PPO(ppo.Config(num_envs=2, num_steps=4, num_minibatches=2, update_epochs=2, total_steps=40)))
    traj = rollout()
    _, metrics = jax.jit(algo.learn)(ppo.Learner(SCALARS, algo.optimizer.init(SCALARS), jax.random.key(0)), traj)
    np.testing.assert_allclose(metrics["learning_rate"], 2.5e-4 * np.mean([1 - k / 20 for k in range(4)]), rtol=1e-6)
    _, targets = returns.gae(traj, 0.99, 0.95)
    np.testing.assert_allclose(metrics["explained_variance"], cleanrl_explained_variance(targets, traj.value),
                               rtol=1e-4)


class ScriptedRNN:
    """ppo_rnn's network: logits (w s_0, 0), V(s) = v s_1, the carry untouched."""

    @staticmethod
    def apply(params, hidden, obs, reset):
        return hidden, jnp.stack([params["w"] * obs[..., 0], jnp.zeros(obs.shape[:-1])], -1), params["v"] * obs[..., 1]


def test_ppo_rnn_loss_reports_approx_kl_and_the_clip_fraction_at_its_clip():
    algo = ppo_rnn.PPORNN(ppo_rnn.Config())
    obs, action = OBS.reshape(3, 2, 2), ACTION.reshape(3, 2)
    logits = np.stack([0.5 * obs[..., 0], np.zeros((3, 2), np.float32)], -1)
    log_prob = np.take_along_axis(log_softmax_np(logits), action[..., None], -1)[..., 0]
    zeros, reset = np.zeros((3, 2), np.float32), np.zeros((3, 2), bool)
    traj = ppo_rnn.Transition(np.zeros((3, 2, 1), np.float32), reset, obs, action, log_prob - LOG_RATIO.reshape(3, 2),
                              zeros, zeros, zeros, reset, reset)
    loss = functools.partial(ppo_rnn.loss, config=algo.config, network=ScriptedRNN())
    _, metrics = jax.jit(loss)(SCALARS, traj, zeros + 1, zeros, 0.1)  # the annealed clip of the moment
    np.testing.assert_allclose(metrics["approx_kl"], cleanrl_kl(LOG_RATIO), rtol=1e-3)
    np.testing.assert_allclose(metrics["clip_fraction"], 3 / 6, rtol=1e-6)


def test_impala_reports_clipped_rhos_explained_variance_and_learning_rate():
    """rho = exp(LOG_RATIO): 1.05, 1.16 and 1.35 exceed rho_bar 1; the explained variance of the V-trace targets
    by the learner's values; A2C's schedule at its step 0 is lr."""
    algo = scripted(impala.IMPALA(impala.Config(num_envs=2, num_steps=3)))
    traj = rollout(3, 2)
    traj = traj.replace(log_prob=0.5 * traj.obs[..., 0] - LOG_RATIO.reshape(3, 2))
    _, metrics = jax.jit(algo.learn)(ppo.Learner(SCALARS, algo.optimizer.init(SCALARS), jax.random.key(0)), traj)
    np.testing.assert_allclose(metrics["rho_clip_fraction"], 3 / 6, rtol=1e-6)
    values, next_values = -traj.obs[..., 1], -traj.next_obs[..., 1]
    vs = jax.jit(lambda *args: returns.vtrace(*args, 0.99).vs)(LOG_RATIO.reshape(3, 2), traj.reward, values,
                                                               next_values, traj.terminated, traj.done)
    np.testing.assert_allclose(metrics["explained_variance"], cleanrl_explained_variance(vs, values), rtol=1e-4)
    np.testing.assert_allclose(metrics["learning_rate"], 7e-4, rtol=1e-6)


def test_dqn_and_pqn_report_the_mean_q_of_the_taken_actions():
    q = 0.5 * OBS
    want = np.mean(q[np.arange(6), ACTION])
    batch = ReplayTransition(OBS, ACTION, np.ones(6, np.float32), OBS, np.zeros(6, np.float32))
    algo = dqn.DQN(dqn.Config())
    algo.model = QModel(LinearNetwork(), algo.model.chosen)
    loss, q_value = algo._td(SCALARS, SCALARS, batch)
    np.testing.assert_allclose(q_value, want, rtol=1e-6)
    assert float(loss) == float(algo._loss(SCALARS, SCALARS, batch))  # the TD loss, as before
    algo = pqn.PQN(pqn.Config())
    algo.model = QModel(LinearNetwork(), algo.model.chosen)
    _, metrics = algo._loss(SCALARS, pqn.Transition(OBS, ACTION, np.zeros(6, np.float32)))
    q_value = metrics["q_value"]
    np.testing.assert_allclose(q_value, want, rtol=1e-6)


def test_pqn_reports_its_decayed_learning_rate():
    """purejaxql's schedule from lr to 1e-20 over iterations x epochs x minibatches (10 x 4 x 2), at step 3."""
    algo = pqn.PQN(pqn.Config(num_envs=2, num_steps=4, num_minibatches=2, total_steps=80))
    state = after_updates(algo.optimizer, SCALARS, 3)
    np.testing.assert_allclose(scheduled_lr(algo._learning_rate(), state), 1e-4 + (1e-20 - 1e-4) * 3 / 80, rtol=1e-6)


class ScriptedSAC(sac.SAC):
    """Critics Q_i(s, a) = c_i (s_0 + a), an actor a = m s_0 + noise with log pi = -noise^2."""

    action_dim = 1

    def q_values(self, critic, obs, action):
        return critic["c"][:, None] * (obs[:, 0] + action[:, 0])[None]

    def squashed_gaussian(self, actor, obs, noise):
        return actor["m"] * obs[:, :1] + noise, -jnp.sum(noise ** 2, -1)


def test_sac_reports_both_critics_mean_q_of_the_batch():
    algo = ScriptedSAC(sac.Config())
    critic, actor = {"c": jnp.array([1.0, -2.0])}, {"m": jnp.float32(0.3)}
    learner = sac.Learner(actor, critic, critic, jnp.float32(0.0), algo.actor_optimizer().init(actor),
                          algo.critic_optimizer().init(critic), algo.alpha_optimizer().init(jnp.float32(0.0)),
                          jax.random.key(0), jnp.int32(0))
    action = RNG.uniform(-1, 1, (6, 1)).astype(np.float32)
    batch = ReplayTransition(OBS, action, np.ones(6, np.float32), OBS, np.zeros(6, np.float32))
    _, metrics = one_replica(algo.update, learner, batch)
    s_plus_a = np.mean(OBS[:, 0] + action[:, 0])
    np.testing.assert_allclose([metrics["qf1_value"], metrics["qf2_value"]], [s_plus_a, -2 * s_plus_a], rtol=1e-5)


def documented_metrics():
    """docs/metrics.md's "Per algorithm" list: {algorithm: its metrics}."""
    text = (pathlib.Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    listed = {}
    for line in text.split("## Per algorithm", 1)[1].splitlines():
        if line.startswith("- `"):
            algos, metrics = line[2:].split(": ", 1)
            for algo in re.findall(r"`(\w+)`", algos):
                listed[algo] = set(re.findall(r"`(\w+)`", metrics))
    return listed


@pytest.mark.slow  # traces every built-in algorithm (about 8 s)
def test_docs_list_the_metrics_of_every_algorithm():
    listed = documented_metrics()
    assert sorted(listed) == sorted(ALGOS)
    for name, metrics in listed.items():
        algo = make(name)
        _, reported = jax.eval_shape(algo.iteration, jax.eval_shape(algo.init, jax.random.key(0)))
        assert set(reported) == metrics, name


def test_a_users_optimizer_without_a_schedule_state_reports_no_learning_rate():
    """A schedule the optimizer does not keep (a user's own `optax.adam(config.lr)`) has no step count to read."""
    from fragc.algos.diagnostics import lr_metric

    params = {"w": jnp.zeros(2)}
    schedule = optax.linear_schedule(1e-3, 0.0, 10)
    assert lr_metric(schedule, optax.adam(1e-3).init(params)) == {}
    np.testing.assert_allclose(lr_metric(schedule, optax.adam(schedule).init(params))["learning_rate"], 1e-3)
