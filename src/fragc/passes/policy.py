"""Distribution policies as data: device groups, and per role a group, a replica count and a lowering.

A policy is resolved for a device count into a `Policy`; `place` reads it.
Write a new one by constructing `Policy(...)` and passing it to `fragc.compile`.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import numbers
import re
from typing import Any, Callable, Mapping, Sequence

from fragc.ir.errors import FragcError
from fragc.ir.host import EnvFleet
from fragc.ir.population import PBT, grid_members

LOWERINGS = ("shard_map", "jit")
SPLITS = ("env", "agent")
"""What a role's replicas split: the environment axes, or the agent axes (`RolePlacement.split`)."""

EVALUATOR = "evaluator"
"""The role of evaluation episodes (src/fragc/algos/evaluation.py). Host environments stepped by an evaluator inside an
`if` region step in the program whatever the policy's `env_groups`: an evaluation plays whole episodes with
no training inference to overlap, and the training rollout keeps its groups."""

OPTIONAL_ROLES = frozenset({EVALUATOR})
"""Roles a policy may place that an algorithm need not have: an algorithm without evaluation episodes
compiles under a policy that says where they would run."""


@dataclasses.dataclass(frozen=True)
class RolePlacement:
    """Where one role's fragments run."""

    group: str
    """Name of the device group."""
    replicas: int | None = None
    """Replica count; `None` means one per device of the group."""
    lowering: str = "shard_map"
    """`shard_map` (replica-parallel) or `jit` (GSPMD shardings)."""
    split: str = "env"
    """The axes the replicas split: `env` (the environment axes), or `agent` (the agent axes a fragment declares:
    agents with parameters of their own learn on devices of their own, MSRL's fragment per agent)."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """Device groups and role placements; `"*"` in `roles` places any other role."""

    name: str
    groups: Mapping[str, tuple[int, ...]]
    """Group name -> indices into the program's device list."""
    roles: Mapping[str, RolePlacement]
    staleness: int = 0
    """Iterations by which the actor's parameters lag the learner's (0: synchronous)."""
    population: tuple[int, ...] = ()
    """Seed offsets of independent runs vectorised in one program (empty: one run)."""
    hyperparameters: tuple[tuple[str, tuple], ...] = ()
    """For a population that varies config fields: per field, each member's value (src/fragc/ir/sweep.py)."""
    member_loop: bool = False
    """A population's members one after another on each device, each bit for bit its single run (`exact`)."""
    pbt: Any = None
    """Population-based training's settings (`fragc.PBT`), for a population with a grid."""
    env_groups: int = 1
    """For fragments that step host environments: their time loop runs from the host with each replica's
    environments in this many groups, inference of one group overlapping the host stepping of another
    (1: synchronous; 0: the host step runs inside the compiled program)."""
    env_workers: int = 0
    """For fragments that step host environments: the workers of each environment pool (EnvPool's threads;
    0: the backend's default). docs/host_envs.md, "Choosing groups and workers"."""
    env_fleet: str = ""
    """For fragments that step host environments: the remote environment workers they step on (`ray:N[xE]`:
    N Ray actors of E environments each, docs/distributed.md), "" for pools in this process."""

    def __post_init__(self) -> None:
        check_policy(self)

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


