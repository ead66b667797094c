"""fragc: compile an RL training loop into a fragmented dataflow graph and run it
under a distribution policy chosen at compile time.

The names below load on first use (PEP 562), so that `fragc launch` and `fragc --help`, which need none of
them, start without importing JAX (about 2 s a process)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fragc.ir.lazy import lazy_names
from fragc.runtime import cpu_threads

cpu_threads.configure()  # XLA's CPU threads are fixed when JAX starts its CPU backend: decided before (see the module)

__getattr__, __dir__, __all__ = lazy_names(__name__, {
    "fragc.ir": ("REPLICA", "FragcError", "FragmentError", "Module", "VerifyError", "fragment", "interpret", "pmean",
                 "psum", "trace"),
    "fragc.ir.collectives": ("fold_in_replica",),
    "fragc.api": ("compile", "compile_with"),
    "fragc.options": ("CompileOptions", "SearchOptions"),
    "fragc.passes": ("Policy", "RolePlacement", "population"),
    "fragc.ir.interpreter": ("run_iterations",),
    "fragc.ir.sweep": ("PBT", "SweepState"),
    "fragc.runtime.program": ("Program",),
    "fragc.training": ("TrainResult", "train"),
    "fragc.inference": ("load_policy", "export_policy"),
}, submodules=("actions", "distributed"))
__version__ = "0.1.0"


if TYPE_CHECKING:  # what type checkers and editors see
    from fragc import actions, distributed
    from fragc.api import compile, compile_with
    from fragc.ir.collectives import fold_in_replica
    from fragc.ir import REPLICA, FragcError, FragmentError, Module, VerifyError, fragment, interpret, pmean, psum, trace
    from fragc.ir.interpreter import run_iterations
    from fragc.ir.sweep import PBT, SweepState
    from fragc.options import CompileOptions, SearchOptions
    from fragc.passes import Policy, RolePlacement, population
    from fragc.runtime.program import Program
    from fragc.training import TrainResult, train
    from fragc.inference import export_policy, load_policy
