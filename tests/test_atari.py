"""Atari through EnvPool (issue 43): CleanRL's preprocessing as EnvPool's options, a lost life that continues the
game, and episode statistics over whole games at their unclipped score."""

import importlib.util
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from fragc.algos.host_envs import ATARI_OPTIONS, EnvPoolPool, HostVecEnv
from fragc.algos.vec_env import Runner, VecEnv

# found, not imported: importing envpool (its registrations, 2 s) here cost each xdist worker that collects this file
if importlib.util.find_spec("envpool") is None:
    pytest.skip("envpool is in the test extra; this runs wherever it is installed", allow_module_level=True)


def test_atari_is_made_with_cleanrls_preprocessing():
    obs_space, action_space = EnvPoolPool.spaces("Breakout-v5")
    assert obs_space.shape == (4, 84, 84) and obs_space.dtype == np.uint8  # 4 stacked 84x84 grey frames
    assert action_space.n == 4  # the minimal action set
    import envpool

    config = envpool.make_spec("Breakout-v5", **EnvPoolPool.options("Breakout-v5")).config
    assert config.episodic_life and config.reward_clip and config.noop_max == 30 and not config.full_action_space
    assert EnvPoolPool.options("CartPole-v1") == {} and not EnvPoolPool.game_stats("CartPole-v1")
    assert HostVecEnv("envpool:Breakout-v5").game_stats


def test_the_pool_steps_as_envpool_itself_with_a_lost_life_continuing_the_game():
    """The reference is EnvPool's own pool, which resets on the step after a termination (ignoring its action):
    the pool takes that step at once (same-step autoreset), so its steps are the reference's without them."""
    n, steps = 2, 400
    pool = EnvPoolPool("Breakout-v5", n)
    keys = np.array([[0, 7], [0, 8]], np.uint32)
    obs = pool.reset(keys)
    import envpool

    from fragc.algos.host_envs import seeds_of
    reference = envpool.make_gymnasium("Breakout-v5", num_envs=n, seed=seeds_of(keys)[0] % 2**31, **ATARI_OPTIONS)
    ref_obs, _ = reference.reset()
    np.testing.assert_array_equal(obs, ref_obs)
    rng = np.random.default_rng(0)
    lives_lost = games = 0
    for _ in range(steps):
        actions = rng.integers(0, 4, n).astype(np.int32)
        obs, reward, terminated, truncated, final_obs, score, game_over = pool.step(actions, keys)
        r_obs, r_reward, r_term, r_trunc, info = reference.step(actions)
        np.testing.assert_array_equal(final_obs, r_obs)
        np.testing.assert_array_equal(reward, r_reward)  # clipped
        np.testing.assert_array_equal(terminated, r_term)  # a lost life terminates the algorithm's episode
        np.testing.assert_array_equal(score, info["reward"])  # the game's own reward
        np.testing.assert_array_equal(game_over, info["terminated"].astype(bool) | r_trunc)
        done = np.flatnonzero(r_term | r_trunc)
        if len(done):  # the reference's reset step, which the pool took already
            start, *_ = reference.step(np.zeros(len(done), np.int32), done.astype(np.int32))
            np.testing.assert_array_equal(obs[done], start)
        lives_lost += int(np.sum(terminated & ~game_over))
        games += int(np.sum(game_over))
    assert lives_lost >= 4 and games >= 1, (lives_lost, games)  # both kinds of ending were checked
    pool.close()


def test_episode_statistics_count_whole_games_at_their_score():
    n = 1
    runner = Runner(None, jnp.zeros((n, 1)), None, jnp.zeros(n), jnp.zeros(n), jnp.zeros(n, bool),
                    jnp.zeros(n, jnp.int32), jnp.zeros(n, jnp.int32))
    # a game of three steps: a point (clipped to 1 from 4), a lost life, then a point of 7 and the game's end
    steps = [(1.0, False, 4.0, False), (0.0, True, 0.0, False), (1.0, True, 7.0, True)]
    for reward, terminated, score, game_over in steps:
        runner, out = VecEnv._advance(runner, None, runner.obs, None, jnp.array([reward]), jnp.array([terminated]),
                                      jnp.array([False]), runner.obs, jnp.array([score]), jnp.array([game_over]))
        assert bool(out.episode_done[0]) == terminated  # the algorithm's episodes end at each lost life
        assert float(out.reward[0]) == reward  # and it learns from the clipped reward
    assert float(runner.last_return[0]) == 11.0 and int(runner.last_length[0]) == 3 and bool(runner.has_return[0])


