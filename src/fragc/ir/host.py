"""Host calls: work a fragment hands to the host CPU from inside its body (a host environment's step).

`host_call` is `jax.pure_callback` with a marker: the callback is a
`HostCallback`, so the IR can find every host call in a fragment's body
(`find_host_steps`), print it with the bytes that cross between host and
device per iteration, and refuse placements it cannot run under
(`host_placement_error`).

Why `pure_callback` and not `io_callback(ordered=True)`: fragments run under
`vmap` (the reference interpreter's replicas, a population) and
`shard_map`; an ordered `io_callback` can be neither vmapped nor placed in
a `shard_map`. A host environment's step is not pure, but within one rollout
every call depends on the previous one's results (the next action is
computed from the observation it returned), so the data dependencies order
the calls and none is dropped (its results are used) or repeated
(nothing differentiates or rematerialises the rollout). `vmap_method=
"expand_dims"` makes a vmapped call one call with a leading replica axis,
so the host sees every environment at once.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Iterator

import jax
from jax.extend import core as jex

from .errors import FragcError
from .printer import human_bytes


class HostCallback:
    """A callable run on the host by `host_call`; `name` says what it is (``gymnasium:CartPole-v1 step``).

    `resources`, when given, is what stands behind the call on the host (a `HostVecEnv`): its
    `workers_error(n)` says why it cannot take `n` workers (None when it can), and `set_workers(n)` applies
    the worker count a placement chose (`Placement.env_workers`).

    `begin`, when given, starts the same call without waiting for it (`begin(*args) -> finish`, and
    `finish()` returns what `fn(*args)` returns): a host loop (src/fragc/runtime/host_loop.py) starts one group's host
    step before it queues another group's device program, so the host works while Python dispatches.
    """

    def __init__(self, name: str, fn: Callable[..., Any], resources: Any = None,
                 begin: Callable[..., Callable[[], Any]] | None = None):
        self.name = name
        self.fn = fn
        self.resources = resources
        self.begin = begin

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"HostCallback({self.name})"


def host_call(name: str, fn: Callable[..., Any], result_shapes: Any, *args: Any, resources: Any = None,
              begin: Callable[..., Callable[[], Any]] | None = None) -> Any:
    """Run `fn(*args)` on the host (numpy in, numpy out) from inside a fragment, visible in the IR as a host step.

    Under `vmap` the callback is called once with a leading axis added to every argument; it must
    return results with the same leading axes. `resources`, `begin`: see `HostCallback`.
    """
    return jax.pure_callback(HostCallback(name, fn, resources, begin), result_shapes, *args,
                             vmap_method="expand_dims")


def start_host_call(flat_callback: Any, *flat_args: Any) -> Callable[[], list[Any]]:
    """Start the host call behind a `pure_callback` equation's `callback` parameter (flat arguments) -> a
    function that waits for it and returns its flat results. A call without `begin` runs when waited for."""
    func = flat_callback.callback_func
    args, kwargs = jax.tree_util.tree_unflatten(flat_callback.in_tree, flat_args)
    if getattr(func, "begin", None) is None:
        return lambda: jax.tree_util.tree_leaves(func(*args, **kwargs))
    finish = func.begin(*args, **kwargs)
    return lambda: jax.tree_util.tree_leaves(finish())


@dataclasses.dataclass(frozen=True)
class HostStep:
    """A host call in a fragment's body, per iteration: how many calls and the bytes each way."""

    name: str
    calls: int  # per call of the fragment (the trip counts of the loops around it)
    to_host: int  # bytes device -> host per iteration (the call's operands, every call)
    from_host: int  # bytes host -> device per iteration (its results)

    def line(self) -> str:
        """The printed form (one line under the fragment's signature; `parse_line` reads it back)."""
        return (f'host step "{self.name}" on cpu calls={self.calls} to_host={self.to_host} '
                f"from_host={self.from_host}   // per iteration: {human_bytes(self.to_host)} device->host, "
                f"{human_bytes(self.from_host)} host->device")

    @staticmethod
    def parse_line(text: str) -> "HostStep | None":
        m = re.match(r'^host step "(.*)" on cpu calls=(\d+) to_host=(\d+) from_host=(\d+)(   // .*)?$', text)
        return HostStep(m[1], int(m[2]), int(m[3]), int(m[4])) if m else None


