"""Videos of a policy: `render_episodes` and `video_from_checkpoint` (`fragc video CHECKPOINT_DIR --out
agent.mp4`, src/fragc/cli/video.py), and `CaptureVideo` during a run.

`render_episodes(algo, params, episodes, seed)` plays whole episodes with the algorithm's deterministic
policy, what evaluation acts with (`algo.greedy_action(params, obs)`; a recurrent policy's
`Evaluator.recurrent` step, its carry fresh at each episode's start, in the environment its evaluator plays)
and draws every state:

- gymnax classic control (CartPole-v1, Pendulum-v1, Acrobot-v1, MountainCar-v0,
  MountainCarContinuous-v0): each gymnax state is set on a Gymnasium environment of the same id and drawn
  by Gymnasium's renderer (what gymnax's own renderer does; it needs pygame);
- the other gymnax environments gymnax draws (MinAtar, Catch-bsuite, Pong-misc, PointRobot-misc,
  MetaMaze-misc, FourRooms-misc): gymnax's `Visualizer`, one matplotlib figure, redrawn state by state;
- `gymnasium:ID` environments: a Gymnasium environment made with `render_mode="rgb_array"`;
- `envpool:ID` environments: the same task made by Gymnasium (EnvPool renders nothing): the same id where
  Gymnasium has it (classic control, MuJoCo), `ALE/ID` with EnvPool's default Atari preprocessing for
  Atari; its observations must have the size the policy was trained on.

Anything else is refused in one line. The episodes are those a `VecEnv` of the environment would play from
the keys `jax.random.split(jax.random.key(seed), episodes)`: episode e resets from `split(keys[e])[0]`
and steps with the keys split off the rest, as `VecEnv.reset_each` and `VecEnv.step` split them (a host
environment is seeded from its reset key as the host pools seed theirs). An episode that ends after T
steps gives T + 1 frames: its first state, then the state each step reaches (the last one the terminal
or truncated state, before any reset). The episodes' frames follow one another.

`write_video(frames, path, fps)` writes .mp4 (H.264 through imageio's ffmpeg plugin) or .gif (Pillow);
`video_from_checkpoint` restores the latest good checkpoint's parameters, renders and writes; `CaptureVideo`
is a periodic action writing `DIRECTORY/videos/iteration_NNNNNNN.mp4` during training. Writing needs
imageio (and imageio-ffmpeg for .mp4), drawing classic control needs pygame: `pip install 'fragc[video]'`.

What draws and writes frames is imported inside the function that uses it, never when this module is imported
(`fragc run` imports it for `--capture-video`): the optional extras (imageio, pygame, ale_py) so that a missing
one is refused in one line when it is needed, and the heavy modules (gymnax's renderers with matplotlib, orbax)
so that a run that records no video does not pay for them.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import subprocess
import sys
import warnings
from typing import Any, Callable

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np

from fragc import algos
from fragc.algos.envs import VecEnv, split_env_name
from fragc.algos.evaluation import Evaluator
from fragc.algos.host_envs import seeds_of
from fragc.ir.errors import FragcError
from fragc.ir.sweep import swept
from fragc.runtime.actions import Action, Run
from fragc.runtime.checkpoint import Checkpointer
from fragc.sinks.tracking import check_writable

SUFFIXES = (".mp4", ".gif")
"""The formats `write_video` writes."""

INSTALL = "pip install 'fragc[video]'"

CLASSIC_CONTROL = ("Acrobot-v1", "CartPole-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0")
"""gymnax environments drawn by Gymnasium's renderer of the same id (gymnax.visualize.vis_gym)."""

MATPLOTLIB_DRAWN = ("Catch-bsuite", "Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar",
                    "SpaceInvaders-MinAtar", "Pong-misc", "PointRobot-misc", "MetaMaze-misc", "FourRooms-misc")
"""gymnax environments gymnax's `Visualizer` draws with matplotlib (its `init` and `update` name them)."""

DEFAULT_FPS = 30
"""Frames per second where the environment does not say (Gymnasium's `metadata["render_fps"]`)."""

ATARI_PREPROCESSING = {"noop_max": 30, "frame_skip": 4, "screen_size": 84, "grayscale_obs": True}
"""EnvPool's default Atari preprocessing, as Gymnasium's `AtariPreprocessing` takes it (and 4 stacked frames)."""


# ---------------------------------------------------------------- rendering


