"""loop{k}: where the whole iteration is one stage, scan k iterations per dispatch.

The module records the count in `attrs["iterations_per_dispatch"]`; the
runtime scans that many iterations in one compiled program.
"""

from __future__ import annotations

import dataclasses

from fragc.ir.errors import FragcError
from fragc.ir.module import Module

from .pipeline import Pass


@dataclasses.dataclass(frozen=True)
class Loop(Pass):
    k: int = 16
    name = "loop"

    def run(self, module: Module) -> Module:
        if not isinstance(self.k, int) or self.k < 1:
            raise FragcError(f"loop: iterations per dispatch must be a positive int, got {self.k!r}")
        stages = module.attrs.get("stages", ())
        one_stage = len(stages) <= 1 and not any(n.kind in ("transfer", "delay") for n in module.graph.nodes)
        k = self.k if one_stage else 1
        return module.replace(attrs={**module.attrs, "iterations_per_dispatch": k})
