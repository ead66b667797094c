"""fragc.ir: the fragmented dataflow graph, its frontend, printer, verifier and interpreter."""

from .collectives import pmean, psum
from .dot import to_dot
from .errors import FragcError, FragmentError, VerifyError
from .frontend import Fragment, fragment, trace
from .host import HostStep, host_call
from .interpreter import interpret
from .module import (
    REPLICA, Delay, FragmentDef, Glue, Graph, Mesh, Module, Placement, Run, Schedule, Stage, Transfer, Use, Value,
)
from .parser import ParseError, parse
from .printer import format_module
from .types import LeafType, TreeType
from .verifier import verify

__all__ = [
    "REPLICA", "Delay", "FragcError", "Fragment", "FragmentDef", "FragmentError", "Glue", "Graph", "HostStep", "LeafType",
    "Mesh", "Module", "ParseError", "Placement", "Run", "Schedule", "Stage", "Transfer", "TreeType", "Use", "Value", "VerifyError", "format_module",
    "fragment", "host_call", "interpret", "parse", "pmean", "psum", "to_dot", "trace", "verify",
]
