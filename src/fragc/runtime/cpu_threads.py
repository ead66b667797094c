"""How many threads XLA's CPU runtime runs a program on: one, or one per usable core (XLA's default), decided per
processor before JAX starts its CPU backend.

XLA's CPU client runs a program's operations (thunks) on a pool of threads and runs independent ones at once. An RL
training iteration on a few environments is thousands of small thunks in loops, and handing them between threads can
cost more than it saves: on the 2-core Xeon of docs/benchmarks.md, 32 of fragc's PPO iterations at PureJaxRL's
configuration take 0.098 s on one thread and 0.114 s on two, and fragc's straight threefry
(src/fragc/runtime/cpu_lowering.py), which two threads make slower, is on with one. Much larger batches (a population
of 256 members there) can run faster on XLA's default.

The pool's size is read once, when JAX creates its CPU backend, from the environment variable `PJRT_NPROC` (XLA's
`DefaultThreadPoolSize`, which also reads `NPROC`). So fragc decides it at `import fragc` (`configure`), in order:
- `PJRT_NPROC` or `NPROC` set: the user's.
- `FRAGC_CPU_THREADS=N` sets it to N; `FRAGC_CPU_THREADS=xla` keeps XLA's default (any other value: one line on
  stderr, and XLA's default).
- several CPU devices (`JAX_NUM_CPU_DEVICES`, `jax_num_cpu_devices`, `--xla_force_host_platform_device_count`):
  XLA's default, since the devices' programs share the pool. Where fragc itself simulates several CPU devices
  later (`--devices N`, `fragc.compile(..., devices=N)`), it takes its choice of one thread back first
  (`several_devices_asked`).
- else the choice measured on this processor, kept in the user's cache folder per processor model, usable cores
  and JAX version (`choices_path()`). Not measured yet: `measure_if_undecided` (called where fragc's compiler is
  imported) measures it, once per machine, in two fresh processes alternating rounds of fragc's PPO iteration;
  where JAX's CPU backend has started by then, the choice applies from the next process.

One thread is chosen only where it measures faster in wall time (`MARGIN`) and no slower in CPU time. Where a GPU or
TPU plugin is installed (and `JAX_PLATFORMS` does not name the CPU first), nothing is measured or set: the CPU then
runs little of the program. This module imports no JAX: `fragc --help` stays fast.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import statistics
import subprocess
import sys
from typing import Any, Callable

from .user_cache import read_json, user_cache_folder, write_json

VARIABLE = "FRAGC_CPU_THREADS"
XLA_VARIABLES = ("PJRT_NPROC", "NPROC")
"""What XLA's CPU client reads for its thread pool's size, in this order."""
ROUNDS = 7
MARGIN = 0.95
"""One thread is chosen where its median wall time is under this fraction of XLA's default, its CPU time no more."""
PROTOCOL = "fragc-threads:"
"""The prefix of a measuring child's lines on stdout (other output, such as a library's warnings, is skipped)."""


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def processor_model() -> str:
    """The processor's model name (`/proc/cpuinfo`), else the platform's word for it."""
    import platform

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return model


def threads() -> int:
    """The threads XLA's CPU client of this process runs on: `PJRT_NPROC` or `NPROC` where set, else one per usable
    core. (Read from the environment: it tells the truth where nothing changes it after JAX's backend starts.)"""
    for variable in XLA_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value) or usable_cores()
    return usable_cores()


def choices_path() -> str:
    return os.path.join(user_cache_folder(), "cpu_threads.json")


def key() -> str:
    """What a choice is kept under: processor model, usable cores, JAX's version."""
    try:
        version = importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return f"{processor_model()} | {usable_cores()} cores | jax {version}"


