"""Networks for pixel observations: the Nature-DQN CNN and the IMPALA ResNet, as the references build them.

- `NatureCNN` is Mnih et al. (2015)'s torso as CleanRL's `ppo_atari_envpool.py` has it (orthogonal initialisation,
  gain sqrt(2), zero biases); `ImpalaCNN` is Espeholt et al. (2018)'s 15-layer ResNet as CleanRL's
  `*_impalanet_*.py` has it (its convolutions keep Flax's default initialisation, as CleanRL's do).

Frames arrive as the environment gives them: EnvPool's Atari frames are uint8 with the stacked frames first
(`(4, 84, 84)`), gymnax's MinAtar frames are 0/1 floats with channels last (`(10, 10, C)`). `layout` says
which; uint8 frames are scaled to [0, 1] inside the network (as CleanRL does), so the trajectory's frames
stay uint8 until the learner uses them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fragc.algos.validation import NETWORK_CHOICES
from fragc.ir.errors import FragcError

NATURE_MIN_SIZE = 36
"""The Nature CNN's smallest frame side: 8x8 stride 4, 4x4 stride 2 and 3x3, all VALID, leave 1x1 of 36x36."""


def network_for(name: str, obs_shape: Sequence[int]) -> str:
    """The network `name` means for observations of `obs_shape`, or one line saying why it cannot take them.

    `auto` picks from the observation's rank: frames (rank 3) get the Nature CNN when they are at least 36x36
    (Atari's 84x84), the IMPALA CNN when smaller (MinAtar's 10x10: its padded convolutions take any size);
    vectors get the MLP."""
    if name not in NETWORK_CHOICES:
        raise FragcError(f"network must be one of {', '.join(NETWORK_CHOICES)}, got {name!r}")
    if name == "auto":
        if len(obs_shape) != 3:
            return "mlp"
        return "nature_cnn" if min(frame_size(obs_shape)) >= NATURE_MIN_SIZE else "impala_cnn"
    if name != "mlp" and len(obs_shape) != 3:
        raise FragcError(f"network {name} needs frames (height, width, channels) as observations; "
                         f"this environment's are {tuple(obs_shape)}")
    if name == "nature_cnn" and min(frame_size(obs_shape)) < NATURE_MIN_SIZE:
        height, width = frame_size(obs_shape)
        raise FragcError(f"network nature_cnn needs frames of at least {NATURE_MIN_SIZE}x{NATURE_MIN_SIZE}; this "
                         f"environment's are {height}x{width} {tuple(obs_shape)} (use impala_cnn)")
    return name


def frames_layout(obs_shape: Sequence[int]) -> str:
    """`chw` when the smallest axis comes first (EnvPool's stacked frames), else `hwc`."""
    return "chw" if obs_shape[0] < obs_shape[-1] else "hwc"


def frame_size(obs_shape: Sequence[int]) -> tuple[int, int]:
    """(height, width) of frames of `obs_shape`, whichever their layout."""
    height, width = obs_shape[1:] if frames_layout(obs_shape) == "chw" else obs_shape[:2]
    return int(height), int(width)


