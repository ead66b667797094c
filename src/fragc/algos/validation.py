"""The check every algorithm's `Config.__post_init__` runs: each field's type, and its range.

Ranges live in one table keyed by field name, so a field means the same thing
in every algorithm (`gamma` is a discount in [0, 1] wherever it appears).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from fragc.ir.errors import FragcError

INT32_MAX = 2**31 - 1
"""Counts end up as int32 on device (indices, step counters, schedules)."""


class Range(NamedTuple):
    low: float
    high: float = math.inf
    low_open: bool = False  # True: the value must be above `low`, not equal to it

    def holds(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def __str__(self) -> str:
        if self.high < math.inf:
            return f"in [{self.low:g}, {self.high:g}]"
        if self.low_open:
            return "positive" if self.low == 0 else f"above {self.low:g}"
        return f"at least {self.low:g}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1)

RANGES: dict[str, Range] = {
    "lr": POSITIVE,
    "gamma": FRACTION,
    "gae_lambda": FRACTION,
    "vtrace_lambda": FRACTION,
    "clip_eps": POSITIVE,
    "max_grad_norm": POSITIVE,
    "ent_coef": NON_NEGATIVE,
    "vf_coef": NON_NEGATIVE,
    "eps_start": FRACTION,
    "eps_end": FRACTION,
    "eps_finish": FRACTION,
    "eps_decay": FRACTION,
    "td_lambda": FRACTION,
    "reward_scale": POSITIVE,
    "rho_bar": POSITIVE,
    "c_bar": POSITIVE,
    "learning_starts": NON_NEGATIVE,
    "eval_every": NON_NEGATIVE,
    "eval_games": NON_NEGATIVE,
    "unroll": NON_NEGATIVE,  # sac: 0 picks by backend
    "num_layers": Range(1, 64),
    "hidden": Range(1, 46340),  # a hidden x hidden matrix within int32 elements (hidden=1e9 made XLA abort)
}
"""Fields with a range; every other int field must be positive, every float finite."""

NETWORK_CHOICES = ("auto", "mlp", "nature_cnn", "impala_cnn")
"""What `network` names: `auto` picks from the observation's rank (src/fragc/algos/networks.py, `network_for`)."""

CHOICES: dict[str, tuple[str, ...]] = {"network": NETWORK_CHOICES, "activation": ("tanh", "relu")}
"""String fields that take one of a few names."""


def algo_name(config: Any) -> str:
    """The algorithm's name in a message about its config: its config's module (`a2c`, also for a2c's runs of
    PPO's code)."""
    return type(config).__module__.rsplit(".", 1)[-1]


def check_config(config: Any) -> None:
    """Refuse a config whose fields have the wrong type or lie outside their range, naming the
    algorithm (`algo_name`) and the field."""
    algo = algo_name(config)
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        kind = str(field.type)
        if kind == "bool":
            if not isinstance(value, bool):
                raise FragcError(f"{algo}: {field.name} must be True or False, got {value!r}")
        elif kind == "int":
            _check_int(algo, field.name, value)
        elif kind == "float":
            _check_float(algo, field.name, value)
        elif kind == "str" and not isinstance(value, str):
            raise FragcError(f"{algo}: {field.name} must be a string, got {value!r}")
        elif kind == "str" and field.name in CHOICES and value not in CHOICES[field.name]:
            raise FragcError(f"{algo}: {field.name} must be one of {', '.join(CHOICES[field.name])}, got {value!r}")
    if hasattr(config, "steps_per_iteration"):
        _check_run_length(algo, config)


def _check_int(algo: str, name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise FragcError(f"{algo}: {name} must be an int, got {value!r}")
    allowed = RANGES.get(name, POSITIVE)
    if not allowed.holds(value):
        raise FragcError(f"{algo}: {name} must be {allowed}, got {value}")
    if name != "total_steps" and value > INT32_MAX:
        raise FragcError(f"{algo}: {name} must be at most {INT32_MAX}, got {value}")


def _check_float(algo: str, name: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise FragcError(f"{algo}: {name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise FragcError(f"{algo}: {name} must be finite, got {value}")
    allowed = RANGES.get(name)
    if allowed is not None and not allowed.holds(value):
        raise FragcError(f"{algo}: {name} must be {allowed}, got {value:g}")


def _check_run_length(algo: str, config: Any) -> None:
    """One rollout's steps are indexed in int32, and so is the iteration count (the schedules' step)."""
    if config.steps_per_iteration > INT32_MAX:
        raise FragcError(f"{algo}: num_envs * num_steps ({config.steps_per_iteration}) must be at most {INT32_MAX}")
    if config.total_steps // config.steps_per_iteration > INT32_MAX:
        raise FragcError(f"{algo}: total_steps ({config.total_steps}) is more than {INT32_MAX} iterations of "
                         f"num_envs * num_steps ({config.steps_per_iteration})")
