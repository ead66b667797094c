"""`fragc.compile`: trace -> passes -> lower -> compile."""

from __future__ import annotations

from typing import Any, Callable

from jax.sharding import Mesh

from fragc.devices import devices as choose_devices
from fragc.ir.errors import FragcError
from fragc.ir.frontend import trace
from fragc.passes import Canonicalize, Loop, Place, Policy, resolve, run_pipeline
from fragc.runtime.program import Program


def compile(
    algo: Any,
    policy: str | Policy = "single",
    devices: int | None = None,
    mesh: Mesh | None = None,
    iterations_per_dispatch: int = 16,
    print_after_all: bool = False,
    dump_dir: str | None = None,
    printer: Callable[[str], None] = print,
) -> Program:
    """Compile `algo` under `policy` on `devices` (a count) or the devices of `mesh`.

    iterations_per_dispatch: how many iterations one dispatch scans, where the
      whole iteration is one stage.
    print_after_all, dump_dir: print the IR after every pass, or write it to
      numbered files (`001_trace.fir`, ...) in `dump_dir`.
    """
    if mesh is not None and devices is not None:
        raise FragcError("compile: pass devices or mesh, not both")
    devs = list(mesh.devices.flat) if mesh is not None else choose_devices(devices if devices is not None else 1)
    resolved = resolve(policy, len(devs))
    if resolved.num_devices > len(devs):
        raise FragcError(
            f"policy '{resolved.name}' uses {resolved.num_devices} devices but the program has {len(devs)}; "
            f"pass devices={resolved.num_devices}"
        )
    passes = [Canonicalize(), Place(resolved), Loop(iterations_per_dispatch)]
    result = run_pipeline(trace(algo), passes, print_after_all=print_after_all, dump_dir=dump_dir, printer=printer)
    return Program(algo, result, devs)