def is_host_call(eqn: Any) -> bool:
    """Whether `eqn` is a `host_call` (a `pure_callback` whose callback is a `HostCallback`)."""
    return eqn.primitive.name == "pure_callback" and isinstance(
        getattr(eqn.params.get("callback"), "callback_func", None), HostCallback)


def _host_call_eqns(jaxpr: Any, times: int = 1) -> Iterator[tuple[Any, int]]:
    """(equation, calls per call of `jaxpr`) of every host call in `jaxpr`, recursively: the trip counts of
    the scans around it multiplied."""
    for eqn in jaxpr.eqns:
        if is_host_call(eqn):
            yield eqn, times
            continue
        trips = int(eqn.params.get("length", 1)) if eqn.primitive.name == "scan" else 1
        for sub in jex.jaxprs_in_params(eqn.params):
            yield from _host_call_eqns(sub, times * trips)


def find_host_steps(jaxpr: Any) -> tuple[HostStep, ...]:
    """Every host call in `jaxpr` (recursively), with the trip counts of the scans around it."""
    return tuple(HostStep(eqn.params["callback"].callback_func.name, times, times * _nbytes(eqn.invars),
                          times * _nbytes(eqn.outvars)) for eqn, times in _host_call_eqns(jaxpr))


def host_callbacks(jaxpr: Any) -> list[HostCallback]:
    """Every host call's callback in `jaxpr` (recursively)."""
    return [eqn.params["callback"].callback_func for eqn, _ in _host_call_eqns(jaxpr)]


def _worker_resources(fdef: Any) -> list[Any]:
    """What stands behind the fragment's host calls and takes a worker count (each once)."""
    found: list[Any] = []
    for callback in host_callbacks(fdef.body.jaxpr) if fdef.body is not None else ():
        if callback.resources is not None and all(r is not callback.resources for r in found):
            found.append(callback.resources)
    return found


def env_workers_error(fdef: Any, workers: int) -> str | None:
    """Why the fragment's host environments cannot take `workers` workers each (None when they can, or 0)."""
    if not workers:
        return None
    resources = _worker_resources(fdef)
    if not resources:
        return f"env_workers={workers}: fragment '{fdef.name}' has no host environment that takes a worker count"
    return next((e for e in (r.workers_error(workers) for r in resources) if e), None)


def apply_env_workers(module: Any) -> None:
    """Give the host environments of every placed fragment its placement's worker count (0: their default);
    `place` checked that they take it."""
    for fdef in module.fragments.values():
        if fdef.placement is not None and fdef.host_steps:
            for resources in _worker_resources(fdef):
                resources.set_workers(fdef.placement.env_workers)


def _nbytes(variables: Any) -> int:
    return sum(math.prod(v.aval.shape) * v.aval.dtype.itemsize for v in variables)


def host_placement_error(module: Any, shape: str) -> str | None:
    """Why the module's host steps cannot run where the policy put them (None when they can).

    What runs: the host step inside a fragment with one replica per device (`shard_map`), in a fused or
    staged program; with a host loop (`env_groups` >= 1) across processes too, each process stepping the
    environments of its own devices (anakin, and actor_learner(_async) with each process's actors feeding its
    own learner devices: Sebulba over `jax.distributed`). GSPMD over several devices (XLA decides where the
    call runs), a population (every member would step the same environments) and one SPMD program over
    groups (`transfers='collective'`) are refused.
    """
    hosted = [f for f in module.fragments.values() if f.host_steps]
    if not hosted:
        return None
    sizes = {m.name: len(m.devices) for m in module.meshes}
    for fdef in hosted:
        p = fdef.placement
        if p is None:
            continue
        if p.lowering != "shard_map" and sizes.get(p.group, 1) > 1:
            return (f"fragment '{fdef.name}' steps host environments and is spread over {sizes[p.group]} devices "
                    f"of group @{p.group} by GSPMD; host environments run with one replica per device: use single, "
                    "anakin or actor_learner(_async)")
    if module.population:
        return "a population with host environments is not supported yet (every member would step the same environments)"
    if shape == "spmd":
        return ("host environments in one SPMD program over device groups are not supported: use transfers='auto' "
                "(across processes each process then moves its own shards between groups)")
    return None


def check_host_placement(module: Any, shape: str) -> None:
    reason = host_placement_error(module, shape)
    if reason is not None:
        raise FragcError(reason)