def _refused(argv, capsys, monkeypatch, tmp_path) -> str:
    """`fragc ARGV`'s one error line: exit code 2, nothing else printed (no compiling line), nothing written."""
    from fragc.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, (out, err)
    assert os.listdir(tmp_path) == []
    return err


def test_an_atari_id_envpool_lacks_is_one_line_before_compiling(capsys, monkeypatch, tmp_path):
    err = _refused(["run", "ppo", "--env", "envpool:Breakoutt-v5"], capsys, monkeypatch, tmp_path)
    assert err == "fragc: error: envpool: unknown environment 'Breakoutt-v5'; did you mean 'Breakout-v5'?\n"


def test_capture_video_on_atari_without_ale_py_names_the_extra(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # `import ale_py` raises ImportError, as where it is missing
    err = _refused(["run", "ppo", "--env", "envpool:Breakout-v5", "--capture-video",
                    "--eval-every", "10"], capsys, monkeypatch, tmp_path)
    assert err == ("fragc: error: cannot render envpool:Breakout-v5: ale-py is not installed "
                   "(pip install 'fragc[atari]')\n")


class ScriptedGame(VecEnv):
    """One Atari-like game on the device: a point (clipped 1, scored 4), a lost life (the algorithm's episode
    ends), a point (clipped 1, scored 7) and the game's end, then nothing. Its time limit is 10 steps."""

    name, max_episode_steps = "scripted", 10
    REWARD, LIFE_LOST, SCORE, GAME_OVER = (1.0, 0.0, 1.0), (False, True, True), (4.0, 0.0, 7.0), (False, False, True)

    def reset_each(self, keys, index):
        return self._new_runner(jnp.zeros(keys.shape[0], jnp.int32), jnp.zeros((keys.shape[0], 1)), keys)

    def step(self, runner, action, step_keys=None):
        t = runner.env_state
        at = lambda table, dtype: jnp.where(t < 3, jnp.asarray(table, dtype)[jnp.minimum(t, 2)], jnp.zeros((), dtype))  # noqa: E731
        return self._advance(runner, t + 1, runner.obs, runner.key, at(self.REWARD, jnp.float32),
                             at(self.LIFE_LOST, bool), jnp.zeros_like(t, bool), runner.obs, at(self.SCORE, jnp.float32),
                             at(self.GAME_OVER, bool))


def test_evaluation_counts_whole_games_at_their_score_as_training_does():
    import jax

    from fragc.algos.evaluation import Episodes, Evaluator

    evaluator = Evaluator("scripted", lambda params, obs: jnp.zeros(obs.shape[0], jnp.int32), every=1, episodes=2)
    evaluator.__dict__["env"] = ScriptedGame("scripted")
    episodes = Episodes(jax.random.split(jax.random.key(0), 2), jnp.arange(2, dtype=jnp.int32))
    # the game's score over both lives (4 + 7), not the clipped reward of the first life (1)
    assert float(jax.jit(evaluator.evaluate)(None, episodes)) == 11.0


def test_ppo_takes_cleanrls_atari_values_on_an_atari_game_unless_given(capsys):
    """On an EnvPool Atari game PPO's CartPole defaults give way to CleanRL's ppo_atari_envpool.py values, field by
    field where the config does not give them; --help states both defaults."""
    from fragc import algos
    from fragc.cli import main

    atari = algos.make("ppo", env="envpool:Breakout-v5").config
    assert (atari.num_envs, atari.clip_eps, atari.network, atari.total_steps) == (8, 0.1, "nature_cnn", 10_000_000)
    assert algos.make("ppo", env="envpool:Breakout-v5", num_envs=16, clip_eps=0.2).config.num_envs == 16
    for other in ("CartPole-v1", "envpool:CartPole-v1"):
        config = algos.make("ppo", env=other).config
        assert (config.num_envs, config.clip_eps, config.network) == (4, 0.2, "auto")
    with pytest.raises(SystemExit):
        main(["run", "ppo", "--help"])
    assert "(default 0.2; on an envpool: Atari game 0.1)" in " ".join(capsys.readouterr().out.split())
