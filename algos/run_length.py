"""What every algorithm's config shares: its run length and the check of its counts."""

from __future__ import annotations

from fragc.ir.errors import FragcError


class RunLength:
    """Mixin for config dataclasses with `num_envs`, `num_steps` and `total_steps`."""

    num_envs: int
    num_steps: int
    total_steps: int

    @property
    def steps_per_iteration(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def iterations(self) -> int:
        return max(1, self.total_steps // self.steps_per_iteration)

    def require_positive(self, algo: str, *fields: str) -> None:
        for field in ("num_envs", "num_steps", "total_steps", *fields):
            if getattr(self, field) <= 0:
                raise FragcError(f"{algo}: {field} must be positive, got {getattr(self, field)}")