def render_episodes(algo: Any, params: Any, episodes: int, seed: int, max_steps: int | None = None) -> list[np.ndarray]:
    """The frames (H, W, 3) uint8 of `episodes` greedy episodes of `algo.env` acting with `params`.

    max_steps: end an episode after this many steps (default: the environment's own time limit); an episode
    of T steps gives T + 1 frames (the module docstring says which states and keys)."""
    with EpisodeRenderer(algo) as renderer:
        return renderer.render(params, episodes, seed, max_steps)


class EpisodeRenderer:
    """`render_episodes` for one algorithm, again and again: its jitted steps, the Gymnasium environment or
    the figure it draws with are made once (what `CaptureVideo` keeps for all the videos of a run). Close it
    (or use it as a context manager) to close them."""

    def __init__(self, algo: Any):
        self.greedy = _greedy(algo)
        env = self.greedy.env
        if not isinstance(env, VecEnv):
            raise FragcError(f"{type(algo).__name__}.env is not a fragc.algos.envs.VecEnv: videos play episodes of "
                             "the algorithm's environment (VecEnv(name))")
        check_renderable(env)
        backend, env_id = split_env_name(env.name)
        self.episodes: _Renderer = (_GymnaxRenderer(env, env_id) if backend == "gymnax"
                                    else _GymnasiumRenderer(env, backend, env_id))

    @property
    def fps(self) -> int:
        """The frame rate the environment's renderer plays at: Gymnasium's `metadata["render_fps"]` (classic
        control too; over the frames skipped between two of EnvPool's Atari steps), else gymnax's `Visualizer`'s
        (10 frames a second)."""
        return self.episodes.fps

    def render(self, params: Any, episodes: int, seed: int, max_steps: int | None = None) -> list[np.ndarray]:
        """What `render_episodes(algo, params, episodes, seed, max_steps)` returns."""
        _check_count("episodes", episodes)
        if max_steps is not None:
            _check_count("max_steps", max_steps)
        frames: list[np.ndarray] = []
        for key in _episode_keys(seed, episodes):
            frames += self.episodes.episode(self.greedy, params, key, max_steps)
        return frames

    def close(self) -> None:
        self.episodes.close()

    def __enter__(self) -> "EpisodeRenderer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_capture(algo: Any, directory: str | os.PathLike) -> None:
    """Refuse, in one line, what `CaptureVideo(every, directory)` could not do for `algo` (a policy it cannot
    play, an environment it cannot draw, a folder it cannot write), before a run compiles: `fragc run
    --capture-video` calls it first."""
    env = _greedy(algo).env
    if not isinstance(env, VecEnv):
        raise FragcError(f"{type(algo).__name__}.env is not a fragc.algos.envs.VecEnv: videos play episodes of "
                         "the algorithm's environment (VecEnv(name))")
    check_renderable(env)
    check_writable(os.path.join(os.fspath(directory), "videos"), "videos")


def check_renderable(env: Any) -> None:
    """Refuse, in one line, an environment `render_episodes` cannot draw (before a run that records videos)."""
    backend, env_id = split_env_name(env.name)
    if backend == "gymnax":
        if env_id not in CLASSIC_CONTROL + MATPLOTLIB_DRAWN:
            raise FragcError(f"cannot render {env.name}: gymnax has no renderer for it (it draws "
                             f"{', '.join(CLASSIC_CONTROL + MATPLOTLIB_DRAWN)})")
        if env_id in CLASSIC_CONTROL:
            _require_pygame(env.name)
    elif backend not in ("gymnasium", "gymnasium_async", "envpool"):
        raise FragcError(f"cannot render {env.name}: the {backend} backend has no renderer (videos render gymnax, "
                         "gymnasium and envpool environments)")
    elif backend == "envpool" and _gymnasium_id(backend, env_id) is None:
        raise FragcError(f"cannot render {env.name}: EnvPool renders nothing, and Gymnasium has no '{env_id}' "
                         "to render the same task with")
    elif backend == "envpool" and _is_atari(env_id):
        _require_atari(env.name)
    else:
        headless_gl(env.name, _gymnasium_id(backend, env_id))


def _require_atari(name: str) -> None:
    """Gymnasium draws EnvPool's Atari games with ale-py's emulator and OpenCV's resize (AtariPreprocessing)."""
    for module, package in (("ale_py", "ale-py"), ("cv2", "opencv-python-headless")):
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise FragcError(f"cannot render {name}: {package} is not installed (pip install 'fragc[atari]')") from err


GL_BACKENDS = ("egl", "osmesa")
"""What MuJoCo renders with off screen, in the order tried where there is no display (MUJOCO_GL's values)."""


