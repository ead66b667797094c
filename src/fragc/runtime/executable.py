"""A compiled XLA program of a schedule, as `Program.hlo()` and `Program.cost()` see it."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Executable:
    """One compiled XLA program: `Program.hlo(name)` prints it, `Program.cost()` reads it.

    A *stage* is the IR's (a subgraph `fuse` makes, `Module.stages`); an executable is what runs:
    a `staged` schedule compiles one per stage (named after it), a `fused` or `spmd` schedule one
    for the whole iteration (named "iteration"), which runs every stage; a host loop's stage
    has four (`{stage}.prefix`, `.infer`, `.absorb`, `.suffix`: infer and absorb run once per time
    step and environment group, src/fragc/runtime/host_loop.py).
    """

    name: str
    stages: tuple[str, ...]
    """The module's stages this program runs."""
    fragments: tuple[str, ...]
    lowered: Any
    compiled: Any
    iterations: int = 1
    """Iterations one call of the program runs."""
