"""The algorithms with a CNN on pixels (docs/pixels.md): frames stay frames, uint8 ones uint8, from the rollout
to the learner; each algorithm's compiled program equals the reference interpreter; bad names are one line.

Environments: `TinyPixels` (tests/pixel_envs.py: EnvPool's layout, uint8 2x36x36, the Nature CNN's smallest
frames) and gymnax's Breakout-MinAtar (float 10x10x4, where `auto` takes the IMPALA CNN). Compiling a CNN
program and interpreting it take 8-15 s per algorithm on 2 cores, so those cells are in -m slow.
"""

import re

import jax
import numpy as np
import pytest

import fragc
from conftest import assert_trees_close
from fragc.algos import dqn, impala, ppo, ppo_continuous, pqn
from fragc.ir.errors import FragcError
from fragc.passes import default_passes, resolve, run_pipeline
from pixel_envs import SIZE, FRAMES, on_tiny_pixels

ITERATIONS = 2

ALGOS = {
    "ppo": lambda env: ppo.PPO(ppo.Config(env=env, num_envs=4, num_steps=4, num_minibatches=2, update_epochs=2)),
    "impala": lambda env: impala.IMPALA(impala.Config(env=env, num_envs=4, num_steps=4)),
    "pqn": lambda env: pqn.PQN(pqn.Config(env=env, num_envs=4, num_steps=4, num_minibatches=2, num_epochs=2)),
    "dqn": lambda env: dqn.DQN(dqn.Config(env=env, num_envs=4, num_steps=2, buffer_size=16, batch_size=4,
                                          learning_starts=0)),
}
"""Each algorithm with 4 environments (one per actor and learner device under actor_learner on 8)."""


def small(name, env):
    """`name`'s small algorithm on `env`: "tiny" for TinyPixels, else a gymnax id."""
    if env == "tiny":
        return on_tiny_pixels(ALGOS[name]("CartPole-v1"))
    return ALGOS[name](env)


def chosen(algo):
    """The network an algorithm chose (`auto` resolved)."""
    return algo.model.chosen


def test_the_trajectory_crosses_to_the_learner_once_as_uint8_frames():
    algo = small("ppo", "tiny")
    assert chosen(algo).name == "nature_cnn"  # auto, for 36x36 frames
    module = run_pipeline(fragc.trace(algo), default_passes(resolve("actor_learner", 8), 1, "device_put")).final
    text = str(module)
    frames = f"u8[4,4@env,{FRAMES},{SIZE},{SIZE}]"  # [num_steps, num_envs, 2, 36, 36], as the environment makes them
    assert f"    obs: {frames},\n" in text
    assert "next_obs" not in text  # PPO's learner needs V(s_{t+1}) only, which the actors compute
    # obs a byte a pixel, once; action (i32), log_prob, value, next_value, reward (f32); two bool flags
    steps = 4 * 4
    expected = steps * FRAMES * SIZE * SIZE + steps * 5 * 4 + steps * 2
    assert f"type !Transition = {{   // 8 leaves, {expected / 1024:.1f} KiB" in text
    moves = re.findall(r"= transfer %transition @actors -> @learner via device_put   // (.*)", text)
    assert moves == [f"{expected / 1024:.1f} KiB"]  # once an iteration, whatever the epochs
    # a float32 trajectory would have been four times the frames' bytes
    assert chosen(algo).observations.frames(jax.numpy.zeros((1, algo.env.obs_size))).dtype == np.uint8


