"""A trained policy outside fragc's runs (src/fragc/inference.py): `fragc.load_policy` of a checkpoint folder and of
`fragc export`'s folder act as the algorithm's own greedy policy on the same parameters, for every built-in
algorithm; sampling with a key, the recurrent carry, jit, and the refusals."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from fragc import algos
from fragc.cli import main
from fragc.runtime.checkpoint import Checkpointer
from fragc.training import algo_meta

SMALL = {
    "ppo": dict(num_envs=4, num_steps=8),
    "a2c": dict(num_envs=4, num_steps=8),
    "impala": dict(num_envs=4, num_steps=8),
    "ppo_continuous": dict(num_envs=4, num_steps=8),
    "ppo_rnn": dict(num_envs=4, num_steps=8),
    "dqn": dict(num_envs=4, num_steps=2, buffer_size=64, batch_size=16),
    "pqn": dict(num_envs=4, num_steps=8),
    "sac": dict(num_envs=4, num_steps=2, buffer_size=64, batch_size=16),
    "ippo": dict(num_envs=4, num_steps=4),
    "mappo": dict(num_envs=4, num_steps=4),
    "ippo_rnn": dict(num_envs=4, num_steps=4),
    "mappo_rnn": dict(num_envs=4, num_steps=4),
    "alphazero": dict(env="pgx:tic_tac_toe", num_envs=4, num_steps=4, batch_size=16, num_simulations=2, channels=4,
                      blocks=1, eval_games=4),
    "muzero": dict(num_envs=4, num_steps=4, num_simulations=2, unroll_steps=2, num_minibatches=2, hidden=16,
                   embedding=8),
}
MARL = ("ippo", "mappo", "ippo_rnn", "mappo_rnn")
EXTRA = {**{name: "jaxmarl" for name in MARL}, "alphazero": "pgx", "muzero": "mctx"}
"""The algorithms of an optional extra, by the package it brings."""
NAMES = [n for n in algos.ALGOS if n not in EXTRA or importlib.util.find_spec(EXTRA[n])]


def checkpoint(name, folder):
    """A checkpoint of `name`'s initial state, written as `fragc run` writes one (its metadata names the
    algorithm); -> (algorithm, state)."""
    algo = algos.make(name, **SMALL[name])
    state = algo.init(jax.random.key(3))
    with Checkpointer(str(folder)) as checkpoints:
        checkpoints.save(1, state, {}, algo_meta(algo, {"algo": name, "seed": 3}))
    return algo, state


def observations(algo, n=3):
    if hasattr(algo, "game"):  # a board game's: pgx's boards
        return jax.vmap(algo.game.init)(jax.random.split(jax.random.key(7), n)).observation
    return algo.env.reset(jax.random.key(7), n).obs


DEFAULT = {"ppo", "ppo_rnn", "dqn", "sac"}
"""The round trips in the default suite: a categorical, a recurrent, a value-based and a squashed-Gaussian policy; the
other algorithms' (the same code paths, on a multi-agent's rows or a board game's) in -m slow."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in NAMES])
def test_every_built_in_algorithm_round_trips(tmp_path, name):
    algo, state = checkpoint(name, tmp_path / "ckpt")
    obs = observations(algo)
    params = algo.policy_params(state)
    loaded = fragc.load_policy(tmp_path / "ckpt")
    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
    exported = fragc.load_policy(out)
    if loaded.recurrent:
        carry = algo.initial_carry(obs.shape[0])
        want = algo.greedy_step(params, carry, obs, jnp.zeros(obs.shape[:-1], bool))  # rows [n, A, D]: [n, A]
        for policy in (loaded, exported):
            got = policy(obs, carry=policy.initial_carry(obs.shape[0]))
            jax.tree.map(np.testing.assert_array_equal, got, want)
    else:
        want = algo.greedy_action(params, obs)
        for policy in (loaded, exported):
            np.testing.assert_array_equal(policy(obs), want, err_msg=name)
            np.testing.assert_array_equal(jax.jit(policy.act)(policy.params, obs), want, err_msg=name)


def test_every_built_in_algorithm_is_in_the_round_trips():
    assert set(NAMES) <= set(SMALL) and DEFAULT <= set(SMALL)


def test_a_key_samples_the_stochastic_policy_and_a_greedy_one_refuses_it(tmp_path):
    """PPO's categorical (a key per observation, as its rollout draws), SAC's squashed Gaussian; DQN refuses."""
    algo, state = checkpoint("ppo", tmp_path / "ppo")
    policy = fragc.load_policy(tmp_path / "ppo")
    obs = observations(algo, 5)
    keys = jax.random.split(jax.random.key(11), 5)
    want = algo.model.act(algo.policy_params(state), obs, keys)[0]
    np.testing.assert_array_equal(policy(obs, jax.random.key(11)), want)
    sac, sac_state = checkpoint("sac", tmp_path / "sac")
    sac_obs = observations(sac, 5)
    noise = jax.random.normal(jax.random.key(5), (5, sac.action_dim))
    want = sac.env_action(sac.squashed_gaussian(sac.policy_params(sac_state), sac_obs, noise)[0])
    np.testing.assert_array_equal(fragc.load_policy(tmp_path / "sac")(sac_obs, jax.random.key(5)), want)
    checkpoint("dqn", tmp_path / "dqn")
    with pytest.raises(fragc.FragcError, match="deterministic"):
        fragc.load_policy(tmp_path / "dqn")(obs, jax.random.key(0))


def test_bad_folders_are_one_line(tmp_path, capsys):
    with pytest.raises(fragc.FragcError, match="no checkpoint folder"):
        fragc.load_policy(tmp_path / "nothing")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "policy.json").write_text("{not json")
    with pytest.raises(fragc.FragcError, match="not a readable fragc export"):
        fragc.load_policy(broken)
    checkpoint("ppo", tmp_path / "ckpt")
    (tmp_path / "file").write_text("")
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "file")]) == 2
    assert "a file is there" in capsys.readouterr().err
