"""`fragc launch -n N -- COMMAND ...`: N local processes of one multi-process run.

For trying multi-host behaviour on one machine, and for tests. Each process
gets the coordinator's address (loopback, a free port), the process count and
its id in `FRAGC_COORDINATOR`, `FRAGC_NUM_PROCESSES` and `FRAGC_PROCESS_ID`,
which `fragc run` and `fragc bench` read as the defaults of `--coordinator`,
`--num-processes` and `--process-id`; it runs on the CPU with its own simulated
devices (`--devices` counts each process's devices). Output is forwarded line
by line: stderr with a `[i]` prefix, stdout as it is (as `mpirun` does without
`--tag-output`), so that a `fragc run --json` result can be piped on (in a
fragc run only process 0 writes to stdout). The launcher exits with the first non-zero exit
code; when one process fails, the others get `grace_s` to stop by themselves
(their watchdog names the lost process) before they are killed. Ctrl-C,
SIGTERM and SIGHUP are passed on to every process, which is killed if it has
not stopped 10 s later; no process outlives the launcher. Even a launcher
killed with SIGKILL takes its processes with it: each inherits the read end of
a pipe whose write end only the launcher holds (`FRAGC_LAUNCHER_FD`), and a
fragc process exits when that pipe closes (`fragc.distributed`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Sequence

from fragc.ir.errors import FragcError

ENV_COORDINATOR = "FRAGC_COORDINATOR"
ENV_NUM_PROCESSES = "FRAGC_NUM_PROCESSES"
ENV_PROCESS_ID = "FRAGC_PROCESS_ID"
"""What each launched process reads as the defaults of `--coordinator`, `--num-processes`, `--process-id`."""
ENV_JOIN_TIMEOUT_S = "FRAGC_JOIN_TIMEOUT_S"
"""The default of `--join-timeout`: seconds to wait for every process to join (src/fragc/distributed.py)."""
ENV_LAUNCHER_FD = "FRAGC_LAUNCHER_FD"
"""A pipe from `fragc launch`; it reads end-of-file when the launcher is gone (`fragc.distributed`)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(n: int, command: Sequence[str], grace_s: float = 90.0) -> int:
    """Run `command` as processes 0..n-1 of one run; the first non-zero exit code, or 0."""
    if n < 1:
        raise FragcError(f"launch: -n must be at least 1, got {n}")
    if not command:
        raise FragcError("launch: give the command after --, e.g. fragc launch -n 2 -- fragc run ppo ...")
    address = f"127.0.0.1:{free_port()}"
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    lifeline, keeper = os.pipe()  # the children read `lifeline`; `keeper`, not inherited, holds it open
    try:
        for i in range(n):
            env = {**os.environ, ENV_COORDINATOR: address, ENV_NUM_PROCESSES: str(n), ENV_PROCESS_ID: str(i),
                   ENV_LAUNCHER_FD: str(lifeline), "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
            try:
                proc = subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True, pass_fds=(lifeline,))
            except OSError as err:
                raise FragcError(f"launch: cannot start {command[0]!r}: {err.strerror}") from err
            procs.append(proc)
            for stream, out, prefix in ((proc.stdout, sys.stdout, ""), (proc.stderr, sys.stderr, f"[{i}] ")):
                pumps.append(threading.Thread(target=_pump, args=(stream, out, prefix), daemon=True))
                pumps[-1].start()
        os.close(lifeline)
        lifeline = -1
        print(f"fragc launch: {n} processes, coordinator {address}, pids "
              + " ".join(str(p.pid) for p in procs), file=sys.stderr, flush=True)
        return _wait(procs, grace_s)
    except (KeyboardInterrupt, _Stop) as stop:
        sig = stop.signum if isinstance(stop, _Stop) else signal.SIGINT
        print(f"fragc launch: {signal.Signals(sig).name}, stopping the processes", file=sys.stderr, flush=True)
        _stop(procs, sig)
        return 128 + sig
    finally:
        if lifeline >= 0:
            os.close(lifeline)
        _stop(procs, signal.SIGKILL)  # nothing outlives the launcher
        os.close(keeper)
        for t in pumps:
            t.join(5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def _stop(procs: list[subprocess.Popen], sig: int, wait_s: float = 10.0) -> None:
    """Send `sig` to every process still running (and its children), then SIGKILL what is left
    after `wait_s`, and reap them all."""
    _signal(procs, sig)
    deadline = time.monotonic() + wait_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


def _wait(procs: list[subprocess.Popen], grace_s: float) -> int:
    first_failure, failed_at, reported = 0, None, set()
    while True:
        running = [p.poll() is None for p in procs]
        for i, p in enumerate(procs):
            if p.returncode not in (None, 0) and i not in reported:
                reported.add(i)
                why = _COORDINATOR_GONE if i > 0 and p.returncode == -signal.SIGABRT and procs[0].poll() else ""
                print(f"fragc launch: process {i} exited with {_describe(p.returncode)}{why}", file=sys.stderr,
                      flush=True)
                if failed_at is None:
                    first_failure, failed_at = _code(p.returncode), time.monotonic()
        if not any(running):
            return first_failure
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            alive = [i for i, r in enumerate(running) if r]
            print(f"fragc launch: killing process(es) {alive}, still running {grace_s:.0f} s after a failure",
                  file=sys.stderr, flush=True)
            _signal(procs, signal.SIGKILL)
        time.sleep(0.1)


_COORDINATOR_GONE = (": JAX ends every process at once ('Terminating process because the JAX distributed service "
                     "detected fatal errors') when process 0, which hosts its coordination service, is gone")


def _code(returncode: int) -> int:
    return returncode if returncode > 0 else 128 - returncode  # killed by signal s -> 128 + s


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"code {returncode}"


def _signal(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass


def _pump(stream: IO[bytes], out: IO[str], prefix: str) -> None:
    for raw in iter(stream.readline, b""):
        out.write(prefix + raw.decode(errors="replace").rstrip("\n") + "\n")
        out.flush()
    stream.close()
