"""Graceful stops: SIGINT, SIGTERM and SIGHUP end a run at a dispatch boundary, with a checkpoint.

The first signal only asks: the run finishes the dispatch in flight, writes a
checkpoint of the iteration it reached and exits with the conventional code
(128 + the signal's number). A second signal stops at once, as Ctrl-C always
did. In a multi-process run a signal may reach one process only (a
scheduler's SIGTERM to one host, Ctrl-C in one terminal): at each boundary
the processes agree (`GracefulStop.requested`, a small all-gather), so all stop
after the same dispatch and process 0 saves the state that every one holds.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator

import numpy as np

from .actions import Action, Run

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop at once by a signal; `exit_code` is the conventional 128 + its number."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal that stopped a command (a plain KeyboardInterrupt is Ctrl-C's SIGINT)."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within it SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does: until a run's
    `GracefulStop` takes them over, a command stops with one line (and, in a multi-process run,
    tells the others). In the main thread only."""
    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Stopped(Exception):
    """Raised from a run's per-dispatch hook to leave it after a graceful stop."""

    def __init__(self, signum: int, iteration: int):
        super().__init__(f"stopped by {signal.Signals(signum).name} at iteration {iteration}")
        self.signum, self.iteration = signum, iteration

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class GracefulStop:
    """A context that turns the first stop signal into a request (`requested`) and the second
    into KeyboardInterrupt; with `graceful=False` (nothing to save) the first stops at once.
    Outside the main thread, where handlers cannot be set, it does nothing."""

    def __init__(self, graceful: bool = True) -> None:
        self.graceful, self.signum = graceful, 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum or not self.graceful:
            raise Interrupted(signum)
        self.signum = signum
        print(f"fragc: {signal.Signals(signum).name}: stopping after this dispatch with a checkpoint "
              "(send it again to stop at once)", file=sys.stderr, flush=True)

    def requested(self) -> int:
        """The signal that asked this run to stop, 0 if none: in a multi-process run, the first
        one any process got. Every process must call it at the same points (it is a collective)."""
        import jax  # not at the top: the command line imports this module, and `fragc launch` starts without JAX

        if jax.process_count() == 1:
            return self.signum
        from jax.experimental import multihost_utils

        every = np.asarray(multihost_utils.process_allgather(np.asarray([self.signum], np.int32))).ravel()
        asked = every[every != 0]
        return int(asked[0]) if asked.size else 0


class StopOnSignal(Action):
    """A run's graceful stop as a periodic action: during the run the first stop signal asks the run to
    end after the dispatch in flight (`wants_stop`, agreed by every process); `signum` says which."""

    def __init__(self, graceful: bool = True) -> None:
        self.stop, self.signum = GracefulStop(graceful), 0

    def on_start(self, run: Run) -> None:
        self.run = run
        self.stop.__enter__()

    def wants_stop(self) -> bool:
        if not self.stop.graceful:  # nothing to save: the first signal stopped the run at once
            return False
        self.signum = self.run.stopped_by = self.stop.requested()
        return bool(self.signum)

    def on_end(self, run: Run) -> None:
        self.stop.__exit__(None, None, None)
