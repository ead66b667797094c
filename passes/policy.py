"""Distribution policies as data: device groups, and per role a group, a replica count and a lowering.

A policy is resolved for a device count into a `Policy`; `place` reads it.
Write a new one by constructing `Policy(...)` and passing it to `fragc.compile`.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Callable, Mapping

from fragc.ir.errors import FragcError

LOWERINGS = ("shard_map", "jit")


@dataclasses.dataclass(frozen=True)
class RolePlacement:
    """Where one role's fragments run."""

    group: str
    """Name of the device group."""
    replicas: int | None = None
    """Replica count; `None` means one per device of the group."""
    lowering: str = "shard_map"
    """`shard_map` (replica-parallel) or `jit` (GSPMD shardings)."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """Device groups and role placements; `"*"` in `roles` places any other role."""

    name: str
    groups: Mapping[str, tuple[int, ...]]
    """Group name -> indices into the program's device list."""
    roles: Mapping[str, RolePlacement]
    staleness: int = 0
    """Iterations by which the actor's parameters lag the learner's (0: synchronous)."""

    def __post_init__(self) -> None:
        for role, placement in self.roles.items():
            if placement.group not in self.groups:
                raise FragcError(f"policy '{self.name}': role '{role}' names unknown device group '{placement.group}'")
            if placement.lowering not in LOWERINGS:
                raise FragcError(f"policy '{self.name}': lowering '{placement.lowering}' is not one of {LOWERINGS}")
        for group, devices in self.groups.items():
            if not devices:
                raise FragcError(f"policy '{self.name}': device group '{group}' is empty")

    def placement(self, role: str) -> RolePlacement:
        if role in self.roles:
            return self.roles[role]
        if "*" in self.roles:
            return self.roles["*"]
        raise FragcError(f"policy '{self.name}' leaves role '{role}' unplaced (it places {sorted(self.roles)})")

    def replicas(self, role: str) -> int:
        p = self.placement(role)
        return p.replicas if p.replicas is not None else len(self.groups[p.group])

    @property
    def num_devices(self) -> int:
        return max(i for devices in self.groups.values() for i in devices) + 1


def single(num_devices: int = 1) -> Policy:
    """Everything on one device, one replica: PureJaxRL's fused program."""
    del num_devices
    return Policy("single", {"main": (0,)}, {"*": RolePlacement("main", 1)})


BUILTIN: dict[str, Callable[[int], Policy]] = {"single": single}


def resolve(policy: str | Policy, num_devices: int) -> Policy:
    """A built-in policy by name for `num_devices`, or a user's `Policy` as is."""
    if isinstance(policy, Policy):
        return policy
    if not isinstance(policy, str) or policy not in BUILTIN:
        close = difflib.get_close_matches(str(policy), BUILTIN, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise FragcError(f"unknown policy '{policy}'{hint}; known policies: {', '.join(BUILTIN)}")
    return BUILTIN[policy](num_devices)


def check_roles(policy: Policy, roles: set[str]) -> None:
    """Every role the policy names exists, and every role is placed."""
    named = set(policy.roles) - {"*"}
    extra = named - roles
    if extra:
        raise FragcError(
            f"policy '{policy.name}' places role(s) {sorted(extra)} that the algorithm lacks (it has {sorted(roles)})"
        )
    for role in sorted(roles):
        policy.placement(role)
