"""Recurrent MAPPO on JaxMARL's environments: recurrent IPPO (ippo_rnn.py) whose critic reads the world state with
a GRU of its own, as JaxMARL's `mappo_rnn_mpe.py` and `mappo_rnn_smax.py` have it.

Defaults are JaxMARL's mappo_homogenous_rnn_mpe.yaml; `preset="auto"` sets mappo_homogenous_rnn_smax.yaml's on SMAX.
JaxMARL's MAPPO keeps the actor's and the critic's parameters in two optimizers, each clipping its own gradient
norm; here they are one network whose optimizer clips the actor's and the critic's gradients apart (`optimizer`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from fragc.algos import ippo_rnn

SMAX = {"lr": 0.002, "num_envs": 128, "ent_coef": 0.0, "max_grad_norm": 0.25}
"""JaxMARL's mappo_homogenous_rnn_smax.yaml, where it differs from mappo_homogenous_rnn_mpe.yaml."""


@dataclasses.dataclass(frozen=True)
class Config(ippo_rnn.Config):
    """Recurrent IPPO's fields at JaxMARL's mappo_homogenous_rnn_mpe.yaml values."""

    centralised_critic: ClassVar[bool] = True
    lr: float = 2e-3
    vf_coef: float = 0.5
    num_minibatches: int = 4
    clip_eps: float = 0.2
    smax: ClassVar[dict[str, Any]] = SMAX


class MAPPORNN(ippo_rnn.IPPORNN):
    """Recurrent multi-agent PPO: recurrent IPPO with this file's config, a centralised recurrent critic."""

    Config = Config
