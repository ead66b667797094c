"""The compiler below `fragc.compile`: trace -> passes -> `Program`, for one placement (no search).

`run_passes(algo, options)` traces the algorithm and runs the passes of the resolved policy on the chosen devices
(`fragc ir` prints its result); `build(algo, options)` makes the `Program` of it. `fragc.compile` (src/fragc/api.py)
calls `build`, or the placement search (src/fragc/search/), which calls `build` for each candidate it times.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import warnings
from typing import Any, Sequence

import jax
from jax.sharding import Mesh

from fragc.algos.validation import RANGES
from fragc.devices import devices as choose_devices
from fragc.ir.errors import FragcError
from fragc.ir.frontend import check_per_replica, trace
from fragc.ir.sweep import check_grid, explain_shape_field, swept
from fragc.options import CompileOptions
from fragc.passes import Policy, Population, PipelineResult, default_passes, resolve, run_pipeline
from fragc.runtime.multihost import halves_by_process, spans_processes
from fragc.runtime.program import Program

TRANSFERS = ("auto", "device_put", "collective")
"""What `CompileOptions.transfers` may say (`carrier`)."""


def build(algo: Any, options: CompileOptions) -> Program:
    """The compiled `Program` of `algo` under `options.policy` (a placement, not "auto")."""
    pipeline, devs, resolved = run_passes(algo, options)
    # The 2-replica check is Python tracing and XLA compiles without the GIL: trace while XLA compiles, so
    # the check costs no start-up time. Not for a sweep: its fragment bodies swap the algorithm's config under a
    # lock (src/fragc/ir/sweep.py) while JAX traces them, and two threads holding that lock and JAX's own could wait on
    # each other; one thread cannot.
    if resolved.hyperparameters:
        warn_per_replica(pipeline.final)
        return Program(algo, pipeline, devs, resolved)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fragc-check") as pool:
        checked = pool.submit(check_per_replica, pipeline.final)
        program = Program(algo, pipeline, devs, resolved)
        warn_per_replica(pipeline.final, checked.result())
    return program


def warn_per_replica(module: Any, problems: list[str] | None = None) -> None:
    """One warning line per fragment that runs with one replica here but would fail with several
    (`check_per_replica`): a policy that runs it with several refuses it, this one runs it."""
    for problem in check_per_replica(module) if problems is None else problems:
        warnings.warn(f"{problem} (it runs with one replica here; a policy that runs it with several refuses it)",
                      stacklevel=3)


def run_passes(algo: Any, options: CompileOptions) -> tuple[PipelineResult, list[Any], Policy]:
    """`build` without the XLA programs: trace `algo` and run the passes of `options.policy` -> (the module after
    every pass, the devices, the resolved policy). `fragc ir` prints this."""
    if options.iterations_per_dispatch is None:
        options = dataclasses.replace(options, iterations_per_dispatch=dispatch_default(algo))
    _check_arguments(options.devices, options.mesh, options.iterations_per_dispatch)
    devs = _chosen_devices(options)
    policy = resolved_policy(options, len(devs))
    devs = _local_copy_if_it_fits(devs, policy)
    traced = trace_for(algo, policy)
    check_pbt_metric(traced, policy)
    if is_hosted(traced) and spans_processes(devs[: policy.num_devices]) and options.mesh is None:
        devs = halves_by_process(devs)  # Sebulba: every process's actors feed its own learner devices
    return passes_of(traced, policy, options, devs), devs, policy


def dispatch_default(algo: Any) -> int:
    """Iterations per dispatch where the caller gives none: the algorithm's `iterations_per_dispatch`, else 16."""
    return int(getattr(algo, "iterations_per_dispatch", 16))


def check_pbt_metric(traced: Any, policy: Policy) -> None:
    """PBT ranks members by a metric the iteration reports: refused in one line, before anything compiles, where
    it reports no such metric."""
    pbt = policy.pbt
    if pbt is not None and pbt.metric not in (names := traced.metric_names()):
        raise FragcError(f"pbt: the algorithm reports no metric '{pbt.metric}' to rank members by; it reports "
                         f"{', '.join(names) or 'none'}")


def resolved_policy(options: CompileOptions, num_devices: int) -> Policy:
    """`options.policy` as a `Policy` on `num_devices` devices, with the options' environment groups and workers
    where given; refused where it needs more devices."""
    policy = with_pbt_bounds(resolve(options.policy, num_devices))
    if options.env_groups is not None:
        policy = dataclasses.replace(policy, env_groups=options.env_groups)  # checked by Policy itself
    if options.env_workers is not None:
        policy = dataclasses.replace(policy, env_workers=options.env_workers)
    if options.env_fleet is not None:
        policy = dataclasses.replace(policy, env_fleet=options.env_fleet)
    if policy.num_devices > num_devices:
        raise FragcError(f"policy '{policy.name}' uses {policy.num_devices} devices but the program has "
                         f"{num_devices}; pass devices={policy.num_devices}")
    return policy