def as_hwc_floats(x: jax.Array, layout: str) -> jax.Array:
    if layout == "chw":
        x = jnp.moveaxis(x, -3, -1)
    return x.astype(jnp.float32) / 255.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class Observations:
    """How an algorithm keeps its observations: the environment's flattened float32 vectors (the MLP's, as
    they always were), or frames of the environment's own shape and dtype (a CNN's).

    The environments give every observation flattened to float32 (`VecEnv.obs_size`); `frames(obs)` makes
    them frames again, `(..., obs_size) -> (..., *shape)` in `dtype`, and passes frames as they are (a
    flattened batch cannot end in `shape` unless the frames are 1x1, where both are the same). The cast is
    exact, a uint8 value being a float32 integer, so Atari's frames are uint8 again in the rollout's
    trajectory and the replay buffer, and the network scales them (`as_hwc_floats`)."""

    shape: tuple[int, ...]
    dtype: Any = jnp.float32

    @classmethod
    def of(cls, network: str, env: Any) -> "Observations":
        """The format `network` (a name `network_for` returned) takes from `env` (a `VecEnv`)."""
        if network == "mlp":
            return cls((env.obs_size,))
        return cls(tuple(env.obs_shape), env.obs_dtype)

    def frames(self, obs: jax.Array) -> jax.Array:
        """`obs` as the network takes it, any leading shape; frames already are (a trajectory's) pass."""
        if len(self.shape) == 1:
            return obs  # the MLP's vectors, untouched
        if obs.shape[-len(self.shape):] != self.shape:  # flattened: (..., obs_size)
            obs = obs.reshape(obs.shape[:-1] + self.shape)
        return obs.astype(self.dtype)

    def zeros(self, *lead: int) -> jax.Array:
        """A batch of zero observations `(*lead, *shape)`: what a network is initialised with."""
        return jnp.zeros(lead + self.shape, self.dtype)

    def struct(self, *lead: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(lead + self.shape, self.dtype)


KERNEL_INITS = {
    "orthogonal": nn.initializers.orthogonal(np.sqrt(2)),  # CleanRL's ppo_atari_envpool.py
    "lecun_normal": nn.initializers.lecun_normal(),  # Flax's default: CleanRL's dqn_atari_jax.py
    "he_normal": nn.initializers.he_normal(),  # purejaxql's pqn_atari.py
}
"""The Nature CNN's kernel initialisations, as each reference has them (biases start at zero in all three)."""


class NatureCNN(nn.Module):
    """The Nature-DQN torso: frames -> 512 features.

    `kernel_init` names the reference's initialisation (`KERNEL_INITS`); `layer_norm` puts a LayerNorm after
    every layer, before its ReLU, as purejaxql's pqn_atari.py does."""

    layout: str = "chw"
    kernel_init: str = "orthogonal"
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = as_hwc_floats(x, self.layout)
        init = dict(kernel_init=KERNEL_INITS[self.kernel_init], bias_init=nn.initializers.zeros)
        activate = lambda x: nn.relu(nn.LayerNorm()(x) if self.layer_norm else x)  # noqa: E731
        for features, size, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = activate(nn.Conv(features, (size, size), strides=(stride, stride), padding="VALID", **init)(x))
        x = x.reshape(x.shape[:-3] + (-1,))
        return activate(nn.Dense(512, **init)(x))


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
        return nn.relu(dense(256, np.sqrt(2))(x))


def torso(name: str, obs_shape: Sequence[int], kernel_init: str = "orthogonal", layer_norm: bool = False) -> nn.Module:
    """The torso `name` for frames of `obs_shape`; `kernel_init` and `layer_norm` choose the Nature CNN's
    reference (`NatureCNN`), the IMPALA CNN has one."""
    if name == "nature_cnn":
        return NatureCNN(frames_layout(obs_shape), kernel_init, layer_norm)
    return ImpalaCNN(frames_layout(obs_shape))


class PixelActorCritic(nn.Module):
    """CleanRL's Atari actor-critic (`ppo_atari_envpool.py`, `ppo_atari_envpool_xla_jax_scan.py`): one torso
    shared by a linear policy head (orthogonal, gain 0.01) and a linear value head (orthogonal, gain 1), zero
    biases. `value` runs the torso and the value head alone."""

    torso: nn.Module
    num_actions: int

    def setup(self) -> None:
        self.actor = dense(self.num_actions, 0.01)
        self.critic = dense(1, 1.0)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        hidden = self.torso(obs)
        return self.actor(hidden), jnp.squeeze(self.critic(hidden), -1)

    def value(self, obs: jax.Array) -> jax.Array:
        return jnp.squeeze(self.critic(self.torso(obs)), -1)


class PixelQNetwork(nn.Module):
    """A torso and a linear head of one Q value per action (Flax's default initialisation, as CleanRL's
    dqn_atari_jax.py and purejaxql's pqn_atari.py have it)."""

    torso: nn.Module
    num_actions: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return nn.Dense(self.num_actions)(self.torso(obs))


@dataclasses.dataclass(frozen=True)
class ChosenNetwork:
    """The network a `network` config field names for an environment's observations (`auto` resolved), and how
    the observations are kept for it."""

    name: str
    observations: Observations

    @classmethod
    def of(cls, network: str, env: Any) -> "ChosenNetwork":
        name = network_for(network, env.obs_shape)
        return cls(name, Observations.of(name, env))

    @property
    def unroll(self) -> bool:
        """Whether the learner's loops (epochs, minibatches, gradient steps) are unrolled: for a CNN on XLA's CPU,
        where a convolution's gradient inside a loop body runs about 15x slower than unrolled (jax-ml/jax#12868;
        measured here: four Nature-CNN gradient steps of 256 frames, 36.4 s in a `lax.scan`, 2.2 s unrolled). The
        numbers are the same; the MLP's loops stay loops (its programs unchanged)."""
        return self.name != "mlp" and jax.default_backend() == "cpu"


# ---------------------------------------------------------------- the actor-critics' MLPs

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


def dense(n: int, scale: float, name: str | None = None) -> nn.Dense:
    return nn.Dense(n, kernel_init=nn.initializers.orthogonal(scale), bias_init=nn.initializers.zeros, name=name)


class MLP(nn.Module):
    """Two hidden layers and a linear head, orthogonal init."""

    hidden: int
    out: int
    out_scale: float
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        x = act(dense(self.hidden, np.sqrt(2))(x))
        x = act(dense(self.hidden, np.sqrt(2))(x))
        return dense(self.out, self.out_scale)(x)


class ActorCritic(nn.Module):
    """Separate MLPs for the policy logits and the value (PureJaxRL's).

    `value` runs the critic alone: the rollout bootstraps from V(s_{t+1}) with one batched critic pass over the
    whole trajectory instead of a second actor-and-critic pass per step."""

    num_actions: int
    hidden: int = 64
    activation: str = "tanh"

    def setup(self) -> None:
        self.actor = MLP(self.hidden, self.num_actions, 0.01, self.activation)
        self.critic = MLP(self.hidden, 1, 1.0, self.activation)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        return self.actor(obs), self.value(obs)

    def value(self, obs: jax.Array) -> jax.Array:
        return jnp.squeeze(self.critic(obs), -1)


class GaussianActorCritic(nn.Module):
    """MLPs for the action mean and the value; log std is a free parameter per action dimension."""

    action_dim: int
    hidden: int = 64
    activation: str = "tanh"

    def setup(self) -> None:
        self.actor = MLP(self.hidden, self.action_dim, 0.01, self.activation)
        self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        self.critic = MLP(self.hidden, 1, 1.0, self.activation)

    def __call__(self, obs: jax.Array) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        mean = self.actor(obs)
        return (mean, jnp.broadcast_to(self.log_std, mean.shape)), self.value(obs)

    def value(self, obs: jax.Array) -> jax.Array:
        return jnp.squeeze(self.critic(obs), -1)


# ---------------------------------------------------------------- the Q-learners' network (DQN, PQN)


class QNetwork(nn.Module):
    """Dense relu layers of `widths` (each LayerNormed before its relu with `layer_norm`) and a linear head of one
    Q value per action: DQN's (PureJaxRL's 120, 84) and PQN's (purejaxql's, LayerNorm)."""

    num_actions: int
    widths: tuple[int, ...]
    layer_norm: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs
        for width in self.widths:
            x = nn.Dense(width)(x)
            x = nn.relu(nn.LayerNorm()(x) if self.layer_norm else x)
        return nn.Dense(self.num_actions)(x)


@dataclasses.dataclass(frozen=True)
class QModel:
    """A Q network on observations as the environment gives them or as frames, and the actions it takes."""

    network: nn.Module
    chosen: ChosenNetwork

    @classmethod
    def of(cls, network: str, env: Any, widths: tuple[int, ...], kernel_init: str, layer_norm: bool) -> "QModel":
        """The network `network` names for `env`: `QNetwork(widths)` on vectors, a CNN torso (`kernel_init`,
        `layer_norm`: its reference's) with a linear Q head on frames."""
        chosen = ChosenNetwork.of(network, env)
        if chosen.name == "mlp":
            return cls(QNetwork(env.action_space.n, widths, layer_norm), chosen)
        features = torso(chosen.name, env.obs_shape, kernel_init=kernel_init, layer_norm=layer_norm)
        return cls(PixelQNetwork(features, env.action_space.n), chosen)

    def init(self, key: jax.Array) -> Any:
        return self.network.init(key, self.chosen.observations.zeros(1))

    def q_values(self, params: Any, obs: jax.Array) -> jax.Array:
        """Q(obs, a) for every action [n, actions]."""
        return self.network.apply(params, self.chosen.observations.frames(obs))

    def greedy(self, params: Any, obs: jax.Array) -> jax.Array:
        """argmax Q for each of `obs[n, ...]`."""
        return jnp.argmax(self.q_values(params, obs), -1)

    def epsilon_greedy(self, params: Any, obs: jax.Array, eps: jax.Array, keys: jax.Array) -> jax.Array:
        """For each observation, with probability `eps` a uniform random action, else the greedy one; `keys`
        [n, 2]: each environment's keys to explore and to draw its random action."""
        explore = jax.vmap(lambda k: jax.random.uniform(k) < eps)(keys[:, 0])
        random_action = jax.vmap(lambda k: jax.random.randint(k, (), 0, self.network.num_actions))(keys[:, 1])
        return jnp.where(explore, random_action, self.greedy(params, obs))


def q_of(q_values: jax.Array, action: jax.Array) -> jax.Array:
    """Q(s, a) of the actions taken, from every action's [n, actions]."""
    return jnp.take_along_axis(q_values, action[:, None], -1)[:, 0]