def headless_gl(name: str, gym_id: str | None) -> None:
    """A MuJoCo environment on a machine without a display (no DISPLAY or WAYLAND_DISPLAY) and without MUJOCO_GL:
    set MUJOCO_GL (and PYOPENGL_PLATFORM) to the first of EGL and OSMesa that makes an OpenGL context here, or
    refuse in one line. Gymnasium's MuJoCo renderer otherwise tries GLFW, which needs a display, and fails at
    the first frame (`mujoco.FatalError: an OpenGL platform library has not been loaded`)."""
    if "MUJOCO_GL" in os.environ or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return
    if not _is_mujoco(gym_id):
        return
    for backend in GL_BACKENDS:
        if _gl_works(backend):
            os.environ["MUJOCO_GL"] = backend
            os.environ.setdefault("PYOPENGL_PLATFORM", backend)
            return
    raise FragcError(f"cannot render {name}: there is no display, and MuJoCo makes an OpenGL context with neither "
                     "EGL nor OSMesa here; install one (libegl1, or libosmesa6) or give a display, and set "
                     "MUJOCO_GL (docs/videos.md)")


def _is_mujoco(gym_id: str | None) -> bool:
    try:
        entry = gymnasium.spec(gym_id).entry_point if gym_id else ""
    except gymnasium.error.Error:
        return False
    return "mujoco" in str(entry)


def _gl_works(backend: str) -> bool:
    """Whether MuJoCo makes an OpenGL context with `backend`, tried in a process of its own (a failed try can
    leave a process's OpenGL bindings half set up)."""
    probe = f"import mujoco.{backend} as gl; context = gl.GLContext(8, 8); context.make_current(); context.free()"
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclasses.dataclass(frozen=True, eq=False)
class _Greedy:
    """The deterministic policy a video acts with, in one environment: `act(params, carry, obs[1, obs_size]) ->
    (carry, actions[1])` from `start()`, the carry at an episode's start (None for a feed-forward policy); `env`
    the environment it acts in."""

    start: Callable[[], Any]
    act: Callable[[Any, Any, Any], tuple[Any, Any]]
    env: Any


def _greedy(algo: Any) -> _Greedy:
    """`algo`'s greedy policy: its evaluator's recurrent step (`Evaluator.recurrent`: ppo_rnn, which acts in the
    evaluator's environment, masking the observations itself), its own `greedy_step` (ippo_rnn's), else
    `greedy_action(params, obs)` in `algo.env`."""
    if not callable(getattr(algo, "policy_params", None)):
        raise FragcError(f"{type(algo).__name__} has no policy_params(): videos act with the deterministic policy "
                         "(policy_params(state) and greedy_action(params, obs), as the built-in algorithms define "
                         "them)")
    evaluator = getattr(algo, "evaluator", None)
    if isinstance(evaluator, Evaluator) and evaluator.greedy_step is not None:
        running = jnp.ones(1, bool)  # an episode's steps: its carry is reset only at its start (`start`)
        step = jax.jit(lambda params, carry, obs: evaluator.act(params, carry, obs, running))
        return _Greedy(lambda: evaluator.initial_carry(1), step, evaluator.env)
    if callable(getattr(algo, "greedy_step", None)) and callable(getattr(algo, "initial_carry", None)):
        # a recurrent policy without evaluation episodes (ippo_rnn's): its own step, in its own environment
        step = jax.jit(lambda params, carry, obs: algo.greedy_step(params, carry, obs, jnp.zeros(obs.shape[:-1], bool)))
        return _Greedy(lambda: algo.initial_carry(1), step, getattr(algo, "env", None))
    if not callable(getattr(algo, "greedy_action", None)):
        raise FragcError(f"{type(algo).__name__} has no greedy_action(): videos act with the deterministic policy "
                         "(policy_params(state) and greedy_action(params, obs), or a recurrent policy's "
                         "Evaluator.recurrent, as the built-in algorithms define them)")
    action = jax.jit(algo.greedy_action)
    return _Greedy(lambda: None, lambda params, carry, obs: (None, action(params, obs)), getattr(algo, "env", None))


def _episode_keys(seed: int, episodes: int) -> list[Any]:
    return list(jax.random.split(jax.random.key(seed), episodes))


def _check_count(name: str, value: Any) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise FragcError(f"{name} must be a positive whole number, got {value!r}")


