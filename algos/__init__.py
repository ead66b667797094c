"""fragc.algos: RL algorithms written against fragc's public API, one file each."""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from fragc.ir.errors import FragcError

ALGOS = {
    "ppo": ("fragc.algos.ppo", "PPO", "Config", "PPO, discrete actions (PureJaxRL's CartPole configuration)"),
    "a2c": ("fragc.algos.a2c", "A2C", "Config", "synchronous advantage actor-critic, discrete actions"),
    "ppo_continuous": ("fragc.algos.ppo_continuous", "PPOContinuous", "Config",
                       "PPO with a Gaussian policy for continuous actions (Pendulum-v1)"),
    "dqn": ("fragc.algos.dqn", "DQN", "Config", "DQN with a target network and an on-device replay-buffer fragment"),
    "impala": ("fragc.algos.impala", "IMPALA", "Config", "actor-critic with V-trace off-policy correction"),
}


def load(name: str) -> tuple[type, type]:
    """(algorithm class, config class) for a registered algorithm name."""
    if name not in ALGOS:
        close = difflib.get_close_matches(name, ALGOS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise FragcError(f"unknown algorithm '{name}'{hint}; known: {', '.join(ALGOS)}")
    module_name, algo_cls, config_cls, _ = ALGOS[name]
    module = importlib.import_module(module_name)
    return getattr(module, algo_cls), getattr(module, config_cls)


def make(name: str, **config: Any) -> Any:
    algo_cls, config_cls = load(name)
    return algo_cls(config_cls(**config))
