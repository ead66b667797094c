"""MAPPO (Yu et al. 2022) on JaxMARL's environments: IPPO (algos/ippo.py) with a centralised critic.

Each agent's actor reads its own observation; the critic reads the world state (SMAX's `get_world_state`, MPE's
observations side by side, as JaxMARL's MAPPO wrappers make it). Defaults are JaxMARL's MAPPO on MPE
(baselines/MAPPO/config/mappo_homogenous_rnn_mpe.yaml, feed-forward here); `preset="auto"` sets its SMAX values.
"""

from __future__ import annotations

import dataclasses

from fragc.algos import ippo


@dataclasses.dataclass(frozen=True)
class Config(ippo.Config):
    lr: float = 2e-3
    """Adam learning rate (at the start, when annealed)."""
    num_envs: int = 128
    """Environments stepped in parallel (each with every agent)."""
    total_steps: int = 2_000_000
    """Environment steps over the whole run (JaxMARL's TOTAL_TIMESTEPS)."""
    hidden: int = 128
    """Width of the two hidden layers of the actor and of the critic (JaxMARL's FC_DIM_SIZE)."""


class MAPPO(ippo.IPPO):
    """Multi-agent PPO: IPPO whose critic sees the world state."""

    Config = Config
    centralised = True

    def __init__(self, config: Config = Config()):
        super().__init__(config)
