"""MAPPO (Yu et al. 2022) on JaxMARL's environments: IPPO (src/fragc/algos/ippo.py) with a centralised critic.

Each agent's actor reads its own observation; the critic reads the world state (SMAX's `get_world_state`, MPE's
observations side by side, as JaxMARL's MAPPO wrappers make it). Defaults are IPPO's (`Config`); `preset="auto"`
sets JaxMARL's SMAX values.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from fragc.algos import ippo


@dataclasses.dataclass(frozen=True)
class Config(ippo.Config):
    """IPPO's fields and defaults (JaxMARL's feed-forward IPPO on MPE; SMAX's by `preset`). JaxMARL's MAPPO MPE
    values (mappo_homogenous_rnn_mpe.yaml: lr 2e-3, 128 envs, 128 units) are its recurrent network's; with this
    feed-forward one they did not learn in 1e6 steps (docs/results.md), these did."""

    centralised_critic: ClassVar[bool] = True


class MAPPO(ippo.IPPO):
    """Multi-agent PPO: IPPO with this file's config, whose critic sees the world state."""

    Config = Config
