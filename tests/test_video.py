"""Videos of a policy (src/fragc/sinks/video.py): from a checkpoint to .mp4 and .gif, and CaptureVideo during a run.

Frame counts are checked against episodes played here with plain gymnax (or Gymnasium) and the network's
argmax: an episode of T steps is T + 1 frames (its first state and each state reached)."""

import functools
import importlib.util
import os
import types
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
import fragc.cli
import fragc.algos
from fragc.ir.errors import FragcError
from fragc.runtime.actions import Every

iio = pytest.importorskip("imageio.v3", reason="videos need the video extra: pip install 'fragc[video]'")
pytest.importorskip("imageio_ffmpeg", reason="mp4 needs the video extra: pip install 'fragc[video]'")
if importlib.util.find_spec("pygame") is None:
    pytest.skip("CartPole is drawn by Gymnasium's renderer, which needs pygame (the video extra)",
                allow_module_level=True)

from fragc.cli import video as video_command  # noqa: E402
from fragc.sinks import video  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # imageio reading through ffmpeg
MAX_STEPS = 60
"""Episodes are cut here: enough for the tiny run's policy to end one by itself (seed 1), few frames to draw."""

CART, POLE = (0, 0, 0), (202, 152, 101)
"""Colours Gymnasium draws CartPole's cart and pole in."""


class Received:
    """A tracking sink's `on_video`, recorded: (iteration, path, frames, fps) of each video handed to it."""

    def __init__(self):
        self.videos = []

    def on_video(self, iteration, path, frames, fps):
        self.videos.append((iteration, path, len(frames), fps))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny PPO CartPole run of 4 iterations, checkpointed, recording a video (one episode of at most 30
    steps) every 2 iterations; the policy's parameters at each of those iterations."""
    algo = fragc.algos.make("ppo", num_envs=4, num_steps=8, total_steps=128)
    prog = fragc.compile(algo, "single", iterations_per_dispatch=2)
    folder = tmp_path_factory.mktemp("run")
    seen = {}
    capture = video.CaptureVideo(2, folder, max_steps=30)
    capture.sinks.append(Received())  # as fragc.train adds its tracking sinks
    record = Every(2, lambda iteration, state: seen.setdefault(iteration, algo.policy_params(state)))
    fragc.train(prog, prog.init(0), 4, checkpoint_dir=folder / "checkpoints", checkpoint_every=2,
                run_info={"algo": "ppo", "seed": 0}, actions=[record, capture])
    return algo, folder, seen, capture


@pytest.fixture(scope="module")
def rendered(run):
    """The frames of one episode (seed 1) of the policy at iteration 4, cut after 20 steps."""
    algo, _, seen, _ = run
    return video.render_episodes(algo, seen[4], 1, 1, max_steps=20)


@functools.cache
def plain(algo):
    """(gymnax's CartPole, its params, the network's argmax for one observation), made and compiled once."""
    import gymnax

    env, env_params = gymnax.make("CartPole-v1")
    return env, env_params, jax.jit(lambda p, obs: jnp.argmax(algo.model.apply(p, obs.reshape(1, -1))[0][0]))


def episode_lengths(algo, params, episodes, seed, max_steps=MAX_STEPS):
    """Steps of each greedy episode, played with gymnax's own step (which resets itself: the flags say when
    an episode ends) from the keys src/fragc/sinks/video.py documents."""
    env, env_params, act = plain(algo)
    lengths = []
    for key in jax.random.split(jax.random.key(seed), episodes):
        reset_key, carry = jax.random.split(key)
        obs, state = env.reset(reset_key, env_params)
        for t in range(1, max_steps + 1):
            step_key, carry = jax.random.split(carry)
            obs, state, _, terminated, truncated, _ = env.step(step_key, state, act(params, obs), env_params)
            if terminated or truncated:
                break
        lengths.append(t)
    return lengths


def n_frames(lengths):
    return sum(t + 1 for t in lengths)


def parse(*argv):
    """`fragc video ...` as the command line parses it."""
    return fragc.cli.commands.build_parser("video").parse_args(["video", *argv])


