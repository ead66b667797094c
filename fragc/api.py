"""`fragc.compile`: trace -> passes -> lower -> compile."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import re
import warnings
from typing import Any, Callable, Sequence

import jax
from jax.sharding import Mesh

from fragc.devices import devices as choose_devices
from fragc.ir.errors import FragcError
from fragc.ir.frontend import check_per_replica, trace
from fragc.ir.sweep import check_grid, explain_shape_field, swept
from fragc.passes import Policy, Population, PipelineResult, default_passes, resolve, run_pipeline
from fragc.runtime.multihost import halves_by_process, spans_processes
from fragc.runtime.program import Program


def compile(
    algo: Any,
    policy: str | Policy | Population = "single",
    devices: int | Sequence[Any] | None = None,
    mesh: Mesh | None = None,
    iterations_per_dispatch: int = 16,
    print_after_all: bool = False,
    dump_dir: str | None = None,
    printer: Callable[[str], None] = print,
    transfers: str = "auto",
    env_groups: int | None = None,
    env_workers: int | None = None,
    *,
    auto_budget: float = 60.0,
    auto_top: int = 3,
    auto_candidates: Sequence[Any] | None = None,
    auto_cache: bool = True,
    memory_limit: int | None | str = "device",
    run_iterations: int | None = None,
    auto_log: Callable[[str], None] | None = None,
) -> Program:
    """Compile `algo` under `policy` on `devices` (a count, or the devices themselves) or the
    devices of `mesh`.

    iterations_per_dispatch: how many iterations one dispatch runs (`prog.k`),
      under every schedule: scanned in one program (fused, spmd) or queued
      stage by stage (staged).
    print_after_all, dump_dir: print the IR after every pass, or write it to
      numbered files (`001_trace.fir`, ...) in `dump_dir`.
    transfers: how a staged iteration moves values between device groups:
      `device_put` between per-group programs (one process only),
      `collective` inside one SPMD program over all groups (any number of
      processes), or `auto`: the first within one process, else the second.
    env_groups: for host environments (docs/host_envs.md), the policy's `env_groups` instead of its own:
      0 steps them inside the compiled program, G >= 1 runs the rollout's time loop from the host with
      each replica's environments in G groups (G >= 2 pipelines inference with host stepping).
    env_workers: the policy's `env_workers` instead of its own: the workers of each host environment pool
      (EnvPool's threads), 0 for the backend's default.

    policy="auto" (or population("auto", S)) searches the placement (fragc/auto.py, docs/auto.md): the
    built-in policies, actor/learner splits, iterations per dispatch (`iterations_per_dispatch` is searched,
    capped by `run_iterations`, the run length) and environment groups (unless `env_groups` is given), ranked
    by a cost model, the best `auto_top` timed within `auto_budget` seconds; `auto_candidates` replaces the
    space (`fragc.auto.Candidate`s), `memory_limit` (bytes per device; default: the device's own limit where
    it reports one) prunes what does not fit, `auto_cache=False` ignores the decision cached on disk.
    The result's `prog.auto` is the search's report (`prog.auto.table()`).
    """
    seeds = _auto_seeds(policy)
    if seeds is not None:
        from fragc.auto import search

        if mesh is not None:
            raise FragcError("compile: policy='auto' takes devices, not a mesh")
        return search(algo, devices, budget=auto_budget, top=auto_top, candidates=auto_candidates,
                      memory_limit=memory_limit, iterations=run_iterations, seeds=seeds, env_groups=env_groups,
                      env_workers=env_workers, transfers=transfers, cache=auto_cache, log=auto_log)
    pipeline, devs, resolved = run_passes(algo, policy, devices, mesh, iterations_per_dispatch, print_after_all,
                                          dump_dir, printer, transfers, env_groups, env_workers)
    # The 2-replica check is Python tracing and XLA compiles without the GIL: trace while XLA compiles, so
    # the check costs no start-up time; its error (the user's mistake) wins over the program. Not for a sweep:
    # its fragment bodies swap the algorithm's config under a lock (ir/sweep.py) while JAX traces them, and two
    # threads holding that lock and JAX's own could wait on each other; one thread cannot.
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


def _auto_seeds(policy: Any) -> int | None:
    """None unless `policy` asks for the search: 0 for "auto", S for population("auto", S)."""
    if isinstance(policy, str) and policy.replace(" ", "") == "auto":
        return 0
    if isinstance(policy, Population) and policy.base == "auto":
        if not isinstance(policy.seeds, int) or policy.seeds < 1:
            raise FragcError("population('auto', S) needs a seed count S >= 1")
        return policy.seeds
    if isinstance(policy, str) and (m := re.fullmatch(r"population\(auto,(\d+)\)", policy.replace(" ", ""))):
        return int(m.group(1))
    return None


def run_passes(
    algo: Any,
    policy: str | Policy | Population = "single",
    devices: int | Sequence[Any] | None = None,
    mesh: Mesh | None = None,
    iterations_per_dispatch: int = 16,
    print_after_all: bool = False,
    dump_dir: str | None = None,
    printer: Callable[[str], None] = print,
    transfers: str = "auto",
    env_groups: int | None = None,
    env_workers: int | None = None,
) -> tuple[PipelineResult, list[Any], Policy]:
    """`compile` without the XLA programs: trace `algo` and run the passes of `policy` ->
    (the module after every pass, the devices, the resolved policy). `fragc ir` prints this."""
    _check_arguments(devices, mesh, iterations_per_dispatch)
    if mesh is not None and devices is not None:
        raise FragcError("compile: pass devices or mesh, not both")
    if devices is None and mesh is None:
        devices = default_device_count(policy)
    if mesh is not None:
        devs = list(mesh.devices.flat)
    elif devices is not None and not isinstance(devices, int):
        devs = list(devices)
    else:
        devs = choose_devices(devices)
    resolved = with_pbt_bounds(resolve(policy, len(devs)))
    if env_groups is not None:
        resolved = dataclasses.replace(resolved, env_groups=env_groups)  # checked by Policy itself
    if env_workers is not None:
        resolved = dataclasses.replace(resolved, env_workers=env_workers)
    if resolved.num_devices > len(devs):
        raise FragcError(
            f"policy '{resolved.name}' uses {resolved.num_devices} devices but the program has {len(devs)}; "
            f"pass devices={resolved.num_devices}"
        )
    devs = _local_copy_if_it_fits(devs, resolved)
    traced = trace_for(algo, resolved)
    hosted = any(f.host_steps for f in traced.fragments.values())
    if hosted and spans_processes(devs[: resolved.num_devices]) and mesh is None:
        devs = halves_by_process(devs)  # Sebulba: every process's actors feed its own learner devices
    passes = default_passes(resolved, iterations_per_dispatch, carrier(transfers, devs, hosted))
    pipeline = run_pipeline(traced, passes, print_after_all=print_after_all, dump_dir=dump_dir, printer=printer)
    return pipeline, devs, resolved


def with_pbt_bounds(policy: Policy) -> Policy:
    """The policy with population-based training's perturbations bounded by each swept field's range (the
    built-in algorithms' table, algos/validation.py), unless given."""
    if policy.pbt is None or policy.pbt.bounds:
        return policy
    from fragc.algos.validation import RANGES

    bounds = tuple((f, float(RANGES[f].low), float(RANGES[f].high)) for f, _ in policy.hyperparameters
                   if f in RANGES)
    return dataclasses.replace(policy, pbt=dataclasses.replace(policy.pbt, bounds=bounds))


def trace_for(algo: Any, policy: Policy) -> Any:
    """`algo` traced, as a `SweptAlgorithm` when the policy's population varies config fields (ir/sweep.py)."""
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


TRANSFERS = ("auto", "device_put", "collective")


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
    import jax

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
    import jax

    used = devs[: policy.num_devices]
    if jax.process_count() == 1 or len({d.process_index for d in used}) > 1:
        return devs
    return jax.local_devices()[: len(devs)]


def default_device_count(policy: Any) -> int:
    """`single` and populations of it default to one device, other policies to all there are."""
    if isinstance(policy, Policy):
        return policy.num_devices
    import jax

    if policy == "single" or (isinstance(policy, Population) and policy.base == "single"):
        return 1
    if isinstance(policy, str) and policy.startswith("population(single"):
        return 1
    return len(jax.devices())