class _Renderer:
    """Plays one episode at a time and draws its states; `close` closes what it opened."""

    fps: int = DEFAULT_FPS

    def episode(self, greedy: Any, params: Any, key: Any, max_steps: int | None) -> list[np.ndarray]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _GymnaxRenderer(_Renderer):
    """A gymnax environment stepped on the device one step at a time (no reset after the last), each state
    drawn by `_ClassicControlDrawer` or `_VisualizerDrawer`."""

    def __init__(self, vec: Any, env_id: str):
        self.vec, self.env_id = vec, env_id
        self._reset, self._step = _gymnax_steps(vec)  # jitted once for every episode and video
        if env_id in CLASSIC_CONTROL:
            self.drawer: Any = _ClassicControlDrawer(vec.env, vec.params, env_id)
            self.fps = int(self.drawer.gym_env.metadata.get("render_fps") or DEFAULT_FPS)
        else:
            self.drawer = _VisualizerDrawer(vec.env, vec.params, env_id)
            self.fps = 10  # gymnax's Visualizer: 100 ms a frame

    def episode(self, greedy: Any, params: Any, key: Any, max_steps: int | None) -> list[np.ndarray]:
        limit = int(self.vec.max_episode_steps) if max_steps is None else min(max_steps, self.vec.max_episode_steps)
        state, obs, carry = self._reset(key)
        policy_carry = greedy.start()
        states, returns, total = [state], [0.0], 0.0
        for _ in range(limit):
            state, obs, carry, policy_carry, reward, done = self._step(greedy, params, state, obs, carry, policy_carry)
            total += float(reward)
            states.append(state)
            returns.append(total)
            if bool(done):
                break
        host = jax.device_get(states)
        return [self.drawer.draw(s, t, r) for t, (s, r) in enumerate(zip(host, returns))]

    def close(self) -> None:
        self.drawer.close()


def _gymnax_steps(vec: Any) -> tuple[Any, Any]:
    """(reset(key) -> (state, obs, carry), step(greedy, params, state, obs, carry, policy_carry) -> (state, obs,
    carry, policy_carry, reward, done)), jitted, for one environment of a gymnax `VecEnv`: its keys (`carry`) split
    as `VecEnv` splits them, and `step_env` without the reset gymnax's `step` adds (the last state is drawn as
    reached)."""
    env, env_params = vec.env, vec.params

    def flat(obs: Any) -> Any:
        return jnp.reshape(obs, (1, -1)).astype(jnp.float32)

    def reset(key: Any) -> tuple:
        reset_key, carry = jax.random.split(key)  # as VecEnv.reset_each splits an environment's key
        obs, state = env.reset(reset_key, env_params)
        return state, flat(obs), carry

    def step(greedy: _Greedy, params: Any, state: Any, obs: Any, carry: Any, policy_carry: Any) -> tuple:
        step_key, carry = jax.random.split(carry)  # as VecEnv.step splits runner.key
        key_step, _ = jax.random.split(step_key)  # as gymnax's step splits its key for step_env
        policy_carry, action = greedy.act(params, policy_carry, obs)
        obs, state, reward, terminated, _ = env.step_env(key_step, state, action[0], env_params)
        done = jnp.logical_or(terminated, env.is_truncated(state, env_params))
        return state, flat(obs), carry, policy_carry, reward, done

    return jax.jit(reset), jax.jit(step, static_argnums=0)


class _ClassicControlDrawer:
    """gymnax's classic-control renderer (gymnax.visualize.vis_gym) with one Gymnasium environment for the
    whole video, not one a frame: its parameters and each state are set on it, and Gymnasium draws it."""

    def __init__(self, env: Any, env_params: Any, env_id: str):
        from gymnax.visualize import vis_gym

        self.vis_gym, self.env_id = vis_gym, env_id
        self.gym_env = _make_gymnasium(env_id, f"gymnax:{env_id}")
        self.gym_env.reset(seed=0)
        vis_gym.set_gym_params(self.gym_env.unwrapped, env_id, env_params)

    def draw(self, state: Any, step: int, episode_return: float) -> np.ndarray:
        unwrapped = self.gym_env.unwrapped
        unwrapped.state = self.vis_gym.get_gym_state(state, self.env_id)
        if self.env_id == "Pendulum-v1":
            unwrapped.last_u = np.asarray(state.last_u, dtype=np.float64)
        return _rgb(_gymnasium_render(self.gym_env, f"gymnax:{self.env_id}"))

    def close(self) -> None:
        self.gym_env.close()


