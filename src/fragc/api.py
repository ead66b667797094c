"""`fragc.compile`: trace -> passes -> lower -> compile, under a placement given or searched.

`compile` takes its options as keyword arguments and makes them one `CompileOptions` (src/fragc/options.py);
`compile_with` takes that value. A placement (a policy's name, a `Policy`, a population) is built by the compiler
(src/fragc/compiler.py); `policy="auto"` is the placement search's (src/fragc/search/), which calls the compiler for each
candidate it times. Imports point one way: this module -> the search -> the compiler.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from jax.sharding import Mesh

from fragc import lowering_workloads
from fragc.compiler import build
from fragc.options import CompileOptions, SearchOptions, search_seeds
from fragc.passes import Policy, Population
from fragc.runtime import cpu_threads
from fragc.runtime.program import Program
from fragc.search import search

lowering_workloads.register()  # the CPU lowering rules are decided on a training iteration, not a micro-program
cpu_threads.measure_if_undecided(lowering_workloads.CHILD)  # once per machine, before JAX's backend starts if it can


def compile(
    algo: Any,
    policy: str | Policy | Population = "single",
    devices: int | Sequence[Any] | None = None,
    mesh: Mesh | None = None,
    iterations_per_dispatch: int | None = None,
    print_after_all: bool = False,
    dump_dir: str | None = None,
    printer: Callable[[str], None] = print,
    transfers: str = "auto",
    env_groups: int | None = None,
    env_workers: int | None = None,
    *,
    env_fleet: str | None = None,
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
      stage by stage (staged). Default: the algorithm's `iterations_per_dispatch`
      where it has one (alphazero's 1 on the CPU), else 16.
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
    env_fleet: step the host environments on remote environment workers, Ray actors (`"ray:N"` or `"ray:NxE"`:
      N workers of E environments each; `",cpus=C"`, `",resource=NAME"` ask Ray for those per worker), with
      the host loop's groups as whole workers; Ray is joined where `ray.init` already ran, at `RAY_ADDRESS`, or
      started locally (docs/distributed.md, "Environment workers on a Ray cluster").

    policy="auto" (or population("auto", S)) searches the placement (src/fragc/search/, docs/auto.md): the
    built-in policies, actor/learner splits, iterations per dispatch (`iterations_per_dispatch` is searched,
    capped by `run_iterations`, the run length) and environment groups (unless `env_groups` is given), ranked
    by a cost model, the best `auto_top` timed within `auto_budget` seconds; `auto_candidates` replaces the
    space (`fragc.search.Candidate`s), `memory_limit` (bytes per device; default: the device's own limit where
    it reports one) prunes what does not fit, `auto_cache=False` ignores the decision cached on disk.
    The result's `prog.auto` is the search's report (`prog.auto.table()`).
    """
    search_options = SearchOptions(budget=auto_budget, top=auto_top, candidates=auto_candidates, cache=auto_cache,
                                   memory_limit=memory_limit, run_iterations=run_iterations, log=auto_log)
    return compile_with(algo, CompileOptions(policy, devices, mesh, iterations_per_dispatch, transfers, env_groups,
                                             env_workers, print_after_all, dump_dir, printer, search_options,
                                             env_fleet))


def compile_with(algo: Any, options: CompileOptions) -> Program:
    """`compile` with its options as one value: the search's program for `policy="auto"`, else the compiler's."""
    if search_seeds(options.policy) is not None:
        return search(algo, options)
    return build(algo, options)
