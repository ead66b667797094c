"""The candidate space of the placement search: every built-in policy, actor/learner splits, iterations per
dispatch, environment groups, a population's base policy."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from fragc.passes.policy import population

KS = (4, 16, 64)
"""Iterations per dispatch the search tries (capped by the run length)."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One configuration: a policy (any string `resolve` accepts, e.g. `actor_learner(actors=2)`), iterations
    per dispatch, environment groups (None: the policy's own), population seeds (0: none)."""

    policy: str
    k: int = 16
    env_groups: int | None = None
    seeds: int = 0

    @property
    def label(self) -> str:
        p = f"population({self.policy},{self.seeds})" if self.seeds else self.policy
        return p + f" k={self.k}" + ("" if self.env_groups is None else f" G={self.env_groups}")

    def policy_arg(self) -> Any:
        """What `CompileOptions.policy` says for it."""
        return population(self.policy, self.seeds) if self.seeds else self.policy


def default_candidates(num_devices: int, hosted: bool = False, iterations: int | None = None, seeds: int = 0,
                       env_groups: int | None = None, ks: Sequence[int] = KS) -> list[Candidate]:
    """Every built-in policy (actor/learner splits with N/4, N/2 and 3N/4 actors), each k in `ks` capped by
    the run length `iterations`, environment groups 1 and 2 for host environments (unless `env_groups` is
    fixed), as a population of `seeds` seeds when one was asked for."""
    n = num_devices
    policies = ["single"]
    if n > 1:
        policies += ["anakin", "gspmd"]
        splits = sorted({a for a in (n // 4, n // 2, (3 * n) // 4) if 1 <= a < n})
        for base in ("actor_learner", "actor_learner_async"):
            policies += [f"{base}(actors={a})" for a in splits]
    kset = sorted({min(k, iterations) if iterations else k for k in ks})
    groups: list[int | None] = [env_groups] if env_groups is not None else ([1, 2] if hosted else [None])
    return [Candidate(p, k, g, seeds) for p in policies for g in groups for k in kset]


def group_sizes_of(num_devices: int) -> list[int]:
    """The group sizes of the default space on `num_devices` devices: 1, the actor/learner splits, all."""
    n = num_devices
    return sorted({g for g in (1, n // 4, n // 2, (3 * n) // 4, n - n // 4, n - n // 2, n) if 1 <= g <= n})