class _VisualizerDrawer:
    """gymnax's `Visualizer`: its `init` draws the first state into a matplotlib figure, its `update` each
    next one; the title shows the step and the return so far; the canvas is read as RGB."""

    def __init__(self, env: Any, env_params: Any, env_id: str):
        self.env, self.env_params, self.env_id = env, env_params, env_id
        self.vis: Any = None

    def draw(self, state: Any, step: int, episode_return: float) -> np.ndarray:
        from gymnax.visualize.visualizer import Visualizer

        if self.vis is None:
            self.vis = Visualizer(self.env, self.env_params, [state])
            self.vis.init()
        self.vis.state_seq = [state]
        self.vis.update(0)
        self.vis.ax.set_title(f"{self.env_id}  step {step}  return {episode_return:.2f}", fontsize=13)
        canvas = self.vis.fig.canvas
        canvas.draw()
        return _rgb(np.asarray(canvas.buffer_rgba()))

    def close(self) -> None:
        if self.vis is not None:
            import matplotlib.pyplot as plt

            plt.close(self.vis.fig)


class _GymnasiumRenderer(_Renderer):
    """A Gymnasium environment made with `render_mode="rgb_array"`, stepped on the host: a `gymnasium:ID`
    environment itself, or the Gymnasium twin of an `envpool:ID` one (`_gymnasium_id`)."""

    def __init__(self, vec: Any, backend: str, env_id: str):
        self.vec, self.name = vec, vec.name
        atari = backend == "envpool" and _is_atari(env_id)
        self.env = _make_gymnasium(_gymnasium_id(backend, env_id), self.name, atari=atari)
        fps = self.env.metadata.get("render_fps") or DEFAULT_FPS
        self.fps = max(1, round(fps / ATARI_PREPROCESSING["frame_skip"])) if atari else int(fps)
        size = int(np.prod(self.env.observation_space.shape or (1,)))
        if size != vec.obs_size:
            self.env.close()
            raise FragcError(f"cannot render {self.name}: Gymnasium's {_gymnasium_id(backend, env_id)} gives "
                             f"observations of {size} values, the policy takes {vec.obs_size}")

    def episode(self, greedy: Any, params: Any, key: Any, max_steps: int | None) -> list[np.ndarray]:
        reset_key = jax.random.split(key)[0]  # as VecEnv.reset_each splits an environment's key
        obs, _ = self.env.reset(seed=seeds_of(np.asarray(jax.random.key_data(reset_key))[None])[0])
        frames = [_rgb(_gymnasium_render(self.env, self.name))]
        limit = max_steps or self.vec.max_episode_steps
        if not limit:
            raise FragcError(f"{self.name} sets no time limit (max_episode_steps): give the episodes' length "
                             "(max_steps, --max-steps)")
        steps, policy_carry = 0, greedy.start()
        while steps < limit:
            flat = np.asarray(obs).reshape(1, -1).astype(np.float32)
            policy_carry, action = greedy.act(params, policy_carry, flat)
            action = self._action(np.asarray(action)[0])
            obs, _, terminated, truncated, _ = self.env.step(action)
            frames.append(_rgb(_gymnasium_render(self.env, self.name)))
            steps += 1
            if terminated or truncated:
                break
        return frames

    def _action(self, action: np.ndarray) -> Any:
        space = self.env.action_space
        if isinstance(space, gymnasium.spaces.Discrete):
            return int(action) + int(space.start)
        return action.reshape(space.shape).astype(space.dtype)

    def close(self) -> None:
        self.env.close()


def _gymnasium_id(backend: str, env_id: str) -> str | None:
    """The Gymnasium id that renders `backend:env_id` (None: there is none)."""
    if backend in ("gymnasium", "gymnasium_async"):
        return env_id
    if backend != "envpool":
        return None
    if env_id in gymnasium.registry:
        return env_id
    return f"ALE/{env_id}" if _is_atari(env_id) else None


def _is_atari(env_id: str) -> bool:
    """EnvPool names its Atari games `Game-v5` (Gymnasium: `ALE/Game-v5`)."""
    return env_id.endswith("-v5") and env_id not in gymnasium.registry


def _make_gymnasium(gym_id: str, name: str, atari: bool = False) -> Any:
    """`gymnasium.make(gym_id, render_mode="rgb_array")`, refused in one line where it cannot render."""
    _quiet_pygame()
    try:
        if atari:
            import ale_py

            gymnasium.register_envs(ale_py)
            env = gymnasium.make(gym_id, render_mode="rgb_array", frameskip=1, repeat_action_probability=0.0)
            env = gymnasium.wrappers.FrameStackObservation(
                gymnasium.wrappers.AtariPreprocessing(env, **ATARI_PREPROCESSING), 4)
        else:
            env = gymnasium.make(gym_id, render_mode="rgb_array")
    except ImportError as err:
        raise FragcError(f"cannot render {name}: {_first_line(err)}"
                         + (" (Atari: pip install 'fragc[atari]')" if atari else "")) from err
    except gymnasium.error.Error as err:
        raise FragcError(f"cannot render {name}: Gymnasium cannot make '{gym_id}': {_first_line(err)}") from err
    modes = env.metadata.get("render_modes") or []
    if "rgb_array" not in modes:
        env.close()
        raise FragcError(f"cannot render {name}: its render modes are {modes or 'none'}, not rgb_array")
    return env


