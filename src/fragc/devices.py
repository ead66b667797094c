"""Choosing devices, simulating CPU devices when the machine has fewer."""

from __future__ import annotations

import jax

from fragc.ir.errors import FragcError
from fragc.runtime import cpu_threads


MAX_SIMULATED_CPU_DEVICES = 1024
"""JAX's start-up time grows about quadratically in simulated CPU devices (1024: 1 s, 8192: 33 s,
32768: over 5 minutes, measured on 2 cores): more than this is refused rather than left to hang."""


def simulate_cpu_devices(n: int) -> None:
    """Ask for `n` CPU devices; only possible before JAX's backend starts. Counts above
    `MAX_SIMULATED_CPU_DEVICES` are not simulated (`devices(n)` then says why)."""
    if n > MAX_SIMULATED_CPU_DEVICES:
        return
    try:
        jax.config.update("jax_num_cpu_devices", int(n))
    except RuntimeError:
        return  # the backend has started; `devices()` reports what exists
    if n > 1:
        cpu_threads.several_devices_asked()  # several devices share XLA's threads: not fragc's one


def per_process_devices(n: int) -> list[jax.Device]:
    """The first `n` devices of every process, in `jax.devices()` order: what `--devices n` means
    in a multi-process run (simulated CPU devices are made `n` per process before JAX starts)."""
    local = jax.local_devices()
    if len(local) < n:
        raise FragcError(f"--devices {n}: process {jax.process_index()} has only {len(local)} devices")
    taken: dict[int, int] = {}
    out = []
    for d in jax.devices():
        if taken.get(d.process_index, 0) < n:
            out.append(d)
            taken[d.process_index] = taken.get(d.process_index, 0) + 1
    return out


def devices(n: int | None = None) -> list[jax.Device]:
    """The first `n` devices (all when `None`), simulating CPU devices if needed."""
    if n is None:
        return _started(jax.devices())
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise FragcError(f"devices must be a positive int, got {n!r}")
    if n > 1:
        simulate_cpu_devices(n)
    available = _started(jax.devices())
    if len(available) < n and n > MAX_SIMULATED_CPU_DEVICES:
        raise FragcError(f"{n} devices were asked for but only {len(available)} exist, and fragc simulates at most "
                         f"{MAX_SIMULATED_CPU_DEVICES} CPU devices")
    if len(available) < n:
        raise FragcError(
            f"{n} devices were asked for but only {len(available)} exist, and JAX has already started. "
            f"Simulate CPU devices by setting JAX_NUM_CPU_DEVICES={n} in the environment (or calling "
            f"jax.config.update('jax_num_cpu_devices', {n})) before the first JAX operation."
        )
    return available[:n]


def _started(available: list[jax.Device]) -> list[jax.Device]:
    """`available`, once JAX has started: said once where its CPU devices share fragc's one thread."""
    cpu = [d for d in available if d.platform == "cpu"]
    cpu_threads.warn_if_devices_share_one_thread(len(cpu))
    return available
