"""What acts before JAX's backend starts: simulated CPU devices (`--devices N`), and joining a multi-process run
(`--coordinator`, `--num-processes`, `--process-id`; `fragc launch` sets them through the environment)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any, Callable

import jax

from fragc import distributed
from fragc.devices import simulate_cpu_devices
from fragc.ir.errors import FragcError

from .errors import error_exit_code, interrupted
from .options import flag


def simulate_devices_early(count: int) -> None:
    """`--devices N` must reach JAX before anything starts its backend (importing gymnax does, and so may
    importing a user's algorithm)."""
    if count > 1:
        simulate_cpu_devices(count)


def join(args: argparse.Namespace) -> None:
    """Join the multi-process run: before JAX's backend starts, so before an algorithm's module is imported."""
    auto = args.coordinator == "auto"
    if not auto and not (args.coordinator and args.num_processes and args.process_id is not None):
        raise FragcError("a multi-process run needs --coordinator HOST:PORT, --num-processes N and --process-id I "
                         "(or --coordinator auto where jax.distributed detects them, e.g. under SLURM)")
    distributed.initialize(None if auto else args.coordinator, None if auto else args.num_processes,
                           None if auto else args.process_id, local_devices=args.devices,
                           timeout_s=args.join_timeout)
    distributed.keep_native_output_off_stdout()


def check_same_options(args: argparse.Namespace) -> None:
    """Refuse a multi-process run whose processes were given different options."""
    same = {k: v for k, v in sorted(vars(args).items()) if k not in ("process_id", "coordinator", "command_line")}
    distributed.check_same({flag(k): v for k, v in same.items()})


def run_and_leave(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> Any:
    """`run` or `bench` as one process of several, then leave.

    A run that returns, whatever its code, leaves through JAX's shutdown barrier (every process returns alike).
    A failing process exits at once rather than through it, which would wait for processes that may be stuck
    in a collective with it (their watchdogs then name it). A failure in a collective is most likely a lost
    process: the watchdog gets time to name it before the error is shown.
    """
    try:
        code = command(args)
        distributed.finish()  # a code returned (0, or a signal's after a graceful stop) is every process's
        return code
    except FragcError as err:
        print(f"fragc: error: {err}", file=sys.stderr)
        distributed.fail(str(err))
        code = error_exit_code(err)
    except KeyboardInterrupt as stop:
        distributed.fail("interrupted")
        code = interrupted(stop)
    except Exception as err:  # noqa: BLE001
        if isinstance(err, jax.errors.JaxRuntimeError):  # most likely a collective whose peer is gone
            distributed.wait_for_verdict(distributed.lost_after_s() + 5)
        traceback.print_exc()
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        distributed.fail(f"{type(err).__name__}: {first}")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