def _quiet_pygame() -> None:
    """No greeting from pygame, no sound device (SDL's ALSA driver prints errors on a machine without one), and
    no display where there is none (SDL's probing prints an error): rgb_array frames need neither."""
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def _gymnasium_render(env: Any, name: str) -> np.ndarray:
    try:
        frame = env.render()
    except gymnasium.error.DependencyNotInstalled as err:
        raise FragcError(f"cannot render {name}: {_first_line(err)}; {INSTALL}") from err
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        raise FragcError(f"cannot render {name}: its render() returned {type(frame).__name__}, not an RGB array")
    return frame


def _require_pygame(name: str) -> None:
    if importlib.util.find_spec("pygame") is None:
        raise FragcError(f"rendering {name} needs pygame (Gymnasium draws classic control with it): {INSTALL}")


def _rgb(frame: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(frame)[..., :3], dtype=np.uint8)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# ---------------------------------------------------------------- writing


def write_video(frames: list[np.ndarray], path: str | os.PathLike, fps: int) -> tuple[int, int]:
    """Write `frames` ((H, W, 3) uint8, all one size) to `path`: .mp4 (H.264, yuv420p) or .gif, at `fps`
    frames per second -> (width, height) written.

    An .mp4 needs even sides: a frame with an odd side gets its last row or column repeated. A .gif stores a
    run of identical frames as one frame shown as long (Pillow does), so it may hold fewer frames than given;
    its playing time is len(frames) / fps all the same (GIF times are in hundredths of a second)."""
    path = os.fspath(path)
    suffix = _suffix(path)
    _check_count("fps", fps)
    if not len(frames):
        raise FragcError(f"cannot write '{path}': no frames")
    shapes = {np.shape(f) for f in frames}
    if len(shapes) != 1 or len(next(iter(shapes))) != 3 or next(iter(shapes))[2] != 3:
        raise FragcError(f"cannot write '{path}': frames must all be (H, W, 3), got {sorted(shapes)[:3]}")
    try:
        import imageio.v3 as iio
    except ImportError as err:
        raise FragcError(f"writing videos needs imageio: {INSTALL}") from err
    stack = np.stack([np.asarray(f, np.uint8) for f in frames])
    folder = os.path.dirname(os.path.abspath(path))
    check_writable(folder, "the video")  # nothing made where it cannot be written
    existed = os.path.exists(path)
    try:
        os.makedirs(folder, exist_ok=True)
        if suffix == ".gif":  # encoded in memory: imageio's file plugin, failing to open, would fail again in __del__
            data = iio.imwrite("<bytes>", stack, extension=".gif", plugin="pillow", duration=1000 / fps, loop=0)
            with open(path, "wb") as f:
                f.write(data)
        else:
            stack = _even_sides(stack)
            _write_mp4(path, stack, fps)
    except OSError as err:
        if not existed and os.path.exists(path):  # a part written: nothing left behind
            os.remove(path)
        raise FragcError(f"cannot write '{path}': {err.strerror or _first_line(err)}") from err
    return int(stack.shape[2]), int(stack.shape[1])