def test_command_writes_mp4(run, rendered, tmp_path, capsys):
    """`fragc video D --out agent.mp4 ...` (src/fragc/cli/video.py): the frames of the episodes played with plain
    gymnax."""
    algo, folder, seen, _ = run
    lengths = episode_lengths(algo, seen[4], 2, seed=1)
    assert min(lengths) < MAX_STEPS  # an episode that ends by itself, not only cut ones
    out = tmp_path / "agent.mp4"
    assert video_command.main(parse(str(folder / "checkpoints"), "--out", str(out), "--seed", "1", "--max-steps",
                                 str(MAX_STEPS))) == 0
    frames = n_frames(lengths)
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"wrote {out}: 2 episodes, {frames} frames of 600x400, ") and line.endswith(" KiB")
    written = iio.imread(out)
    assert written.shape == (frames, 400, 600, 3)
    # the first frames are a cart and a pole, as rendered
    first = rendered[0]
    assert (first == CART).all(-1).sum() > 1000 and (first == POLE).all(-1).sum() > 500
    assert np.abs(written[:len(rendered)].astype(int) - rendered).mean() < 1  # H.264's loss


def test_video_from_checkpoint_gif(run, rendered, tmp_path):
    from PIL import Image

    algo, folder, seen, _ = run
    lengths = episode_lengths(algo, seen[4], 1, seed=1, max_steps=20)
    path, frames, size = video.video_from_checkpoint(folder / "checkpoints", tmp_path / "agent.gif", episodes=1,
                                                     seed=1, fps=20, max_steps=20)
    assert (frames, size) == (n_frames(lengths), (600, 400)) == (len(rendered), (600, 400))
    changes = sum(not np.array_equal(a, b) for a, b in zip(rendered, rendered[1:]))
    with Image.open(path) as gif:
        assert gif.size == (600, 400)
        # Pillow keeps a run of identical frames as one, shown as long: the playing time is every frame's
        assert gif.n_frames == 1 + changes
        durations = []
        for i in range(gif.n_frames):
            gif.seek(i)
            durations.append(gif.info["duration"])
    assert sum(durations) == frames * 50


def test_capture_video_during_training(run):
    algo, folder, seen, capture = run
    names = sorted(os.listdir(folder / "videos"))
    assert names == ["iteration_0000002.mp4", "iteration_0000004.mp4"]
    assert capture.written == [str(folder / "videos" / n) for n in names]
    frames = {}
    for iteration in (2, 4):
        written = iio.imread(folder / "videos" / f"iteration_{iteration:07d}.mp4")
        frames[iteration] = n_frames(episode_lengths(algo, seen[iteration], 1, seed=0, max_steps=30))
        assert written.shape == (frames[iteration], 400, 600, 3)
    assert not np.array_equal(*[jax.tree.leaves(seen[i])[0] for i in (2, 4)])  # two policies
    [sink] = capture.sinks  # each video handed to the tracking sinks too, with its frames and rate
    assert sink.videos == [(i, str(folder / "videos" / f"iteration_{i:07d}.mp4"), frames[i], 50) for i in (2, 4)]


def test_an_unwritable_video_is_one_line_and_leaves_nothing(run, tmp_path, monkeypatch):
    """Issue 46, bad input 3: `fragc video CK --out <unwritable>/a.gif` printed its line, then imageio's
    `PluginV3.__del__` traceback (an unraisable exception as its writer was collected). Now refused before the
    checkpoint is read, nothing made; write_video alike."""
    import gc

    _, folder, _, _ = run
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    (tmp_path / "file").write_text("")
    for out in ("/proc/nope/a.gif", "/proc/a.gif", str(tmp_path / "file" / "sub" / "a.mp4")):
        with pytest.raises(FragcError, match=r"^cannot write the video in '.*': '.*' is (not writable|a file, not a folder)$"):
            video_command.main(parse(str(folder / "checkpoints"), "--out", out, "--max-steps", "2"))
        with pytest.raises(FragcError, match="cannot write the video"):
            video.write_video([np.zeros((4, 6, 3), np.uint8)], out, 10)
    gc.collect()  # once for the three: each full collection walks the worker's whole heap (about 1 s in the suite)
    assert unraisable == [] and os.listdir(tmp_path) == ["file"]