def check_policy(policy: Policy) -> None:
    """Refuse a policy that cannot mean anything: device groups must be non-empty, disjoint sets of
    non-negative device indices, and each role names a group, a positive replica count and a lowering."""
    name = policy.name
    if not isinstance(policy.groups, Mapping) or not isinstance(policy.roles, Mapping) or not policy.groups:
        raise FragcError(f"policy '{name}': groups (name -> device indices) and roles (role -> RolePlacement) "
                         "must be non-empty mappings")
    owner: dict[int, str] = {}
    for group, devices in policy.groups.items():
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or not devices:
            raise FragcError(f"policy '{name}': device group '{group}' must be a non-empty tuple of device "
                             f"indices, got {devices!r}")
        for index in devices:
            if not _is_count(index, 0):
                raise FragcError(f"policy '{name}': device group '{group}' holds {index!r}; device indices are "
                                 "ints from 0")
            if index in owner:
                where = f"twice in group '{group}'" if owner[index] == group else (
                    f"in both group '{owner[index]}' and group '{group}'")
                raise FragcError(f"policy '{name}': device {index} is {where}; device groups are disjoint sets "
                                 "of devices (to share devices, place several roles on one group)")
            owner[index] = group
    for role, placement in policy.roles.items():
        if not isinstance(placement, RolePlacement):
            raise FragcError(f"policy '{name}': role '{role}' must be placed by a RolePlacement, got {placement!r}")
        if placement.group not in policy.groups:
            raise FragcError(f"policy '{name}': role '{role}' names unknown device group '{placement.group}'")
        if placement.lowering not in LOWERINGS:
            raise FragcError(f"policy '{name}': lowering '{placement.lowering}' is not one of {LOWERINGS}")
        if placement.split not in SPLITS:
            raise FragcError(f"policy '{name}': role '{role}' splits '{placement.split}'; one of {SPLITS}")
        if placement.split == "agent" and placement.lowering != "shard_map":
            raise FragcError(f"policy '{name}': role '{role}' splits agents under {placement.lowering}; agents' "
                             "learners split over devices under shard_map")
        replicas = placement.replicas
        if replicas is not None and not _is_count(replicas, 1):
            raise FragcError(f"policy '{name}': role '{role}' has replicas={replicas!r}; replicas are a positive "
                             "int (or None: one per device of the group)")
    if not _is_count(policy.staleness, 0):
        raise FragcError(f"policy '{name}': staleness must be an int from 0, got {policy.staleness!r}")
    if not _is_count(policy.env_groups, 0):
        raise FragcError(f"policy '{name}': env_groups must be an int from 0, got {policy.env_groups!r}")
    if not _is_count(policy.env_workers, 0):
        raise FragcError(f"policy '{name}': env_workers must be an int from 0, got {policy.env_workers!r}")
    if not isinstance(policy.env_fleet, str):
        raise FragcError(f"policy '{name}': env_fleet must be a string such as 'ray:2x4', got {policy.env_fleet!r}")
    if policy.env_fleet:
        EnvFleet.parse(policy.env_fleet)


def _is_count(value: object, least: int) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= least


def single(num_devices: int = 1) -> Policy:
    """Everything on one device, one replica: PureJaxRL's fused program."""
    del num_devices
    return Policy("single", {"main": (0,)}, {"*": RolePlacement("main", 1)})


def anakin(num_devices: int) -> Policy:
    """Every fragment on every device, one replica per device, `pmean` across them (Podracer's Anakin)."""
    return Policy("anakin", {"all": tuple(range(num_devices))}, {"*": RolePlacement("all")})


def gspmd(num_devices: int) -> Policy:
    """Single-device maths, environment axis sharded over all devices; XLA partitions (pjit data parallel)."""
    return Policy("gspmd", {"all": tuple(range(num_devices))}, {"*": RolePlacement("all", 1, "jit")})


def actor_learner(num_devices: int, actors: int | None = None, staleness: int = 0, evaluators: int = 0) -> Policy:
    """Actors on the first devices, the learner on the rest; trajectories and parameters move each iteration.

    Evaluation episodes (role "evaluator") run on the actors' devices, or with `evaluators` E > 0 on a group
    of E devices of their own between the actors and the learner (Sebulba's evaluators)."""
    base = "actor_learner_async" if staleness else "actor_learner"
    if not _is_count(evaluators, 0):
        raise FragcError(f"{base}: evaluators must be an int from 0, got {evaluators!r}")
    if num_devices < 2 + evaluators:
        raise FragcError(f"{base} needs at least {2 + evaluators} devices (actors"
                         f"{', evaluators' if evaluators else ''} and learner on different ones)")
    trained = num_devices - evaluators  # the devices of the actors and the learner
    actors = trained // 2 if actors is None else actors
    if not _is_count(actors, 1) or actors >= trained:
        raise FragcError(f"{base}: actors must be between 1 and {trained - 1}"
                         f"{f' (with {evaluators} evaluator devices)' if evaluators else ''}, got {actors}")
    groups = {"actors": tuple(range(actors))}
    roles = {"actor": RolePlacement("actors"), EVALUATOR: RolePlacement("actors"), "*": RolePlacement("learner")}
    if evaluators:
        groups["evaluators"] = tuple(range(actors, actors + evaluators))
        roles[EVALUATOR] = RolePlacement("evaluators")
    groups["learner"] = tuple(range(actors + evaluators, num_devices))
    name = f"{base}(evaluators={evaluators})" if evaluators else base
    return Policy(name, groups, roles, staleness=staleness)


