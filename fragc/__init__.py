"""fragc: compile an RL training loop into a fragmented dataflow graph and run it
under a distribution policy chosen at compile time.

The names below load on first use (PEP 562), so that `fragc launch` and `fragc --help`, which need none of
them, start without importing JAX (about 2 s a process)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "fragc.ir": ("REPLICA", "FragcError", "FragmentError", "Module", "VerifyError", "fragment", "interpret", "pmean",
                 "psum", "trace"),
    "fragc.api": ("compile",),
    "fragc.passes": ("Policy", "RolePlacement", "population"),
    "fragc.ir.interpreter": ("run_iterations",),
    "fragc.ir.sweep": ("PBT", "SweepState"),
    "fragc.runtime.program": ("Program",),
    "fragc.training": ("TrainResult", "train"),
}
_SUBMODULES = ("actions", "distributed")
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted([*_HOME, *_SUBMODULES])
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _HOME:
        raise AttributeError(f"module 'fragc' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # later uses are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and editors see
    from fragc import actions, distributed
    from fragc.api import compile
    from fragc.ir import REPLICA, FragcError, FragmentError, Module, VerifyError, fragment, interpret, pmean, psum, trace
    from fragc.ir.interpreter import run_iterations
    from fragc.ir.sweep import PBT, SweepState
    from fragc.passes import Policy, RolePlacement, population
    from fragc.runtime.program import Program
    from fragc.training import TrainResult, train
