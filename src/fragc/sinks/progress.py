"""Progress of a run as people read it: a bar redrawn in place on a terminal, and plain lines in a log.

Off a terminal (a pipe, a cluster job's log) a redrawn bar is unreadable, and a line per dispatch floods the log;
`LogProgress` writes a line each tenth of the run and at least every `every_s` seconds, so a log shows that a
long run is alive and when it will end. Both show the elapsed time and an ETA from the run's rate so far.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, TextIO

from fragc.runtime.actions import Action, Run


def clock(seconds: float) -> str:
    """`75.2` -> `1:15`, `3725` -> `1:02:05`; `?` for a time not known yet."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def eta_seconds(run: Run, iteration: int, iterations: int) -> float:
    """Seconds left at this call's rate so far (iterations since it started over its wall time); NaN
    before the first iteration of this call has run."""
    done = iteration - run.start
    return (iterations - iteration) * run.wall_s / done if done > 0 else float("nan")


def progress_text(run: Run, iteration: int, iterations: int) -> str:
    """`120/1000 it  61440 env steps  3,210 steps/s  return 23.4  0:19 elapsed, eta 2:21`; `win 0.42` after the
    return where the algorithm reports a `win_rate` (IPPO's and MAPPO's on SMAX: what SMAX runs are judged by)."""
    now = run.wall_s
    parts = [f"{iteration}/{iterations} it"]
    if run.steps_per_iteration:
        rate = run.env_steps(iteration - run.start) / max(now, 1e-9)
        parts += [f"{run.env_steps(iteration)} env steps", f"{rate:,.0f} steps/s"]
    if math.isfinite(run.last_return):
        parts.append(f"return {run.last_return:.1f}")
    if "win_rate" in run.last:
        parts.append(f"win {run.last['win_rate']:.2f}")
    parts.append(f"{clock(now)} elapsed, eta {clock(eta_seconds(run, iteration, iterations))}")
    return "  ".join(parts)


class FirstDispatch:
    """A line every `every_s` seconds while a run's first dispatch runs: its metrics are the first progress, and a
    dispatch of k iterations can take minutes (Atari on a CPU). Stops at the first metrics, or at the end."""

    def __init__(self, out: TextIO, every_s: float = 30.0):
        self.out, self.every_s, self.stopped = out, every_s, threading.Event()

    def start(self, run: Run) -> None:
        k = getattr(run.program, "k", None)
        what = f"the first dispatch ({k} iterations)" if k else "the first dispatch"

        def beat() -> None:
            while not self.stopped.wait(self.every_s):
                print(f"  {clock(run.wall_s)} elapsed: {what} is still running", file=self.out, flush=True)

        threading.Thread(target=beat, name="fragc-first-dispatch", daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()


class ShowProgress(Action):
    """One terminal line, redrawn at most twice a second, shown once a run has lasted 2 seconds."""

    def __init__(self, iterations: int, out: TextIO, first_every_s: float = 30.0):
        self.iterations, self.out = iterations, out
        self.last, self.shown = 0.0, False
        self.first = FirstDispatch(out, first_every_s)

    def on_start(self, run: Run) -> None:
        self.run = run
        self.first.start(run)

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        self.first.stop()
        now = self.run.wall_s
        if now < 2.0 or (now - self.last < 0.5 and iteration < self.iterations):
            return
        self.last, self.shown = now, True
        width = 24
        filled = int(width * iteration / self.iterations)
        self.out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] "
                       f"{progress_text(self.run, iteration, self.iterations)}  ")
        self.out.flush()

    def on_end(self, run: Run) -> None:
        self.first.stop()
        if self.shown:
            self.out.write("\n")


class LogProgress(Action):
    """A line each tenth of the run (by iterations), and at least every `every_s` seconds while it runs.
    The first dispatch always writes one, so a log shows the run started."""

    def __init__(self, iterations: int, out: TextIO, every_s: float = 60.0,
                 detail: Callable[[dict], str] | None = None, first_every_s: float = 30.0):
        self.iterations, self.out, self.every_s, self.detail = iterations, out, every_s, detail
        self.next_iteration, self.last_s = 0, -math.inf
        self.first = FirstDispatch(out, first_every_s)

    def on_start(self, run: Run) -> None:
        self.run = run
        self.next_iteration = run.start
        self.first.start(run)

    def on_end(self, run: Run) -> None:
        self.first.stop()

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        self.first.stop()
        now = self.run.wall_s
        if iteration < self.next_iteration and now - self.last_s < self.every_s and iteration < self.iterations:
            return
        tenth = max(1, self.iterations // 10)
        self.next_iteration = (iteration // tenth + 1) * tenth
        self.last_s = now
        more = self.detail(metrics) if self.detail is not None else ""
        print(f"  {progress_text(self.run, iteration, self.iterations)}{more}", file=self.out, flush=True)


def progress_action(iterations: int, out: TextIO, detail: Callable[[dict], str] | None = None) -> Action:
    """The bar on a terminal, lines otherwise (ending with `detail(metrics)`, e.g. a sweep's best member)."""
    tty = bool(getattr(out, "isatty", lambda: False)())
    return ShowProgress(iterations, out) if tty else LogProgress(iterations, out, detail=detail)
