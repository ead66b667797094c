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

__all__ = [
    "REPLICA", "FragcError", "FragmentError", "Module", "VerifyError", "fragment", "interpret", "pmean", "psum",
    "trace",
]
__version__ = "0.1.0"
