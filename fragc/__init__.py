"""fragc: compile an RL training loop into a fragmented dataflow graph and run it
under a distribution policy chosen at compile time."""

from fragc.ir import (
    REPLICA,
    FragcError,
    FragmentError,
    Module,
    VerifyError,
    fragment,
    interpret,
    pmean,
    psum,
    trace,
)
from fragc import actions, distributed
from fragc.api import compile
from fragc.passes import Policy, RolePlacement, population
from fragc.ir.interpreter import run_iterations
from fragc.ir.sweep import PBT, SweepState
from fragc.runtime.program import Program
from fragc.training import TrainResult, train

__all__ = [
    "PBT", "Policy", "Program", "SweepState", "RolePlacement", "TrainResult", "actions", "compile", "distributed", "population", "run_iterations",
    "REPLICA", "FragcError", "FragmentError", "Module", "VerifyError", "fragment", "interpret", "pmean", "psum",
    "trace", "train",
]
__version__ = "0.1.0"