def passes_of(traced: Any, policy: Policy, options: CompileOptions, devs: Sequence[Any]) -> PipelineResult:
    """The passes of `policy` run on a traced module (the search traces once for all its candidates)."""
    transfers = carrier(options.transfers, devs, is_hosted(traced))
    return run_pipeline(traced, default_passes(policy, options.iterations_per_dispatch, transfers),
                        print_after_all=options.print_after_all, dump_dir=options.dump_dir, printer=options.printer)


def is_hosted(traced: Any) -> bool:
    """Whether a traced module steps host environments (src/fragc/ir/host.py)."""
    return any(f.host_steps for f in traced.fragments.values())


def _chosen_devices(options: CompileOptions) -> list[Any]:
    """The program's devices: the mesh's, the ones given, or the first N (default: `default_device_count`)."""
    if options.mesh is not None and options.devices is not None:
        raise FragcError("compile: pass devices or mesh, not both")
    if options.mesh is not None:
        return list(options.mesh.devices.flat)
    if options.devices is not None and not isinstance(options.devices, int):
        return list(options.devices)
    count = options.devices if options.devices is not None else default_device_count(options.policy)
    return choose_devices(count)


def with_pbt_bounds(policy: Policy) -> Policy:
    """The policy with population-based training's perturbations bounded by each swept field's range (the
    built-in algorithms' table, src/fragc/algos/validation.py), unless given."""
    if policy.pbt is None or policy.pbt.bounds:
        return policy
    bounds = tuple((f, float(RANGES[f].low), float(RANGES[f].high)) for f, _ in policy.hyperparameters
                   if f in RANGES)
    return dataclasses.replace(policy, pbt=dataclasses.replace(policy.pbt, bounds=bounds))


def trace_for(algo: Any, policy: Policy) -> Any:
    """`algo` traced, as a `SweptAlgorithm` when the policy's population varies config fields (src/fragc/ir/sweep.py)."""
    if not policy.hyperparameters:
        return trace(algo)
    grid = tuple((f, tuple(dict.fromkeys(v))) for f, v in policy.hyperparameters)
    check_grid(algo, grid)
    fields = [f for f, _ in grid]
    name = type(algo).__name__.lower()
    try:
        return trace(swept(algo, fields), name)
    except (jax.errors.ConcretizationTypeError, TypeError) as err:
        culprits = [f for f in fields if not _traces(swept(algo, [f]), name)] or fields
        raise explain_shape_field(err, culprits, type(algo).__name__) from None


def _traces(algo: Any, name: str) -> bool:
    try:
        trace(algo, name)
        return True
    except (jax.errors.ConcretizationTypeError, TypeError):
        return False
    except FragcError:
        return True  # traced as far as the sweep goes: a swept value did not break it


def carrier(transfers: str, devices: Sequence[Any], hosted: bool = False) -> str:
    """The carrier of the transfers `insert_transfers` inserts: `auto` is `device_put` within one
    process and `collective` across processes (JAX cannot `device_put` to another process). With host
    environments (`hosted`) `auto` is `device_put` across processes too: a host loop runs from each process
    in a staged schedule, and each transfer moves each process's own shards (`move_within_processes`)."""
    if transfers not in TRANSFERS:
        raise FragcError(f"transfers must be one of {', '.join(TRANSFERS)}, got {transfers!r}")
    across = spans_processes(devices)
    if transfers == "device_put" and across and not hosted:
        raise FragcError("transfers='device_put' cannot cross processes; use 'collective' or 'auto'")
    if transfers == "auto":
        return "collective" if across and not hosted else "device_put"
    return transfers


def _check_arguments(devices: Any, mesh: Any, iterations_per_dispatch: Any) -> None:
    """Refuse malformed arguments before anything is traced or compiled (`carrier` checks `transfers`)."""
    is_count = lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 1  # noqa: E731
    if devices is not None and not is_count(devices):
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or not devices or not all(
                isinstance(d, jax.Device) for d in devices):
            raise FragcError(f"compile: devices must be a positive int or a list of jax devices, got {devices!r}")
        if len(set(devices)) != len(devices):
            raise FragcError("compile: devices lists a device twice")
    if mesh is not None and not isinstance(mesh, Mesh):
        raise FragcError(f"compile: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not is_count(iterations_per_dispatch):
        raise FragcError(f"compile: iterations_per_dispatch must be a positive int, got {iterations_per_dispatch!r}")


def _local_copy_if_it_fits(devs: list, policy: Policy) -> list:
    """In a multi-process run, a policy whose devices all lie on one process runs as a copy on each
    process's own devices (every process must take part in every program, and computes the same)."""
    used = devs[: policy.num_devices]
    if jax.process_count() == 1 or len({d.process_index for d in used}) > 1:
        return devs
    return jax.local_devices()[: len(devs)]


def default_device_count(policy: Any) -> int:
    """`single` and populations of it default to one device, other policies to all there are."""
    if isinstance(policy, Policy):
        return policy.num_devices
    if policy == "single" or (isinstance(policy, Population) and policy.base == "single"):
        return 1
    if isinstance(policy, str) and policy.startswith("population(single"):
        return 1
    return len(jax.devices())
