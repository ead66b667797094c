"""Pass infrastructure: named passes with frozen options, verified after each one.

A pass is a `Pass` subclass: a `name`, dataclass fields for its options, and
`run(module) -> module`. `run_pipeline` labels each module with its pass (`002_canonicalize`),
verifies after every pass, names the failing pass and the ones before it,
and can print or dump the module after each pass.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Sequence

from fragc.ir.errors import FragcError, VerifyError
from fragc.ir.module import Module
from fragc.ir.printer import format_module
from fragc.ir.verifier import verify


class PassError(FragcError):
    """A pass failed, or left a module that does not verify."""


@dataclasses.dataclass(frozen=True)
class Pass:
    """Base class; subclasses are frozen dataclasses whose fields are the options."""

    name = "pass"

    def run(self, module: Module) -> Module:
        raise NotImplementedError

    def label(self) -> str:
        """`name{opt=value,...}`, as in the printed module header."""
        opts = ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self) if f.repr)
        return f"{self.name}{{{opts}}}" if opts else self.name


@dataclasses.dataclass
class PipelineResult:
    """The module after every pass, in order, starting with the traced one."""

    modules: list[Module]

    @property
    def final(self) -> Module:
        return self.modules[-1]

    def after(self, name: str | None) -> Module:
        """The module after the pass `name` (`place`, or its full label `003_place{policy=single}`)."""
        if name is None:
            return self.final
        for module in self.modules:
            if name in (module.label, pass_name(module)):
                return module
        known = ", ".join(pass_name(m) for m in self.modules)
        raise FragcError(f"no pass named '{name}' in this pipeline; passes: {known}")


def pass_name(module: Module) -> str:
    """`003_place{policy=single}` -> `place`."""
    return module.label.split("_", 1)[1].split("{", 1)[0]


def run_pipeline(
    module: Module,
    passes: Sequence[Pass],
    print_after_all: bool = False,
    dump_dir: str | None = None,
    printer: Callable[[str], None] = print,
) -> PipelineResult:
    modules = [verify(module)]
    _emit(module, print_after_all, dump_dir, printer)
    for number, p in enumerate(passes, start=2):
        label = f"{number:03d}_{p.label()}"
        try:
            module = verify(p.run(modules[-1]).replace(label=label))
        except FragcError as err:
            done = ", ".join(m.label for m in modules)
            raise PassError(f"pass '{p.label()}' failed (after {done}): {err}") from err
        modules.append(module)
        _emit(module, print_after_all, dump_dir, printer)
    return PipelineResult(modules)


def _emit(module: Module, print_after_all: bool, dump_dir: str | None, printer: Callable[[str], None]) -> None:
    if not print_after_all and dump_dir is None:
        return  # printing a module is not free: skip it when nobody reads it
    text = format_module(module)
    if print_after_all:
        printer(text)
    if dump_dir is not None:
        try:
            os.makedirs(dump_dir, exist_ok=True)
            name = module.label.split("{", 1)[0]
            with open(os.path.join(dump_dir, f"{name}.fir"), "w") as f:
                f.write(text)
        except OSError as err:
            raise FragcError(f"cannot write IR dumps to '{dump_dir}': {err.strerror}") from err


__all__ = ["Pass", "PassError", "PipelineResult", "VerifyError", "run_pipeline"]
