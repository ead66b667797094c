"""Multi-process runs on `jax.distributed`: joining, a start-up check, and a watchdog.

fragc adds no runtime of its own across processes: `initialize` calls
`jax.distributed.initialize`, every process then compiles the same programs
over one global mesh, and values cross processes inside those programs.
What fragc adds is what a user needs around it:

- `check_same(config)`: processes started with different configurations are
  refused at start-up, naming the option that differs;
- a watchdog: every process writes a heartbeat to the coordination service's
  key-value store each second and watches the others'. When one stops (killed,
  crashed) the others exit with an error naming it, instead of waiting in a
  collective that will never complete. JAX's own heartbeat is the backstop: it
  aborts the survivors, less readably, after `JAX_HEARTBEAT_S`;
- process 0 hosts JAX's coordination service: when it dies, JAX ends the
  others at once with its own fatal log. JAX 0.10's client takes a
  `missed_heartbeat_callback` that could say it first, but calling it aborts
  with `std::bad_cast` (its status argument has no Python conversion), so
  fragc leaves JAX's message and `fragc launch` names process 0 first;
- a process started by `fragc launch` exits when the launcher is gone, even
  killed with SIGKILL (`_watch_launcher`);
- SIGTERM is left to the program: JAX's preemption service, which would take
  it over, is off (fragc does not use its sync points).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any

import jax
from jax._src import distributed as coordination  # the coordination service's key-value store has no public name

from fragc.devices import simulate_cpu_devices
from fragc.ir.errors import FragcError
from fragc.launch import ENV_LAUNCHER_FD, ENV_PROCESS_ID

ENV_LOST_AFTER_S = "FRAGC_LOST_AFTER_S"
"""Overrides `LOST_AFTER_S` (tests use a few seconds)."""

LOST_AFTER_S = 20.0
"""A process whose heartbeat has not changed for this long is taken as lost (default)."""
JAX_HEARTBEAT_S = 45
"""jax.distributed's own heartbeat timeout, after which it aborts the survivors."""
EXIT_LOST = 3
"""Exit code of a process that stops because another one was lost."""
EXIT_NOT_JOINED = 4
"""Exit code of a process whose run did not start: not every process joined within the timeout."""
JOIN_MARGIN_S = 30
"""JAX's own join deadline is this much later than fragc's, which stops the process with one line first."""
PEER_ERROR_GRACE_S = 5.0
"""How long a process whose peer reported an error keeps going before it stops for it: an error every process
hits (a bad option) reaches a slower process a moment later, and each should report it as its own."""


_watchdog: "_Watchdog | None" = None


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_devices: int | None = None, timeout_s: int = 60,
               watchdog: bool = True) -> None:
    """Join a multi-process run; call it in every process before anything else uses JAX.

    coordinator_address, num_processes, process_id: as `jax.distributed.initialize`
      takes them ("host:port" of process 0); leave them out on a cluster JAX
      detects (SLURM, Open MPI, Cloud TPU), where it reads them itself.
    local_devices: simulate this many CPU devices in this process.
    timeout_s: how long to wait for every process to join; then this process
      stops with one line naming who did not join (exit code 4).
    watchdog: stop this process, naming the lost one, when another stops.
    """
    _watch_launcher()
    if local_devices is not None and local_devices > 1:
        simulate_cpu_devices(local_devices)
    if num_processes is not None and (process_id is None or not 0 <= process_id < num_processes):
        raise FragcError(f"process id must be between 0 and {num_processes - 1}, got {process_id}")
    if coordinator_address:
        _check_address(coordinator_address)
        if process_id:
            _wait_for_coordinator(coordinator_address, timeout_s)
    jax.config.update("jax_enable_preemption_service", False)  # it would swallow SIGTERM
    joined = _watch_join(coordinator_address, num_processes, process_id, timeout_s)
    try:
        jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                   initialization_timeout=timeout_s + JOIN_MARGIN_S,
                                   heartbeat_timeout_seconds=JAX_HEARTBEAT_S)
    except Exception as err:  # noqa: BLE001 - JAX raises RuntimeError or XlaRuntimeError here
        where = coordinator_address or "the address JAX detects"
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise FragcError(f"could not join the run at {where} within {timeout_s} s "
                         f"(are all {num_processes or ''} processes started?): {first}") from err
    finally:
        joined.set()
    if watchdog and jax.process_count() > 1:
        start_watchdog(lost_after_s())