def _suffix(path: str) -> str:
    """.mp4 or .gif (refused in one line otherwise)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise FragcError(f"cannot write '{path}': videos are {' or '.join(SUFFIXES)}, not "
                         f"{repr(suffix) if suffix else 'a name without a suffix'}")
    return suffix


def _write_mp4(path: str, stack: np.ndarray, fps: int) -> None:
    try:
        import imageio_ffmpeg  # noqa: F401 - imageio's ffmpeg plugin finds its ffmpeg through it
        import imageio.v2 as imageio
    except ImportError as err:
        raise FragcError(f"writing .mp4 needs imageio-ffmpeg: {INSTALL}") from err
    with warnings.catch_warnings():  # JAX warns of any fork; ffmpeg's subprocess execs at once
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called")
        _append_all(imageio, path, stack, fps)


def _append_all(imageio: Any, path: str, stack: np.ndarray, fps: int) -> None:
    writer = imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", pixelformat="yuv420p",
                                macro_block_size=1, output_params=["-loglevel", "error"])
    try:
        for frame in stack:
            writer.append_data(frame)
    finally:
        writer.close()


def _even_sides(stack: np.ndarray) -> np.ndarray:
    pad = ((0, 0), (0, stack.shape[1] % 2), (0, stack.shape[2] % 2), (0, 0))
    return np.pad(stack, pad, mode="edge") if any(p[1] for p in pad) else stack


# ---------------------------------------------------------------- from a checkpoint


def restore_policy(checkpoint_dir: str | os.PathLike, member: int = 0) -> tuple[Any, Any, dict]:
    """(algorithm, the deterministic policy's parameters, the checkpoint's metadata) of the latest good
    checkpoint in `checkpoint_dir`; a population's member `member`.

    No program is compiled: the algorithm is rebuilt from the metadata (`fragc.algos.make(spec, **config)`),
    the state's type is `jax.eval_shape(algo.init, key)` (with a leading member axis for a population), and
    `Checkpointer.restore_latest` reads it (falling back past a damaged checkpoint with a warning, as
    `--resume` does)."""
    directory = os.fspath(checkpoint_dir)
    if not os.path.isdir(directory):
        raise FragcError(f"no checkpoint folder '{directory}'")
    with Checkpointer(directory) as checkpoints:
        if not checkpoints.steps():
            raise FragcError(f"no checkpoint in '{directory}' (fragc run ... --checkpoint-dir writes them)")
        meta, raw = _newest_readable(checkpoints)
        algo = algo_of(meta, directory)
        _greedy(algo)
        grid = meta.get("grid") or {}  # a sweep's (fragc sweep): SweepState(state, hyper, lineage) per member
        like = jax.eval_shape(swept(algo, list(grid)).init if grid else algo.init, jax.random.key(0))
        members = _members(like, raw["state"], meta, directory)
        if members is None:
            if member:
                raise FragcError(f"--member {member}: the checkpoint in '{directory}' is of one run, not a "
                                 "population")
        elif not 0 <= member < members:
            raise FragcError(f"--member {member}: the population in '{directory}' has members 0 to {members - 1}")
        like_state = _concrete_keys(like, members)
        like_delays = {int(k): [jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype) for x in v]
                       for k, v in raw.get("delays", {}).items()}
        state, _, meta = checkpoints.restore_latest(like_state, like_delays)
    if members is not None:
        state = jax.tree.map(lambda x: x[member], state)
    if grid:
        state = state.state
    return algo, algo.policy_params(state), meta


def _newest_readable(checkpoints: Any) -> tuple[dict, dict]:
    """(metadata, arrays as stored: nested dicts and lists) of the newest checkpoint orbax reads back: what
    the algorithm and the state's shape come from (`restore_latest` checks the digests afterwards)."""
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(checkpoints.directory, options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        for step in reversed(checkpoints.steps()):
            try:
                got = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore(),
                                                                    arrays=ocp.args.StandardRestore()))
            except Exception:  # noqa: BLE001 - a damaged one: restore_latest warns about it
                continue
            if isinstance(got["meta"], dict) and isinstance(got["arrays"], dict) and "state" in got["arrays"]:
                return got["meta"], got["arrays"]
    finally:
        manager.close()
    raise FragcError(f"every checkpoint in '{checkpoints.directory}' is damaged")


def algo_of(meta: dict, directory: str) -> Any:
    """The algorithm a checkpoint's metadata names (`algo`: the CLI's spec, or `module.Class`), with its config."""
    spec = meta.get("algo")
    if not isinstance(spec, str) or not spec:
        raise FragcError(f"the checkpoints in '{directory}' do not name their algorithm")
    if spec not in algos.ALGOS and ":" not in spec and "." in spec:  # algo_meta's module.Class
        module, _, cls = spec.rpartition(".")
        spec = f"{module}:{cls}"
    config = meta.get("config") or {}
    return algos.make(spec, **{k: _tuples(v) for k, v in config.items()})


def _tuples(value: Any) -> Any:
    """JSON's lists back as the tuples a frozen config holds."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _members(like: Any, stored: dict, meta: dict, directory: str) -> int | None:
    """The population's size, if the stored state has a leading member axis; None for one run."""
    ours = [_stored_shape(x) for x in jax.tree.leaves(like)]
    theirs = [np.shape(x) for x in jax.tree.leaves(stored)]
    if len(ours) != len(theirs):
        raise FragcError(f"the checkpoint in '{directory}' does not hold a state of {meta.get('algo')} with the "
                         f"config saved with it ({len(theirs)} arrays, {len(ours)} expected)")
    if sorted(ours) == sorted(theirs):
        return None
    sizes = {t[0] for t in theirs if len(t)}
    if len(sizes) == 1 and sorted(ours) == sorted(t[1:] for t in theirs):
        return sizes.pop()
    raise FragcError(f"the checkpoint in '{directory}' does not hold a state of {meta.get('algo')} with the "
                     "config saved with it (its arrays' shapes differ)")


