"""Networks for pixel observations: the Nature-DQN CNN and the IMPALA ResNet, as the references build them.

- `NatureCNN` is Mnih et al. (2015)'s torso as CleanRL's `ppo_atari_envpool.py` has it: three convolutions
  (32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1, VALID padding), then a dense 512, ReLU throughout,
  orthogonal initialisation with gain sqrt(2) and zero biases.
- `ImpalaCNN` is Espeholt et al. (2018)'s 15-layer ResNet as CleanRL's `*_impalanet_*.py` has it: three
  stacks (16, 32, 32 channels) of a 3x3 convolution, a 3x3 max pool with stride 2 (SAME), and two residual
  blocks of two 3x3 convolutions each (15 convolutions in all), then ReLU and a dense 256 (orthogonal,
  gain sqrt(2)); the convolutions keep Flax's default initialisation, as CleanRL's do.

Frames arrive as the environment gives them: EnvPool's Atari frames are uint8 with the stacked frames first
(`(4, 84, 84)`), gymnax's MinAtar frames are 0/1 floats with channels last (`(10, 10, C)`). `layout` says
which; uint8 frames are scaled to [0, 1] inside the network (as CleanRL does), so the trajectory's frames
stay uint8 until the learner uses them.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fragc.ir.errors import FragcError

NETWORKS = ("mlp", "nature_cnn", "impala_cnn")
"""The names `--network` takes."""


def network_for(name: str, obs_shape: Sequence[int]) -> str:
    """`auto` picks from the observation's rank: frames (rank 3) get the Nature CNN, vectors the MLP."""
    if name == "auto":
        return "nature_cnn" if len(obs_shape) == 3 else "mlp"
    if name not in NETWORKS:
        raise FragcError(f"network must be auto or one of {', '.join(NETWORKS)}, got {name!r}")
    if name != "mlp" and len(obs_shape) != 3:
        raise FragcError(f"network {name} needs frames (height, width, channels) as observations; "
                         f"this environment's are {tuple(obs_shape)}")
    return name


def frames_layout(obs_shape: Sequence[int]) -> str:
    """`chw` when the smallest axis comes first (EnvPool's stacked frames), else `hwc`."""
    return "chw" if obs_shape[0] < obs_shape[-1] else "hwc"


def as_hwc_floats(x: jax.Array, layout: str) -> jax.Array:
    if layout == "chw":
        x = jnp.moveaxis(x, -3, -1)
    return x.astype(jnp.float32) / 255.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)


def _orthogonal_dense(n: int) -> nn.Dense:
    return nn.Dense(n, kernel_init=nn.initializers.orthogonal(np.sqrt(2)), bias_init=nn.initializers.zeros)


class NatureCNN(nn.Module):
    """The Nature-DQN torso: frames -> 512 features."""

    layout: str = "chw"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = as_hwc_floats(x, self.layout)
        init = dict(kernel_init=nn.initializers.orthogonal(np.sqrt(2)), bias_init=nn.initializers.zeros,
                    padding="VALID")
        x = nn.relu(nn.Conv(32, (8, 8), strides=(4, 4), **init)(x))
        x = nn.relu(nn.Conv(64, (4, 4), strides=(2, 2), **init)(x))
        x = nn.relu(nn.Conv(64, (3, 3), strides=(1, 1), **init)(x))
        x = x.reshape(x.shape[:-3] + (-1,))
        return nn.relu(_orthogonal_dense(512)(x))


class ResidualBlock(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        y = nn.Conv(self.channels, (3, 3))(nn.relu(x))
        y = nn.Conv(self.channels, (3, 3))(nn.relu(y))
        return x + y


class ConvSequence(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Conv(self.channels, (3, 3))(x)
        x = nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding="SAME")
        return ResidualBlock(self.channels)(ResidualBlock(self.channels)(x))


class ImpalaCNN(nn.Module):
    """The IMPALA ResNet torso: frames -> 256 features."""

    layout: str = "chw"
    channels: Sequence[int] = (16, 32, 32)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = as_hwc_floats(x, self.layout)
        for channels in self.channels:
            x = ConvSequence(channels)(x)
        x = nn.relu(x).reshape(x.shape[:-3] + (-1,))
        return nn.relu(_orthogonal_dense(256)(x))


TORSOS = {"nature_cnn": NatureCNN, "impala_cnn": ImpalaCNN}