def test_headless_mujoco_picks_egl_or_osmesa(monkeypatch):
    """No display and no MUJOCO_GL: the first of EGL and OSMesa that makes a context (probed in a process of its
    own; faked here) is set as MUJOCO_GL, or one line refuses before training; a display, a MUJOCO_GL of the
    user's, or an environment that is not MuJoCo's are left alone."""
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM"):
        monkeypatch.setenv(name, "")  # recorded as it was before the test: what headless_gl sets is undone after it
        monkeypatch.delenv(name)  # (a delenv of an absent name records nothing, and a later one records the new value)
    tried = []
    monkeypatch.setattr(video, "_gl_works", lambda backend: tried.append(backend) or backend == "osmesa")
    video.headless_gl("gymnasium:HalfCheetah-v5", "HalfCheetah-v5")
    assert tried == ["egl", "osmesa"] and os.environ["MUJOCO_GL"] == os.environ["PYOPENGL_PLATFORM"] == "osmesa"
    video.headless_gl("gymnasium:Hopper-v5", "Hopper-v5")  # MUJOCO_GL is set now: no probe
    assert tried == ["egl", "osmesa"]
    monkeypatch.delenv("MUJOCO_GL")
    monkeypatch.delenv("PYOPENGL_PLATFORM")
    video.headless_gl("gymnasium:CartPole-v1", "CartPole-v1")  # not MuJoCo
    monkeypatch.setenv("DISPLAY", ":0")
    video.headless_gl("gymnasium:HalfCheetah-v5", "HalfCheetah-v5")  # a display
    assert tried == ["egl", "osmesa"] and "MUJOCO_GL" not in os.environ
    monkeypatch.delenv("DISPLAY")
    monkeypatch.setattr(video, "_gl_works", lambda backend: False)
    with pytest.raises(FragcError, match=r"^cannot render gymnasium:HalfCheetah-v5: there is no display, and MuJoCo "
                                         r"makes an OpenGL context with neither EGL nor OSMesa here; .* MUJOCO_GL"):
        video.check_renderable(types.SimpleNamespace(name="gymnasium:HalfCheetah-v5"))  # MuJoCo need not be here


@pytest.mark.slow
def test_headless_mujoco_renders(tmp_path, monkeypatch):
    """A MuJoCo environment renders without a display: MUJOCO_GL chosen by a real probe (a subprocess)."""
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    algo = fragc.algos.make("ppo_continuous", env="gymnasium:HalfCheetah-v5", num_envs=1, num_steps=8,
                            num_minibatches=1)
    params = algo.policy_params(jax.jit(algo.init)(jax.random.key(0)))
    frames = video.render_episodes(algo, params, 1, 0, max_steps=2)
    assert os.environ["MUJOCO_GL"] in video.GL_BACKENDS and len(frames) == 3 and frames[0].std() > 0


def test_gymnasium_host_environment(run):
    """A `gymnasium:` environment is drawn by a Gymnasium environment made with render_mode="rgb_array",
    seeded from each episode's reset key as the host pools seed theirs."""
    import gymnasium

    from fragc.algos.host_envs import seeds_of

    algo, _, seen, _ = run
    host = fragc.algos.make("ppo", env="gymnasium:CartPole-v1", num_envs=4, num_steps=8)
    frames = video.render_episodes(host, seen[4], 2, 5, max_steps=MAX_STEPS)
    env = gymnasium.make("CartPole-v1")
    act = plain(algo)[2]
    expected = 0
    for key in jax.random.split(jax.random.key(5), 2):
        obs, _ = env.reset(seed=seeds_of(np.asarray(jax.random.key_data(jax.random.split(key)[0]))[None])[0])
        for t in range(1, MAX_STEPS + 1):
            obs, _, terminated, truncated, _ = env.step(int(act(seen[4], obs)))
            if terminated or truncated:
                break
        expected += t + 1
    assert len(frames) == expected
    assert {f.shape for f in frames} == {(400, 600, 3)}