def agent_learners(num_devices: int, actors: int | None = None, learners: int | None = None) -> Policy:
    """Actors on the first devices (environments split), and each agent's learner on devices of its own: the
    learner's replicas split the agent axis (MSRL's fragment per agent) of an algorithm whose agents hold their own
    parameters (ippo/mappo shared_params=false). `learners` devices (default: the rest) must divide the agents."""
    if num_devices < 2:
        raise FragcError("agent_learners needs at least 2 devices (actors and learners on different ones)")
    actors = num_devices // 2 if actors is None else actors
    learners = num_devices - actors if learners is None else learners
    if not _is_count(actors, 1) or not _is_count(learners, 1) or actors + learners > num_devices:
        raise FragcError(f"agent_learners: actors ({actors}) and learners ({learners}) are at least 1 each and "
                         f"together at most the {num_devices} devices")
    groups = {"actors": tuple(range(actors)), "learners": tuple(range(actors, actors + learners))}
    roles = {"actor": RolePlacement("actors"), EVALUATOR: RolePlacement("actors"),
             "*": RolePlacement("learners", split="agent")}
    return Policy("agent_learners", groups, roles)


def actor_learner_async(num_devices: int, actors: int | None = None, evaluators: int = 0) -> Policy:
    """actor_learner with staleness 1: rollout k+1 overlaps learn k (Sebulba, IMPALA)."""
    return actor_learner(num_devices, actors, staleness=1, evaluators=evaluators)


@dataclasses.dataclass(frozen=True)
class Population:
    """`population(policy, seeds, **grid)`: independent runs of `policy`, vectorised over seeds and, with a
    grid, over hyperparameter values (every configuration of the grid with every seed)."""

    base: "str | Policy"
    seeds: int | tuple[int, ...]
    grid: tuple[tuple[str, tuple], ...] = ()
    exact: bool = False
    pbt: Any = None

    def resolve(self, num_devices: int) -> Policy:
        offsets = tuple(range(self.seeds)) if isinstance(self.seeds, int) else tuple(self.seeds)
        if not offsets or (isinstance(self.seeds, int) and self.seeds < 1):
            raise FragcError(f"population needs at least one seed, got {self.seeds!r}")
        base = resolve(self.base, num_devices)
        if base.population:
            raise FragcError("population of a population: pass the seeds to one population(...)")
        if len(base.groups) > 1:
            raise FragcError(f"population({base.name},...): a population vectorises one program over its members, "
                             f"and {base.name} splits the iteration over {len(base.groups)} device groups; use "
                             f"population(single,S), which spreads its members over the devices given")
        replicated = sorted({p.group for p in base.roles.values() if (p.replicas or len(base.groups[p.group])) > 1})
        if replicated:
            raise FragcError(f"population({base.name},...) on {num_devices} devices: {base.name} runs each member as "
                             f"{len(base.groups[replicated[0]])} replicas, and a population's members are vectorised "
                             f"with one replica each; use population(single,S) (or gspmd), which spreads the members "
                             f"over the devices given")
        members, values = grid_members(offsets, self.grid)
        if self.pbt is not None and not self.grid:
            raise FragcError("population-based training perturbs hyperparameters: give the population a grid "
                             "(population(policy, seeds, lr=[...], ...))")
        if self.pbt is not None and len(members) < 2:
            raise FragcError(f"population-based training needs at least 2 members, got {len(members)}")
        return dataclasses.replace(base, name=f"population({base.name},{len(members)})", population=members,
                                   hyperparameters=values, member_loop=self.exact, pbt=self.pbt)