def _watch_join(address: str | None, num_processes: int | None, process_id: int | None,
                timeout_s: float) -> threading.Event:
    """Stop this process with one line, naming who did not join, when the run has not started after
    `timeout_s`: JAX itself aborts with a C++ stack trace (`Check failure`, exit code 134) after its own
    deadline, which `initialize` sets `JOIN_MARGIN_S` later so that this line comes first. (JAX releases
    the GIL while it waits, so the watching thread runs.)"""
    joined = threading.Event()

    def watch() -> None:
        if not joined.wait(timeout_s):
            say_and_exit(f"fragc: error: {not_joined(address, num_processes, process_id, timeout_s)}", EXIT_NOT_JOINED)

    threading.Thread(target=watch, name="fragc-join-watch", daemon=True).start()
    return joined


def not_joined(address: str | None, num_processes: int | None, process_id: int | None, timeout_s: float) -> str:
    """Who is missing, as far as this process can tell: JAX's coordination service does not say which
    processes registered, so process 0 names the others it waited for."""
    where = address or "the address JAX detects"
    me = "this process" if process_id is None else f"process {process_id}"
    if num_processes == 2 and process_id is not None:
        missing = f"process {1 - process_id} did not join"
    elif num_processes:
        missing = f"not all of processes 0..{num_processes - 1} joined"
    else:
        missing = "not every process joined"
    return (f"{me} waited {timeout_s:.0f} s at {where} and {missing} (start every process with the same "
            f"--coordinator and --num-processes {num_processes or 'N'}, or wait longer with --join-timeout S)")


def lost_after_s() -> float:
    """How long a silent process may stay silent: `FRAGC_LOST_AFTER_S`, else `LOST_AFTER_S`."""
    value = os.environ.get(ENV_LOST_AFTER_S)
    try:
        return float(value) if value else LOST_AFTER_S
    except ValueError:
        raise FragcError(f"{ENV_LOST_AFTER_S} must be a number of seconds, got {value!r}") from None


def _watch_launcher() -> None:
    """Under `fragc launch`, exit when the launcher is gone: nothing else would stop this process
    if the launcher was killed with SIGKILL."""
    fd = os.environ.get(ENV_LAUNCHER_FD)
    if not fd or not fd.isdigit():
        return

    def watch() -> None:
        try:
            while os.read(int(fd), 1):
                pass
        except OSError:  # not the launcher's pipe (an inherited environment): nothing to watch
            return
        say_and_exit(f"fragc: error: the launcher is gone; process {os.environ.get(ENV_PROCESS_ID, '?')} "
                     "is stopping")

    threading.Thread(target=watch, name="fragc-launcher-watch", daemon=True).start()


def say_and_exit(line: str, code: int = EXIT_LOST) -> None:
    """Exit at once with `code` (from any thread), after `line` on stderr."""
    try:
        sys.stdout.flush()
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    finally:
        os._exit(code)


def keep_native_output_off_stdout() -> None:
    """Send what native code writes to stdout (gloo's `[Gloo] Rank 0 is connected to ...`) to stderr,
    and keep Python's `sys.stdout` on the real stdout, so that `--json` output stays parseable."""
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(real_stdout, "w", buffering=1, encoding=sys.stdout.encoding, errors=sys.stdout.errors)


def _wait_for_coordinator(address: str, timeout_s: float) -> None:
    """Refuse clearly when process 0 cannot be reached: JAX would abort this process after its
    timeout with a C++ stack trace."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
                return
        except OSError as err:
            if time.monotonic() > deadline:
                raise FragcError(f"cannot reach the coordinator {address} (process 0) within {timeout_s:.0f} s: "
                                 f"{err.strerror or err}") from err
            time.sleep(0.5)


def _check_address(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise FragcError(f"the coordinator address must be HOST:PORT, got {address!r}")


def is_multiprocess() -> bool:
    return jax.process_count() > 1


def _client() -> Any:
    if coordination.global_state.client is None:
        raise FragcError("fragc.distributed.initialize has not been called")
    return coordination.global_state.client


def check_same(config: dict[str, Any], timeout_s: float = 60.0) -> None:
    """Refuse to go on unless every process passed the same `config` (JSON-able)."""
    me, n = jax.process_index(), jax.process_count()
    if n == 1:
        return
    client = _client()
    mine = json.dumps(config, sort_keys=True, default=str)
    client.key_value_set(f"src/fragc/config/{me}", mine)
    for other in range(n):
        if other == me:
            continue
        try:
            theirs = client.blocking_key_value_get(f"src/fragc/config/{other}", int(timeout_s * 1000))
        except Exception as err:  # noqa: BLE001
            raise FragcError(f"process {other} did not report its configuration within {timeout_s:.0f} s") from err
        if theirs != mine:
            raise FragcError(f"process {other} was started with a different configuration: "
                             f"{describe_difference(config, json.loads(theirs), other)}; every process must run "
                             "the same command (only the process id differs)")


def describe_difference(mine: dict, theirs: dict, other: int) -> str:
    keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    return ", ".join(f"{k} is {_shown(mine.get(k))} here and {_shown(theirs.get(k))} on process {other}" for k in keys)


def _shown(value: Any) -> str:
    return "not given" if value is None else repr(value)


def finish() -> None:
    """Leave the run: tell the watchdogs this process is done, then shut JAX's runtime down."""
    if not is_multiprocess():
        return
    if _watchdog is not None:
        _watchdog.finish()
    jax.distributed.shutdown()