def test_refusals(tmp_path, monkeypatch):
    def one_line(call, *words):
        with pytest.raises(FragcError) as err:
            call()
        assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)

    frame = np.zeros((4, 6, 3), np.uint8)
    one_line(lambda: video.write_video([frame], tmp_path / "agent.avi", 10), "agent.avi", ".mp4 or .gif", "'.avi'")
    one_line(lambda: video.write_video([frame], tmp_path / "agent", 10), "without a suffix")
    one_line(lambda: video.video_from_checkpoint(tmp_path, tmp_path / "a.mp4"), "no checkpoint in", str(tmp_path))
    one_line(lambda: video.video_from_checkpoint(tmp_path / "missing", tmp_path / "a.gif"), "no checkpoint folder")
    one_line(lambda: video.video_from_checkpoint(tmp_path / "missing", tmp_path / "a.webm"), "'.webm'")
    unrenderable = fragc.algos.make("ppo", env="DeepSea-bsuite")
    one_line(lambda: video.render_episodes(unrenderable, None, 1, 0), "cannot render DeepSea-bsuite", "CartPole-v1")
    one_line(lambda: video.CaptureVideo(0, tmp_path), "every")
    with monkeypatch.context() as without:  # imageio not installed
        without.setitem(sys.modules, "imageio", None)
        without.setitem(sys.modules, "imageio.v3", None)
        one_line(lambda: video.write_video([frame], tmp_path / "a.gif", 10), "needs imageio: pip install 'fragc[video]'")
    # odd sides are padded to even ones for H.264
    assert video.write_video([np.full((5, 7, 3), 200, np.uint8)] * 3, tmp_path / "odd.mp4", 10) == (8, 6)
    assert iio.imread(tmp_path / "odd.mp4").shape == (3, 6, 8, 3)


def test_command_refusals(run):
    _, folder, _, _ = run
    for bad in (["--episodes", "0"], ["--fps", "x"], ["--member", "-1"]):
        with pytest.raises(SystemExit):
            parse("D", *bad)
    with pytest.raises(FragcError, match=r"^--member 1: the checkpoint in '.*' is of one run, not a population$"):
        video_command.main(parse(str(folder / "checkpoints"), "--member", "1"))


def test_a_recurrent_policy_plays_with_its_hidden_state_carried(tmp_path):
    """ppo_rnn (no greedy_action) acts through its evaluator's recurrent step, in the evaluator's environment (the
    whole CartPole observation, masked by the policy itself), its hidden state carried through each episode and
    fresh at the next: the frames are those of episodes played by a hand-written loop of `greedy_step`."""
    import gymnax

    algo = fragc.algos.make("ppo_rnn", mask_velocity=True, num_envs=4, num_steps=8, total_steps=64)
    params = algo.policy_params(jax.jit(algo.init)(jax.random.key(3)))
    env, env_params = gymnax.make("CartPole-v1")
    step = jax.jit(lambda hidden, obs: algo.greedy_step(params, hidden, obs.reshape(1, -1), jnp.zeros(1, bool)))
    lengths = []
    for key in jax.random.split(jax.random.key(2), 3):
        reset_key, carry = jax.random.split(key)
        obs, state = env.reset(reset_key, env_params)
        hidden = algo.initial_carry(1)
        for t in range(1, MAX_STEPS + 1):
            step_key, carry = jax.random.split(carry)
            hidden, action = step(hidden, obs)
            obs, state, _, terminated, truncated, _ = env.step(step_key, state, action[0], env_params)
            if terminated or truncated:
                break
        lengths.append(t)
    assert min(lengths) < MAX_STEPS
    assert not np.array_equal(hidden, algo.initial_carry(1))  # the hidden state moves: carrying it matters
    frames = video.render_episodes(algo, params, 3, 2, max_steps=MAX_STEPS)
    assert len(frames) == n_frames(lengths)
    assert frames[0].shape == (400, 600, 3)
