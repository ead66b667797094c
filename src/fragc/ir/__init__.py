"""fragc.ir: the fragmented dataflow graph, its frontend, printer, verifier and interpreter.

The names below load on first use (PEP 562): `fragc.ir.errors`, which the command line needs before it knows
whether the command will use JAX, imports no JAX."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {
    ".collectives": ("pmean", "psum"),
    ".dot": ("to_dot",),
    ".errors": ("FragcError", "FragmentError", "VerifyError"),
    ".frontend": ("Fragment", "fragment", "trace"),
    ".host": ("HostStep", "host_call"),
    ".interpreter": ("interpret",),
    ".module": ("REPLICA", "Delay", "FragmentDef", "Glue", "Graph", "Mesh", "Module", "Placement", "Run", "Schedule",
                "Stage", "Transfer", "Use", "Value"),
    ".parser": ("ParseError", "parse"),
    ".printer": ("format_module",),
    ".types": ("LeafType", "TreeType"),
    ".verifier": ("verify",),
})


if TYPE_CHECKING:  # what type checkers and editors see
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