def population(policy: "str | Policy", seeds: int | Sequence[int], *, exact: bool = False, pbt: Any = None,
               **grid: Sequence[float]) -> Population:
    """Independent runs of `policy`: `seeds` runs (seed offsets 0..S-1) or the given seed offsets; with
    `grid` (config field -> values, e.g. `lr=[1e-4, 3e-4]`), every configuration of the grid with every
    seed, configuration-major: member i has configuration i // len(seeds) and seed i % len(seeds).

    Members are vectorised (`vmap`) and spread over the devices. XLA then sums over a batched axis in
    another order than the single run does, so a member differs from its single run in the last bits;
    `exact=True` runs each device's members one after another instead, each bit for bit its single run
    (slower: no vectorisation).

    pbt: population-based training over the grid's fields (`fragc.PBT(every=K)`, src/fragc/runtime/pbt.py)."""
    if not isinstance(exact, bool):
        raise FragcError(f"population: exact must be True or False, got {exact!r}")
    if pbt is not None and not isinstance(pbt, PBT):
        raise FragcError(f"population: pbt must be a fragc.PBT, got {type(pbt).__name__}")
    axes = []
    for field, values in grid.items():
        values = (values,) if isinstance(values, (int, float)) else tuple(values)
        if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise FragcError(f"population: {field} must be a number or a list of numbers, got {values!r}")
        axes.append((field, values))
    return Population(policy, seeds if isinstance(seeds, int) else tuple(seeds), tuple(axes), exact, pbt)


BUILTIN: dict[str, Callable[[int], Policy]] = {
    "single": single,
    "anakin": anakin,
    "gspmd": gspmd,
    "actor_learner": actor_learner,
    "actor_learner_async": actor_learner_async,
    "agent_learners": agent_learners,
}
_POPULATION = re.compile(r"^population\((\w+),\s*(\d+)\)$")
_WITH_PARAMETERS = re.compile(r"^(\w+)\((.*)\)$")


def resolve(policy: "str | Policy | Population", num_devices: int) -> Policy:
    """A built-in policy by name for `num_devices` (or `population(NAME,S)`), or a user's `Policy` as is."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, Population):
        return policy.resolve(num_devices)
    if isinstance(policy, str) and (m := _POPULATION.match(policy)):
        return population(m.group(1), int(m.group(2))).resolve(num_devices)
    if isinstance(policy, str) and (m := _WITH_PARAMETERS.match(policy.replace(" ", ""))) and m.group(1) in BUILTIN:
        return _with_parameters(m.group(1), m.group(2), num_devices)
    if not isinstance(policy, str) or policy not in BUILTIN:
        close = difflib.get_close_matches(str(policy), BUILTIN, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        known = ", ".join(BUILTIN) + ", population(POLICY,SEEDS)"
        raise FragcError(f"unknown policy '{policy}'{hint}; known policies: {known}")
    return BUILTIN[policy](num_devices)


def _with_parameters(name: str, text: str, num_devices: int) -> Policy:
    """`NAME(key=int,...)`: a built-in policy with some of its parameters given, e.g.
    `actor_learner(actors=3,evaluators=1)`."""
    factory = BUILTIN[name]
    accepted = list(inspect.signature(factory).parameters)[1:]  # after num_devices
    usage = (f"policy '{name}(...)' takes {', '.join(f'{p}=INT' for p in accepted)}" if accepted
             else f"policy '{name}' takes no parameters")
    kwargs: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in accepted or not re.fullmatch(r"\d+", value):
            raise FragcError(f"{usage}; got '{item}' in '{name}({text})'")
        if key in kwargs:
            raise FragcError(f"policy '{name}({text})' gives {key} twice")
        kwargs[key] = int(value)
    policy = factory(num_devices, **kwargs)
    if not kwargs:
        return policy
    return dataclasses.replace(policy, name=f"{name}({','.join(f'{k}={v}' for k, v in kwargs.items())})")


def check_roles(policy: Policy, roles: set[str]) -> None:
    """Every role the policy names exists (but those in `OPTIONAL_ROLES`), and every role is placed."""
    named = set(policy.roles) - {"*"} - (OPTIONAL_ROLES - roles)
    extra = named - roles
    if extra:
        raise FragcError(
            f"policy '{policy.name}' places role(s) {sorted(extra)} that the algorithm lacks (it has {sorted(roles)})"
        )
    for role in sorted(roles):
        policy.placement(role)