def fail(message: str) -> None:
    """Tell the other processes why this one is stopping, so their watchdogs say it; give them time
    to read it if this process hosts the coordination service (they lose it when it exits)."""
    if _watchdog is None:
        return
    try:
        _watchdog.client.key_value_set(f"src/fragc/failed/{_watchdog.me}", message[:500], allow_overwrite=True)
    except Exception:  # noqa: BLE001 - stopping anyway
        return
    _watchdog.stop()  # this process's own error is the one to report, not the others'
    if jax.process_index() == 0:  # the others' grace, and a beat to read the message in
        deadline = time.monotonic() + PEER_ERROR_GRACE_S + 2 * _watchdog.interval_s
        while time.monotonic() < deadline and not _watchdog.others_stopped():
            time.sleep(0.05)


def start_watchdog(lost_after_s: float = LOST_AFTER_S, interval_s: float = 1.0) -> None:
    global _watchdog
    if _watchdog is None:
        _watchdog = _Watchdog(lost_after_s, interval_s)
        _watchdog.start()


def wait_for_verdict(seconds: float) -> None:
    """After a failure in a collective: give the watchdog time to name a lost process (it exits)."""
    if _watchdog is not None:
        _watchdog.join(seconds)


class _Watchdog(threading.Thread):
    def __init__(self, lost_after_s: float, interval_s: float):
        super().__init__(name="fragc-watchdog", daemon=True)
        self.me, self.n = jax.process_index(), jax.process_count()
        self.lost_after_s, self.interval_s = lost_after_s, interval_s
        self.client = _client()
        self._done = threading.Event()

    def finish(self) -> None:
        try:
            self.client.key_value_set(f"src/fragc/done/{self.me}", "1", allow_overwrite=True)
        except Exception:  # noqa: BLE001 - the run is over either way
            pass
        self.stop()

    def stop(self) -> None:
        self._done.set()

    def run(self) -> None:
        started = time.monotonic()
        seen = {q: ("", started) for q in range(self.n) if q != self.me}
        failed_since: dict[int, float] = {}
        beat = 0
        while not self._done.wait(self.interval_s):
            beat += 1
            try:
                self.client.key_value_set(f"src/fragc/beat/{self.me}", str(beat), allow_overwrite=True)
            except Exception as err:  # noqa: BLE001
                self._lost(0, f"the coordinator on process 0 cannot be reached: {str(err).splitlines()[0][:120]}")
            now = time.monotonic()
            for q, (value, since) in list(seen.items()):
                if failed := self._get(f"src/fragc/failed/{q}"):
                    if now - failed_since.setdefault(q, now) >= PEER_ERROR_GRACE_S:  # this one did not hit it
                        self._lost(q, f"it stopped with: {failed}")
                    continue
                current = self._get(f"src/fragc/beat/{q}")
                if current != value:
                    seen[q] = (current, now)
                elif self._get(f"src/fragc/done/{q}") == "1":
                    del seen[q]
                elif now - since > self.lost_after_s:
                    what = "never sent a heartbeat" if not value else f"sent no heartbeat for {now - since:.0f} s"
                    self._lost(q, what)

    def others_stopped(self) -> bool:
        """Whether every other process has failed too or finished: none of them waits for a message from this
        one (an error every process hits: each reports its own, and process 0 need not wait 3 s for nobody)."""
        return all(self._get(f"src/fragc/failed/{q}") or self._get(f"src/fragc/done/{q}") == "1"
                   for q in range(self.n) if q != self.me)

    def _get(self, key: str) -> str:
        try:
            return self.client.key_value_try_get(key)
        except Exception as err:  # noqa: BLE001
            if "NOT_FOUND" in str(err) or "not found" in str(err).lower():
                return ""
            if self._done.is_set():
                return "1"
            self._lost(0, f"the coordinator on process 0 cannot be reached: {str(err).splitlines()[0][:120]}")
            return ""

    def _lost(self, process: int, why: str) -> None:
        if not self._done.is_set():
            say_and_exit(f"fragc: error: lost process {process} of {self.n} ({why}); process {self.me} is stopping")
