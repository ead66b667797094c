"""A tiny pixel environment for the CNN tests: EnvPool's layout (stacked frames first, uint8) at the Nature CNN's
smallest size, stepped on the device as a gymnax environment.

`TinyPixels`: a bright square on a dark 36x36 field, two frames (the last two positions), three actions
(left, stay, right); the reward is 1 on the right half, and an episode lasts `max_steps_in_episode` steps
(truncated) unless the square leaves the field on the left (terminated).
"""

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces

from fragc.algos.envs import GymnaxVecEnv

SIZE = 36
FRAMES = 2


@struct.dataclass
class State(environment.EnvState):
    x: jax.Array
    y: jax.Array
    last_x: jax.Array


@struct.dataclass
class Params(environment.EnvParams):
    max_steps_in_episode: int = 6


class TinyPixels(environment.Environment):
    @property
    def default_params(self) -> Params:
        return Params()

    def frame(self, x, y):
        rows = (jnp.arange(SIZE) >= y) & (jnp.arange(SIZE) < y + 4)
        cols = (jnp.arange(SIZE) >= x) & (jnp.arange(SIZE) < x + 4)
        return jnp.where(rows[:, None] & cols[None, :], 255, 17).astype(jnp.uint8)

    def get_obs(self, state, params=None, key=None):
        return jnp.stack([self.frame(state.last_x, state.y), self.frame(state.x, state.y)])

    def reset_env(self, key, params):
        x, y = jax.random.randint(key, (2,), 4, SIZE - 8)
        state = State(time=0, x=x, y=y, last_x=x)
        return self.get_obs(state), state

    def step_env(self, key, state, action, params):
        x = state.x + 3 * (action - 1)
        state = State(time=state.time + 1, x=x, y=state.y, last_x=state.x)
        reward = (x >= SIZE // 2).astype(jnp.float32)
        return self.get_obs(state), state, reward, x < 0, {}

    def is_truncated(self, state, params):
        return state.time >= params.max_steps_in_episode

    def observation_space(self, params):
        return spaces.Box(0, 255, (FRAMES, SIZE, SIZE), jnp.uint8)

    def action_space(self, params):
        return spaces.Discrete(3)


class TinyPixelsVecEnv(GymnaxVecEnv):
    def __init__(self, name: str = "tiny_pixels"):
        self.name = name
        self.env = TinyPixels()
        self.params = self.env.default_params


def on_tiny_pixels(algo):
    """`algo` stepping `TinyPixels` instead of its configured environment."""
    algo.env = TinyPixelsVecEnv("tiny_pixels")
    return algo
