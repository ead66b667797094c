"""Recurrent IPPO and MAPPO (src/fragc/algos/ippo_rnn.py, mappo_rnn.py): each agent of each environment a sequence of
its own, against a plain loop over the agents; compiled under a policy against the reference interpreter; their
configs' presets and refusals. Learning against JaxMARL's own scripts is bench/marl_rnn_reference.py's."""

import dataclasses
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close

if importlib.util.find_spec("jaxmarl") is None:
    pytest.skip("jaxmarl is the optional extra fragc[marl]", allow_module_level=True)

from fragc.algos import ippo_rnn, mappo_rnn  # noqa: E402
from fragc.algos.marl_envs import AgentLayout  # noqa: E402
from fragc.cli import main  # noqa: E402

SMALL = dict(num_envs=4, num_steps=4, num_minibatches=2, update_epochs=1, hidden=8)
LAYOUT = AgentLayout(obs_size=3, world_size=6, num_actions=4, masked=True)


@pytest.mark.parametrize("centralised", [False, True])
def test_each_agent_of_each_environment_is_a_sequence_of_its_own(centralised):
    """The network on rows [T, N, A, D] equals it on each (environment, agent) sequence alone [T, 1, D]: its carry,
    logits and values; a reset restarts that sequence's carry only; unavailable actions' logits are -1e10."""
    net = ippo_rnn.AgentsActorCriticRNN(LAYOUT, 8, centralised)
    T, N, A, C = 5, 2, 3, 16 if centralised else 8
    rows = jax.random.normal(jax.random.key(0), (T, N, A, LAYOUT.size))
    rows = rows.at[..., LAYOUT.obs_size + LAYOUT.world_size:].set(jax.random.bernoulli(jax.random.key(1), 0.7,
                                                                                        (T, N, A, 4)))
    resets = jnp.zeros((T, N, A), bool).at[2, 1, 0].set(True)
    carry = jax.random.normal(jax.random.key(2), (N, A, C))
    params = net.init(jax.random.key(3), carry[0, :1], rows[:, 0, :1], resets[:, 0, :1])
    out_carry, logits, value = net.apply(params, carry, rows, resets)
    assert out_carry.shape == (N, A, C) and logits.shape == (T, N, A, 4) and value.shape == (T, N, A)
    for n in range(N):
        for a in range(A):
            one = net.apply(params, carry[n, a][None], rows[:, n, a][:, None], resets[:, n, a][:, None])
            np.testing.assert_allclose(out_carry[n, a], one[0][0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(logits[:, n, a], one[1][:, 0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(value[:, n, a], one[2][:, 0], rtol=1e-5, atol=1e-6)
    unavailable = np.asarray(rows[..., LAYOUT.obs_size + LAYOUT.world_size:] < 0.5)
    assert unavailable.any() and np.all(np.asarray(logits)[unavailable] == -1e10)
    # the reset: (environment 1, agent 0) from step 2 equals a fresh sequence of zeros from there
    fresh = net.apply(params, jnp.zeros((1, C)), rows[2:, 1, 0][:, None], jnp.zeros((T - 2, 1), bool))
    np.testing.assert_allclose(logits[2:, 1, 0], fresh[1][:, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,policy,devices", [
    ("ippo_rnn", "anakin", 2),
    pytest.param("mappo_rnn", "actor_learner", 4, marks=pytest.mark.slow),  # the default suite's 6 minutes; the
])  # slow algorithm x policy matrix (shared_programs.py) runs mappo_rnn under anakin, actor_learner_async, populations
def test_compiled_under_a_policy_equals_the_interpreter(name, policy, devices):
    """IPPO-RNN on MPE split over 2 replicas; MAPPO-RNN on SMAX (masked actions, the world state's critic) with its
    actors and learners on devices of their own: two iterations each against `fragc.interpret`."""
    algo = (ippo_rnn.IPPORNN(ippo_rnn.Config(**SMALL)) if name == "ippo_rnn" else
            mappo_rnn.MAPPORNN(mappo_rnn.Config(env="jaxmarl:SMAX_3m", **SMALL)))
    prog = fragc.compile(algo, policy, devices=devices)
    state = prog.init(0)
    module = fragc.trace(algo)
    replicas = {f.role: 2 for f in module.fragments.values()}
    ref = state
    for _ in range(2):
        ref, metrics = fragc.interpret(module, ref, replicas=replicas)
    out, history = prog.run(state, 2)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(history["episode_return"][-1], metrics["episode_return"], rtol=1e-4, atol=1e-4)
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(out.learner.params),
                                                         jax.tree.leaves(state.learner.params)))  # it learned
    if name == "mappo_rnn":
        assert "win_rate" in history and out.actor.hidden.shape == (4, 3, 16)  # both GRUs' carries per agent


def test_defaults_are_jaxmarls_and_smax_takes_its_preset():
    ippo, mappo = ippo_rnn.Config(), mappo_rnn.Config()
    assert (ippo.lr, ippo.num_minibatches, ippo.clip_eps, ippo.vf_coef) == (5e-4, 2, 0.3, 1.0)  # ippo_rnn_mpe.yaml
    assert (mappo.lr, mappo.num_minibatches, mappo.clip_eps, mappo.vf_coef) == (2e-3, 4, 0.2, 0.5)
    smax = mappo_rnn.MAPPORNN(mappo_rnn.Config(env="jaxmarl:SMAX_3m")).config
    assert (smax.lr, smax.num_envs, smax.ent_coef, smax.max_grad_norm) == (0.002, 128, 0.0, 0.25)
    mine = ippo_rnn.IPPORNN(ippo_rnn.Config(env="jaxmarl:SMAX_3m", lr=1e-3)).config  # a field given stays
    assert (mine.lr, mine.clip_eps, mine.num_envs) == (1e-3, 0.05, 128)
    assert dataclasses.replace(mine, preset="none").lr == 1e-3


@pytest.mark.parametrize("argv,message", [
    (["run", "ippo_rnn", "--env", "CartPole-v1"], "ippo_rnn is a multi-agent algorithm; CartPole-v1 is a single-agent "
                                                  "environment"),
    (["run", "mappo_rnn", "--num-envs", "6"], "mappo_rnn: num_envs (6) must divide by num_minibatches (4)"),
    (["run", "ippo_rnn", "--eval-every", "2"], "ippo_rnn: evaluation episodes (eval_every) take one agent's greedy"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_mappo_rnns_actor_and_critic_clip_their_gradients_apart():
    """As JaxMARL's MAPPO's two optimizers: a huge critic gradient does not shrink the actor's step. Two Adam steps
    (its first step's size does not depend on the gradient's scale), the second with the critic's gradient 1e6
    times larger: the actor's update is the same; under one clip of the whole gradient (IPPO-RNN's) it is not."""
    from fragc.algos import ppo

    algo = mappo_rnn.MAPPORNN(mappo_rnn.Config(**SMALL))
    params = algo.init(jax.random.key(0)).learner.params
    labels = ippo_rnn.critic_part(params)
    assert {"actor", "critic"} == set(jax.tree.leaves(labels))

    def actor_update(tx, critic_scale):
        ones = jax.tree.map(jnp.ones_like, params)
        second = jax.tree.map(lambda g, label: g * (critic_scale if label == "critic" else 1.0), ones, labels)
        state = tx.init(params)
        _, state = tx.update(ones, state, params)
        updates, _ = tx.update(second, state, params)
        return [u for u, label in zip(jax.tree.leaves(updates), jax.tree.leaves(labels)) if label == "actor"]

    apart = algo.optimizer
    jax.tree.map(np.testing.assert_allclose, actor_update(apart, 1e6), actor_update(apart, 1.0))
    together = ppo.optimizer(algo.config)
    assert not np.allclose(actor_update(together, 1e6)[0], actor_update(together, 1.0)[0])


def test_jaxmarls_truncation_rule_makes_every_episode_end_terminal():
    """`bootstrap_truncation=False`: the learner's GAE stops at every episode end without bootstrapping (JaxMARL's):
    its update is fragc's update of the trajectory with every done terminal; fragc's own rule bootstraps MPE's time
    limits, and updates otherwise."""
    config = ippo_rnn.Config(**{**SMALL, "num_steps": 32})  # MPE's episodes (26 steps) end inside the rollout
    own, jaxmarls = ippo_rnn.IPPORNN(config), ippo_rnn.IPPORNN(dataclasses.replace(config, bootstrap_truncation=False))
    state = own.init(jax.random.key(0))
    traj, _, _ = own.rollout(state.learner.params, state.actor)
    assert bool(jnp.any(traj.done & ~traj.terminated))  # truncated ends, as MPE's all are
    want, _ = own.learn(state.learner, traj.replace(terminated=traj.done))
    got, _ = jaxmarls.learn(state.learner, traj)
    assert_trees_close(got.params, want.params, rtol=1e-6, atol=1e-7)
    bootstrapped, _ = own.learn(state.learner, traj)
    assert not np.allclose(jax.tree.leaves(bootstrapped.params)[0], jax.tree.leaves(got.params)[0])
