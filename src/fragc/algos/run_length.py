"""What every algorithm's config shares: its run length and the check of its fields."""

from __future__ import annotations

from fragc.algos.validation import check_config


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

    def check_fields(self) -> None:
        """Each field's type and range (`validation.check_config`); `__post_init__` calls it."""
        check_config(self)