def test_dqns_replay_buffer_holds_uint8_frames():
    algo = small("dqn", "tiny")
    state = jax.eval_shape(algo.init, jax.random.key(0))
    for leaf in (state.buffer.data.obs, state.buffer.data.next_obs):
        assert (leaf.shape, leaf.dtype) == ((16 // 4, 4, FRAMES, SIZE, SIZE), np.uint8)


CELLS = [("ppo", "tiny"), ("impala", "Breakout-MinAtar"), ("pqn", "tiny"), ("dqn", "tiny"),
         ("ppo", "Breakout-MinAtar"), ("pqn", "Breakout-MinAtar"), ("dqn", "Breakout-MinAtar"), ("impala", "tiny")]
"""Every algorithm with each CNN: the Nature CNN on TinyPixels, the IMPALA CNN on MinAtar (auto's choices)."""


@pytest.mark.slow
@pytest.mark.parametrize("name,env", CELLS)
def test_a_cnn_program_under_actor_learner_equals_the_interpreter(name, env):
    algo = small(name, env)
    assert chosen(algo).name == ("nature_cnn" if env == "tiny" else "impala_cnn")
    prog = fragc.compile(algo, "actor_learner", devices=8)
    state = prog.init(0)
    out, history = prog.run(state, ITERATIONS)
    module = fragc.trace(algo)
    replicas = {f.role: 4 for f in module.fragments.values()}
    ref = state
    for i in range(ITERATIONS):
        ref, metrics = fragc.interpret(module, ref, replicas=replicas)
        np.testing.assert_allclose(history["episode_return"][i], metrics["episode_return"], rtol=1e-4, atol=1e-4)
    assert_trees_close(out, ref, rtol=2e-4, atol=2e-5)
    assert ref.learner.params is not state.learner.params
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ref.learner.params),
                                                         jax.tree.leaves(state.learner.params)))  # it learned


@pytest.mark.parametrize("args,message", [
    (["run", "ppo", "--network", "resnet"],
     "ppo: network must be one of auto, mlp, nature_cnn, impala_cnn, got 'resnet'"),
    (["run", "dqn", "--network", "cnn"], "dqn: network must be one of auto, mlp, nature_cnn, impala_cnn, got 'cnn'"),
    (["run", "ppo_continuous", "--network", "nature_cnn"],
     "ppo_continuous: network must be auto or mlp (no pixel network for continuous actions), got 'nature_cnn'"),
])
def test_a_bad_network_is_one_line(args, message, capsys):
    from fragc.cli import main

    assert main(args) == 2
    assert capsys.readouterr().err == f"fragc: error: {message}\n"


def test_a_cnn_on_frames_it_cannot_take_or_on_vectors_is_one_line():
    with pytest.raises(FragcError, match=r"^network nature_cnn needs frames of at least 36x36; this environment's "
                                         r"are 10x10 \(10, 10, 4\) \(use impala_cnn\)$"):
        pqn.PQN(pqn.Config(env="Breakout-MinAtar", network="nature_cnn")).model
    with pytest.raises(FragcError, match=r"^network impala_cnn needs frames .* this environment's are \(4,\)$"):
        ppo.PPO(ppo.Config(network="impala_cnn")).model
    assert chosen(ppo_continuous.PPOContinuous()).name == "mlp"



def test_next_obs_crosses_only_to_a_learner_that_may_read_it():
    """PPO's and A2C's learners bootstrap from V(s_{t+1}), which the rollout computes: no s_{t+1} in their
    trajectories. IMPALA's bootstraps under the learner's own parameters, and a user's PPO whose learner reads it
    keeps it in its own rollout (`collect(..., keep_next_obs=True)`)."""
    from fragc.algos import a2c, impala, ppo
    from fragc.algos.actor_critic import collect

    class OwnLoss(ppo.PPO):
        @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None))
        def rollout(self, params, runner):
            return collect(self.model, self.env, params, runner, self.config.num_steps, keep_next_obs=True)

    def next_obs(algo):
        state = jax.eval_shape(algo.init, jax.random.key(0))
        return jax.eval_shape(algo.rollout, state.learner.params, state.runner)[0].next_obs

    assert next_obs(ppo.PPO()) is None and next_obs(a2c.A2C()) is None
    for algo in (impala.IMPALA(), OwnLoss()):
        assert next_obs(algo).shape == (algo.config.num_steps, algo.config.num_envs, algo.env.obs_size)
    config = ppo.Config(num_envs=2, num_steps=4, num_minibatches=2)
    kept, dropped = (str(fragc.trace(algo(config))) for algo in (OwnLoss, ppo.PPO))
    assert "    next_obs: f32[4,2@env,4],\n" in kept and "next_obs" not in dropped