def several_cpu_devices() -> bool:
    """Whether this process asks JAX for more than one CPU device."""
    counts = [os.environ.get("JAX_NUM_CPU_DEVICES", "")]
    counts += re.findall(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    if "jax" in sys.modules:
        counts.append(str(getattr(sys.modules["jax"].config, "jax_num_cpu_devices", "")))
    return any(c.lstrip("-").isdigit() and int(c) > 1 for c in counts)


def accelerator_installed() -> bool:
    """Whether JAX may start on another backend than the CPU: a plugin installed and `JAX_PLATFORMS` not naming the
    CPU first."""
    if os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip() == "cpu":
        return False
    plugins = importlib.metadata.entry_points(group="jax_plugins")
    return bool(plugins) or any(importlib.util.find_spec(m) is not None for m in ("jax_plugins", "libtpu"))


def decided_by_environment() -> str | None:
    """Why the environment decides, or None where fragc's measured choice does."""
    if any(v in os.environ for v in XLA_VARIABLES):
        return "the user's " + next(v for v in XLA_VARIABLES if v in os.environ)
    value = os.environ.get(VARIABLE, "auto")
    if value != "auto":  # a bad value included: XLA's default (`bad_value`)
        return f"{VARIABLE}={value}"
    if several_cpu_devices():
        return "several CPU devices"
    if accelerator_installed():
        return "an accelerator's plugin"
    return None


def bad_value() -> str | None:
    """What is wrong with `FRAGC_CPU_THREADS`, or None."""
    value = os.environ.get(VARIABLE, "auto")
    if value in ("auto", "xla") or (value.isdigit() and int(value) > 0):
        return None
    return f"{VARIABLE}={value!r}: expected auto, xla or a number of threads"


def configure() -> None:
    """At `import fragc`, before JAX's CPU backend starts: set XLA's CPU threads for this process where
    `FRAGC_CPU_THREADS` or the kept choice says so (see the module)."""
    if (bad := bad_value()) is not None:  # said in one line: an import cannot exit as the CLI does
        print(f"fragc: {bad}; XLA's default threads", file=sys.stderr)
    if decided_by_environment() is not None:
        value = os.environ.get(VARIABLE, "")
        if bad is None and value.isdigit() and not any(v in os.environ for v in XLA_VARIABLES):  # the user's first
            os.environ["PJRT_NPROC"] = value
        return
    kept = (read_json(choices_path()) or {}).get(key())
    if kept and kept.get("threads") == 1 and not backend_started():
        _one_thread()


_chose_one_thread = False  # whether fragc set PJRT_NPROC in this process (and may take it back)


def _one_thread() -> None:
    global _chose_one_thread
    os.environ["PJRT_NPROC"] = "1"
    _chose_one_thread = True


def several_devices_asked() -> None:
    """Called where fragc asks JAX for several CPU devices before its backend starts (`fragc.devices`): their
    programs share XLA's pool, so fragc's choice of one thread is taken back (a user's `PJRT_NPROC` stays)."""
    global _chose_one_thread
    if _chose_one_thread and not backend_started():
        os.environ.pop("PJRT_NPROC", None)
        _chose_one_thread = False


def warn_if_devices_share_one_thread(cpu_devices: int) -> None:
    """Warn once where fragc chose one thread and JAX started with several CPU devices anyway (a user's
    `jax_num_cpu_devices` set after `import fragc`): their programs then take turns on it."""
    global _chose_one_thread
    if _chose_one_thread and cpu_devices > 1:
        import warnings

        warnings.warn(f"fragc chose one XLA CPU thread at import, and JAX then started {cpu_devices} CPU devices, which "
                      "take turns on it: set jax_num_cpu_devices before importing fragc, or FRAGC_CPU_THREADS=xla",
                      stacklevel=3)
        _chose_one_thread = False  # said once


def backend_started() -> bool:
    """Whether JAX has created its backends in this process (after which the pool's size is fixed)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def measure_if_undecided(child: list[str]) -> None:
    """Measure the choice where nothing decides it yet (see the module), keep it, and apply it to this process if
    JAX's backend has not started. `child`: the command of a measuring child (src/fragc/lowering_workloads.py's
    `CHILD`). Processes starting together (`fragc launch`) measure once: the others wait on a lock for the choice.
    Where the cache folder cannot be written, nothing is measured (it would be again in every process): XLA's
    default, said in one line."""
    if decided_by_environment() is not None:
        return
    path = choices_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = open(path + ".lock", "a")
    except OSError as err:
        print(f"fragc: cannot keep XLA's CPU threads' choice in {path} ({err.strerror}): XLA's default threads "
              f"({VARIABLE}=N decides without measuring)", file=sys.stderr)
        return
    with lock:
        _exclusive(lock)
        kept = read_json(path) or {}
        if key() not in kept:
            print(f"fragc: timing XLA's CPU threads on this processor (once, about a minute; kept in {path})",
                  file=sys.stderr)
            kept[key()] = measure(child)
            write_json(path, kept)
    if kept[key()]["threads"] == 1 and not _chose_one_thread:
        if backend_started():
            print("fragc: JAX's CPU backend had started: one thread applies from the next process", file=sys.stderr)
        else:
            _one_thread()


def _exclusive(lock: Any) -> None:
    """Hold `lock` (an open file) alone until it is closed; where the platform has no `fcntl`, nothing."""
    try:
        import fcntl
    except ImportError:
        return
    fcntl.flock(lock, fcntl.LOCK_EX)


def measure(child: list[str], rounds: int = ROUNDS) -> dict:
    """Two children, one on one thread and one on XLA's default, each compiling the workload (and deciding its CPU
    lowering rules) in turn, then running rounds alternately (A B A B ...); -> {"threads": 1 or 0 (XLA's default),
    and the medians}."""
    sides = {"one": {"PJRT_NPROC": "1"}, "xla": {VARIABLE: "xla"}}
    procs = {}
    try:
        for side, extra in sides.items():  # one at a time: each times its lowering rules without the other running
            env = {k: v for k, v in os.environ.items() if k not in XLA_VARIABLES and k != VARIABLE}
            procs[side] = subprocess.Popen(child, env={**env, "JAX_PLATFORMS": "cpu", **extra}, text=True,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            _reply(procs[side])
        times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
        for _ in range(rounds):
            for side, proc in procs.items():
                proc.stdin.write("run\n")
                proc.stdin.flush()
                wall, cpu = map(float, _reply(proc).split())
                times[side].append((wall, cpu))
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    medians = {f"{side}_{what}_s": statistics.median(t[i] for t in times[side])
               for side in sides for i, what in enumerate(("wall", "cpu"))}
    one = medians["one_wall_s"] < MARGIN * medians["xla_wall_s"] and medians["one_cpu_s"] <= medians["xla_cpu_s"]
    return {"threads": 1 if one else 0, **medians}


def _reply(proc: subprocess.Popen) -> str:
    """The child's next protocol line's text; a child that ended without one is an error."""
    for line in proc.stdout:
        if line.startswith(PROTOCOL):
            return line[len(PROTOCOL):].strip()
    raise RuntimeError(f"fragc: the CPU threads' measuring child ended (exit {proc.wait()}) without answering")


def serve(run: Callable[[], None]) -> None:
    """A measuring child's loop: say ready, then run the workload once per "run" line on stdin and answer its wall
    and CPU seconds."""
    import time

    run()
    print(PROTOCOL, "ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            continue
        start, start_cpu = time.perf_counter(), time.process_time()
        run()
        print(PROTOCOL, time.perf_counter() - start, time.process_time() - start_cpu, flush=True)