def _stored_shape(x: Any) -> tuple:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return tuple(jax.eval_shape(jax.random.key_data, x).shape)
    return tuple(x.shape)


def _concrete_keys(like: Any, members: int | None) -> Any:
    """`like` (ShapeDtypeStructs) with a member axis for a population, and its PRNG keys as concrete keys of
    that shape: `restore_latest` rebuilds keys after the impl of the ones it is given."""
    lead = (members,) if members else ()

    def leaf(x: Any) -> Any:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = jax.eval_shape(jax.random.key_data, x)
            return jax.random.wrap_key_data(np.zeros(lead + data.shape, data.dtype))
        return jax.ShapeDtypeStruct(lead + tuple(x.shape), x.dtype)

    return jax.tree.map(leaf, like)


def video_from_checkpoint(checkpoint_dir: str | os.PathLike, out: str | os.PathLike, episodes: int = 2,
                          member: int = 0, seed: int = 0, fps: int | None = None,
                          max_steps: int | None = None) -> tuple[str, int, tuple[int, int]]:
    """Render `episodes` greedy episodes of the latest good checkpoint's policy to `out` (.mp4 or .gif)
    -> (path, frames, (width, height)). fps: default the environment's own rate (`EpisodeRenderer.fps`)."""
    path = os.fspath(out)
    _suffix(path)  # before restoring anything
    check_writable(os.path.dirname(os.path.abspath(path)), "the video")
    algo, params, _ = restore_policy(checkpoint_dir, member)
    with EpisodeRenderer(algo) as renderer:
        frames = renderer.render(params, episodes, seed, max_steps)
        fps = fps or renderer.fps
    return path, len(frames), write_video(frames, path, fps)


# ---------------------------------------------------------------- during training


class CaptureVideo(Action):
    """Every `every` iterations (and at the run's end), `episodes` greedy episodes of the policy being
    trained, written to `directory/videos/iteration_NNNNNNN.mp4` (CleanRL's --capture-video). A population
    records member `member`. Only the lead process writes. Every video starts from the same states (`seed`),
    so they show the policy's progress."""

    def __init__(self, every: int, directory: str | os.PathLike, episodes: int = 1, *, seed: int = 0,
                 member: int = 0, fps: int | None = None, max_steps: int | None = None, suffix: str = ".mp4"):
        _check_count("CaptureVideo: every", every)
        _check_count("CaptureVideo: episodes", episodes)
        if suffix not in SUFFIXES:
            raise FragcError(f"CaptureVideo: suffix must be one of {', '.join(SUFFIXES)}, got {suffix!r}")
        self.every, self.episodes, self.seed, self.member = int(every), int(episodes), seed, member
        self.folder = os.path.join(os.fspath(directory), "videos")
        self.fps, self.max_steps, self.suffix = fps, max_steps, suffix
        self.written: list[str] = []
        self.sinks: list[Any] = []
        """Tracking sinks each video goes to as well (`fragc.train` adds its own: TensorBoard, W&B, MLflow)."""

    def on_start(self, run: Run) -> None:
        self.algo = run.program.algo
        self.lead = run.lead
        self.population = run.program.population
        self.renderer = EpisodeRenderer(self.algo) if self.lead else None
        if self.population and not 0 <= self.member < len(self.population):
            raise FragcError(f"CaptureVideo: member {self.member}, but the population has {len(self.population)}")

    def on_state(self, iteration: int, state: Any, delays: dict) -> None:
        if not self.lead:
            return
        if self.population:
            state = jax.tree.map(lambda x: x[self.member], state)
        frames = self.renderer.render(self.algo.policy_params(state), self.episodes, self.seed, self.max_steps)
        path = os.path.join(self.folder, f"iteration_{iteration:07d}{self.suffix}")
        fps = self.fps or self.renderer.fps
        write_video(frames, path, fps)
        self.written.append(path)
        for sink in self.sinks:
            sink.on_video(iteration, path, frames, fps)

    def on_end(self, run: Run) -> None:
        if getattr(self, "renderer", None) is not None:
            self.renderer.close()
