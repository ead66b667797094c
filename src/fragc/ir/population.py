"""A population's grid and population-based training's settings: plain Python, no JAX.

Policies are parsed where JAX must not start yet (`fragc --help`, `fragc launch`), so what `population(...)`
needs of a sweep lives here; src/fragc/ir/sweep.py (hyperparameters as traced values) builds on it.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

from .errors import FragcError

Grid = tuple[tuple[str, tuple[Any, ...]], ...]
"""Per swept field (in the order given), its values: ((field, (v0, v1, ...)), ...)."""


@dataclasses.dataclass(frozen=True)
class PBT:
    """Population-based training's settings (src/fragc/runtime/pbt.py says what the step does)."""

    every: int
    """Iterations between exploit/explore steps."""
    metric: str = "episode_return"
    """The metric members are ranked by (higher is better)."""
    fraction: float = 0.25
    """The worst `fraction` of the members copy the best `fraction`."""
    resample: float = 0.25
    """The probability that a copied hyperparameter is drawn again from the grid's values instead of perturbed."""
    seed: int = 0
    """The seed of the selection and perturbation draws."""
    bounds: tuple[tuple[str, float, float], ...] = ()
    """(field, low, high) for the swept fields with a range: perturbed values are clipped into it."""

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise FragcError(f"pbt: every must be a positive number of iterations, got {self.every!r}")
        if not 0 < self.fraction <= 0.5:
            raise FragcError(f"pbt: fraction must be in (0, 0.5], got {self.fraction!r}")
        if not 0 <= self.resample <= 1:
            raise FragcError(f"pbt: resample must be in [0, 1], got {self.resample!r}")

    def header(self) -> str:
        """The IR's `pbt` line."""
        bounds = ",".join(f"{f}:{lo!r}:{hi!r}" for f, lo, hi in self.bounds)
        return (f"pbt every={self.every} metric={self.metric} fraction={self.fraction!r} "
                f"resample={self.resample!r} seed={self.seed}" + (f" bounds={bounds}" if bounds else ""))


def grid_members(seeds: Sequence[int], axes: Grid) -> tuple[tuple[int, ...], Grid]:
    """Members of seeds x the grid, configuration-major (a configuration's seeds are adjacent) ->
    (each member's seed offset, per field each member's value)."""
    configs = list(itertools.product(*[values for _, values in axes])) or [()]
    offsets = tuple(s for _ in configs for s in seeds)
    per_member = tuple((name, tuple(c[i] for c in configs for _ in seeds)) for i, (name, _) in enumerate(axes))
    return offsets, per_member