@dataclasses.dataclass(frozen=True)
class EnvFleet:
    """Where a fragment's host environments step when not in this process: `workers` remote environment workers
    (Ray actors, src/fragc/algos/ray_envs.py) of `envs_per_worker` environments each (0: not known yet, resolved by `place`
    from the batch), each asking Ray for `cpus` CPUs and one unit of each of `resources` (custom resources, which
    put workers on the nodes that offer them). Printed and parsed as `ray:2x4`, `ray:2x4,cpus=0.5,resource=env`."""

    workers: int
    envs_per_worker: int = 0
    cpus: float = 1.0
    resources: tuple[str, ...] = ()

    @staticmethod
    def parse(text: str) -> "EnvFleet":
        """`ray:N[xE][,cpus=C][,resource=NAME]...`, refused in one line otherwise."""
        head, *opts = text.strip().split(",")
        m = re.fullmatch(r"ray:(\d+)(?:x(\d+))?", head)
        usage = "ray:N[xE][,cpus=C][,resource=NAME] (N workers of E environments each)"
        if not m or int(m[1]) < 1 or (m[2] is not None and int(m[2]) < 1):
            raise FragcError(f"env fleet '{text}': expected {usage}")
        cpus, resources = 1.0, []
        for opt in opts:
            key, _, value = opt.partition("=")
            if key == "cpus":
                try:
                    cpus = float(value)
                except ValueError:
                    cpus = -1.0
                if not cpus > 0:
                    raise FragcError(f"env fleet '{text}': cpus must be a positive number, got {value!r}")
            elif key == "resource" and re.fullmatch(r"[\w.-]+", value):
                resources.append(value)
            else:
                raise FragcError(f"env fleet '{text}': unknown option {opt!r}; expected {usage}")
        return EnvFleet(int(m[1]), int(m[2] or 0), cpus, tuple(resources))

    def __str__(self) -> str:
        size = f"x{self.envs_per_worker}" if self.envs_per_worker else ""
        cpus = f",cpus={self.cpus:g}" if self.cpus != 1.0 else ""
        return f"ray:{self.workers}{size}{cpus}" + "".join(f",resource={r}" for r in self.resources)

    def resolved(self, num_envs: int, groups: int) -> "EnvFleet":
        """With `envs_per_worker` from a batch of `num_envs` environments in `groups` pools (a host loop's groups
        times the replicas), checked: every pool is whole workers."""
        n, e = self.workers, self.envs_per_worker
        if e and n * e != num_envs:
            raise FragcError(f"env fleet {self}: {n} workers x {e} environments is {n * e} environments, but the "
                             f"rollout steps {num_envs}; set num_envs to {n * e}, or use ray:{n}")
        if num_envs % n:
            raise FragcError(f"env fleet {self}: {num_envs} environments do not split into {n} equal workers")
        if n % groups:
            raise FragcError(f"env fleet {self}: {n} workers do not split into the {groups} environment pools "
                             "(environment groups x replicas) that step separately; use a multiple of "
                             f"{groups} workers")
        return dataclasses.replace(self, envs_per_worker=num_envs // n)


def env_fleet_error(fdef: Any, fleet: str) -> str | None:
    """Why the fragment's host environments cannot step on the fleet `fleet` (None when they can, or "")."""
    if not fleet:
        return None
    resources = [r for r in _worker_resources(fdef) if hasattr(r, "fleet_error")]
    if not resources:
        return f"env fleet {fleet}: fragment '{fdef.name}' has no host environment that can step on remote workers"
    return next((e for e in (r.fleet_error(fleet) for r in resources) if e), None)


def apply_env_fleet(module: Any) -> None:
    """Start the remote environment workers of every placed fragment's fleet (`Placement.env_fleet`), before
    `init`: a worker that cannot start is refused in one line before training."""
    for fdef in module.fragments.values():
        if fdef.placement is not None and fdef.host_steps and fdef.placement.env_fleet:
            for resources in _worker_resources(fdef):
                resources.set_fleet(fdef.placement.env_fleet)


def fleet_counters(module: Any) -> list[Any]:
    """The remote environment fleets behind the module's host calls (each once): each counts `episodes_cut`, the
    episodes its lost workers cut short (src/fragc/algos/ray_envs.py)."""
    found: list[Any] = []
    for fdef in module.fragments.values():
        for resources in _worker_resources(fdef):
            fleet = getattr(resources, "fleet", None)
            if fleet is not None and all(f is not fleet for f in found):
                found.append(fleet)
    return found
