"""PPO for continuous actions: ppo.py's algorithm with a Gaussian policy (actor_critic.py's `Gaussian`: a
state-independent log standard deviation) and these defaults, Pendulum-v1's.

Everything but the action distribution is PPO's: the same rollout and learn fragments, GAE and clipped objective.
Sampled actions are stored unclipped (their log-probabilities are exact) and clipped to the action space's bounds
only for the environment.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from fragc.algos import ppo
from fragc.ir.errors import FragcError


@dataclasses.dataclass(frozen=True)
class Config(ppo.Config):
    actions: ClassVar[str] = "continuous"
    env: str = "Pendulum-v1"
    """Environment: a gymnax id, or BACKEND:ID for a host backend (fragc envs); continuous (Box) actions."""
    num_envs: int = 16
    num_steps: int = 128
    total_steps: int = 1_000_000
    lr: float = 1e-3
    update_epochs: int = 10
    num_minibatches: int = 32
    gamma: float = 0.95
    """Discount factor (Pendulum's reward is dense; a shorter horizon learns faster)."""
    ent_coef: float = 0.0
    clip_value: bool = False
    """Clip each value update to `clip_eps` around the rollout's values; off by default here: Pendulum's returns
    are in the hundreds, and a critic held within 0.2 of its rollout values per update lags its targets
    (docs/results.md)."""
    network: str = "mlp"
    """mlp (or auto, the same): no pixel network for continuous actions yet."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.network not in ("auto", "mlp"):
            raise FragcError(f"ppo_continuous: network must be auto or mlp (no pixel network for continuous "
                             f"actions), got {self.network!r}")


class PPOContinuous(ppo.PPO):
    """PPO with a diagonal Gaussian policy, for Box action spaces: PPO with this file's config."""

    Config = Config
