"""fragc.ir: the fragmented dataflow graph, its frontend, printer, verifier and interpreter.

The names below load on first use (PEP 562): `fragc.ir.errors`, which the command line needs before it knows
whether the command will use JAX, imports no JAX."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "collectives": ("pmean", "psum"),
    "dot": ("to_dot",),
    "errors": ("FragcError", "FragmentError", "VerifyError"),
    "frontend": ("Fragment", "fragment", "trace"),
    "host": ("HostStep", "host_call"),
    "interpreter": ("interpret",),
    "module": ("REPLICA", "Delay", "FragmentDef", "Glue", "Graph", "Mesh", "Module", "Placement", "Run", "Schedule",
               "Stage", "Transfer", "Use", "Value"),
    "parser": ("ParseError", "parse"),
    "printer": ("format_module",),
    "types": ("LeafType", "TreeType"),
    "verifier": ("verify",),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'fragc.ir' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value  # later uses are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
