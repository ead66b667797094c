"""Periodic actions: what the training driver does between dispatches.

`Program.run` dispatches `k` iterations at a time. Everything a run does
besides computing (progress, metric lines, tracking, checkpoints, the check
for NaN, graceful stops, videos, a user's early stop) is an `Action`: an
object that says when it runs and what it does, as Flax's `periodic_actions`
and Keras callbacks do. The driver calls, for every action in order:

- `on_start(run)` once, before the first dispatch;
- `on_dispatch(iteration, state)` right after each dispatch is queued, with
  the state still on its devices: device work queued here (a reduction) is
  fetched with that dispatch's metrics, so it costs no extra wait;
- `on_metrics(iteration, metrics, queued)` as each dispatch's metrics reach
  the host (one dispatch late: the next one is already queued), with what
  `on_dispatch` returned for it;
- `on_state(iteration, state, delays)` with host copies of the whole state
  every `every` iterations (rounded up to whole dispatches) and at the run's
  last iteration (its end, or a stop), before the next dispatch reuses the
  buffers; actions due at the same dispatch share one copy;
- `wants_stop()` after every dispatch but the last: if any action says yes,
  the run ends there (after `on_state` for every action with `every`). A
  stop decided from metrics ends the run one dispatch after them: they
  arrive while the next dispatch runs;
- `on_end(run)` once, last, also when the run fails (to close files).

`iteration` is always the count of iterations the state has reached, counted
from the start of the whole run (a resumed run's first dispatch continues from
its checkpoint's iteration). `run.history` is not kept here: `Program.run`
returns it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np

from fragc.ir.errors import FragcError


@dataclasses.dataclass
class Run:
    """What every action of one `Program.run` call sees: the run's extent, and what it has reached."""

    program: Any
    """The compiled `Program`."""
    start: int
    """The iteration the state started this call at (0 for a fresh run, a checkpoint's when resuming)."""
    stop_at: int
    """The iteration this call ends at unless stopped."""
    steps_per_iteration: int
    """Environment steps per iteration; 0 when the algorithm does not say."""
    lead: bool
    """Whether this process writes files and prints (process 0 of a multi-process run)."""
    reached: int = 0
    """The iteration of the latest metrics to reach the host."""
    last: dict[str, float] = dataclasses.field(default_factory=dict)
    """Per metric, the mean of its latest row (over environments and population members)."""
    began: float = dataclasses.field(default_factory=time.perf_counter)
    """`time.perf_counter()` when the run began."""
    stopped_by: int = 0
    """The signal that asked the run to stop after a dispatch (src/fragc/runtime/stopping.py's graceful stop), 0 if none:
    what `on_end` reads to tell an interrupted run from one that ended."""

    @property
    def wall_s(self) -> float:
        return time.perf_counter() - self.began

    @property
    def last_return(self) -> float:
        """The latest mean `episode_return`, NaN if the algorithm reports none (or none has arrived)."""
        return self.last.get("episode_return", float("nan"))

    def env_steps(self, iteration: int) -> int:
        return iteration * self.steps_per_iteration

    def record(self, iteration: int, metrics: dict[str, np.ndarray]) -> None:
        """Note a dispatch's host metrics (one row per iteration; axis 1 for a population)."""
        axis = 1 if self.program.population else 0
        self.reached = iteration
        for name, values in metrics.items():
            values = np.asarray(values)
            if values.ndim > axis and values.shape[axis]:
                self.last[name] = float(np.mean(np.take(values, -1, axis=axis)))


class Action:
    """Something the training driver does between dispatches; override the hooks it needs."""

    every: int = 0
    """Iterations between `on_state` calls, rounded up to whole dispatches (0: it never needs the state)."""

    def on_start(self, run: Run) -> None:
        """Before the first dispatch."""

    def on_dispatch(self, iteration: int, state: Any) -> Any:
        """Right after a dispatch reaching `iteration` is queued; the state is on its devices. What this
        returns (device arrays, or None) reaches `on_metrics` on the host with that dispatch's metrics:
        return values computed from the state (a reduction, `x + 0`), never its leaves themselves, whose
        buffers the next dispatch reuses."""
        return None

    def on_metrics(self, iteration: int, metrics: dict[str, np.ndarray], queued: Any) -> None:
        """A dispatch's metrics on the host: metric -> one row per iteration of the dispatch (a
        population's rows on axis 1), `iteration` the last of them."""

    def on_state(self, iteration: int, state: Any, delays: dict) -> None:
        """Host copies of the state (and a pipelined program's delay values) after `iteration`."""

    def wants_stop(self) -> bool:
        """Asked after every dispatch but the last, in every process alike; True ends the run there."""
        return False

    def on_end(self, run: Run) -> None:
        """Once, last, whether the run ended, stopped or failed."""


class OnMetrics(Action):
    """`fn(iteration, metrics)` as each dispatch's metrics arrive (what `Program.run(callback=...)` makes)."""

    def __init__(self, fn: Callable[[int, dict], None]):
        self.fn = fn

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        self.fn(iteration, metrics)


class Every(Action):
    """`fn(iteration, state)` with a host copy of the state every `every` iterations (and at the end)."""

    def __init__(self, every: int, fn: Callable[[int, Any], None]):
        self.every = _positive("Every", every)
        self.fn = fn

    def on_state(self, iteration: int, state: Any, delays: dict) -> None:
        self.fn(iteration, state)


class StopAtReturn(Action):
    """End the run after the first dispatch whose latest mean `metric` reaches `target` (an early stop)."""

    def __init__(self, target: float, metric: str = "episode_return"):
        self.target, self.metric = float(target), metric
        self.reached_at: int | None = None

    def on_start(self, run: Run) -> None:
        self.run = run

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        if self.reached_at is None and self.run.last.get(self.metric, -np.inf) >= self.target:
            self.reached_at = iteration

    def wants_stop(self) -> bool:
        return self.reached_at is not None


def check_actions(actions: Any) -> list[Action]:
    """`actions` as a list, each one an `Action` with a whole `every`; else one line saying which is not."""
    if isinstance(actions, Action):
        return [actions]
    try:
        listed = list(actions)
    except TypeError:
        raise FragcError(f"actions must be a list of fragc.actions.Action, got {type(actions).__name__}") from None
    for a in listed:
        if not isinstance(a, Action):
            raise FragcError(f"actions: {a!r} is not a fragc.actions.Action (subclass it and override its hooks)")
        every = a.every
        if not isinstance(every, (int, np.integer)) or isinstance(every, bool) or every < 0:
            raise FragcError(f"actions: {type(a).__name__}.every must be a whole number of iterations, got {every!r}")
    return listed


def _positive(who: str, every: Any) -> int:
    if not isinstance(every, (int, np.integer)) or isinstance(every, bool) or every < 1:
        raise FragcError(f"{who}: every must be a positive whole number of iterations, got {every!r}")
    return int(every)


def steps_per_iteration(algo: Any) -> int:
    """Environment steps per iteration: the algorithm's or its config's `steps_per_iteration`, else 0
    (unknown; metric lines then count 0 env steps)."""
    steps = getattr(algo, "steps_per_iteration", None) or getattr(getattr(algo, "config", None),
                                                                   "steps_per_iteration", None)
    return int(steps) if isinstance(steps, (int, np.integer)) and not isinstance(steps, bool) and steps > 0 else 0
