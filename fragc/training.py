"""`fragc.train`: the training driver around `Program.run`.

`Program.run` runs iterations; a training run also resumes from a checkpoint,
shows progress, writes metric lines and saves checkpoints. `train` does these
for Python users and for `fragc run`, which only parses options, calls it and
prints the result.

One run is a `_Training`, whose steps each have one method:
- `resume`: the latest good checkpoint's state, delays and iteration count;
- `on_metrics`: called with each dispatch's metrics as they arrive (progress
  bar, metric lines, the last mean return);
- `save`: called with host copies of the state at checkpoint boundaries;
- `run`: `Program.run` from the resumed iteration to where this call stops.

In a multi-process run every process calls `train` alike; process 0 alone
writes checkpoints and metric lines and shows progress.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, TextIO

import numpy as np

from fragc.ir.errors import FragcError
from fragc.runtime.divergence import Diverged, StateNotFinite, check_metrics, check_state
from fragc.runtime.multihost import to_host
from fragc.runtime.stopping import GracefulStop, Stopped


@dataclasses.dataclass
class TrainResult:
    """What `train` returns."""

    state: Any
    """The training state after the last iteration run (on the program's devices)."""
    history: dict[str, np.ndarray]
    """Per metric, one row per iteration run by this call (empty if it ran none)."""
    iterations: int
    """The iteration count reached, counted from the start of the run (including resumed iterations)."""
    resumed_from: int
    """The iteration the run continued from (0 for a fresh start)."""
    final_return: float
    """The mean `episode_return` metric of the last iteration (NaN if the algorithm reports none)."""
    wall_s: float
    """Seconds spent in this call, after resuming."""


def train(prog: Any, state: Any, iterations: int, *, checkpoint_dir: Any = None, checkpoint_every: int = 64,
          resume: bool = False, metrics: str | os.PathLike | None = None, progress: bool | TextIO = False,
          stop_after: int | None = None, run_info: dict | None = None) -> TrainResult:
    """Train `prog` from `state` until `iterations` iterations have run in all.

    checkpoint_dir: a folder (or an open `fragc.runtime.checkpoint.Checkpointer`)
      to save the whole training state in, every `checkpoint_every` iterations
      (rounded up to whole dispatches) and at the end.
    resume: continue from the latest good checkpoint in `checkpoint_dir`
      instead of `state` (which then only gives the state's type); refused if
      it was written with another algorithm, config, policy or device count.
      Before the first checkpoint exists, start from `state`, with a notice.
    metrics: a JSON-lines file, one line per dispatch with the iteration, env
      steps, wall time and each metric's mean (when resuming, the lines after
      the checkpoint are dropped first: the file reads as one run's).

    progress: a text stream (or True for stderr) for progress: a line when
      resuming, and a progress bar if the stream is a terminal.
    stop_after: run at most this many iterations now (to be continued with
      `resume=True`).
    run_info: JSON-serialisable facts saved with each checkpoint (the CLI saves
      its algorithm name and seed).
    With a checkpoint_dir, SIGINT, SIGTERM or SIGHUP stop the run after the
    dispatch in flight with a checkpoint, raising `fragc.runtime.stopping.Stopped`
    (a second signal stops at once); without one they stop it at once
    (KeyboardInterrupt).
    The first NaN or infinity in a metric or in the state stops the run with
    `fragc.runtime.divergence.Diverged` (exit code 3 on the command line); a
    state that is not finite is never saved as a checkpoint.
    """
    if not isinstance(iterations, (int, np.integer)) or isinstance(iterations, bool) or iterations < 1:
        raise FragcError(f"train: iterations must be a positive int, got {iterations!r}")
    if resume and checkpoint_dir is None:
        raise FragcError("train: resume=True needs checkpoint_dir")
    checkpoints = _open_checkpoints(checkpoint_dir)
    try:
        return _Training(prog, iterations, checkpoints, checkpoint_every, metrics, progress, run_info).run(
            state, resume, stop_after)
    finally:
        if checkpoints is not None and checkpoints is not checkpoint_dir:  # opened here: closed here
            checkpoints.close()


def _open_checkpoints(checkpoint_dir: Any) -> Any:
    from fragc.runtime.checkpoint import Checkpointer

    if checkpoint_dir is None or isinstance(checkpoint_dir, Checkpointer):
        return checkpoint_dir
    return Checkpointer(os.fspath(checkpoint_dir))


class _Training:
    """One call of `train`: the run's settings and what it has reached so far."""

    def __init__(self, prog: Any, iterations: int, checkpointer: Any, checkpoint_every: int,
                 metrics: Any, progress: bool | TextIO, run_info: dict | None):
        import jax

        self.prog, self.iterations, self.checkpointer = prog, int(iterations), checkpointer
        self.checkpoint_every = checkpoint_every
        self.lead = jax.process_index() == 0  # metrics, progress and checkpoints come from process 0
        self.steps = steps_per_iteration(prog.algo)
        self.meta = _run_meta(prog, run_info)
        self.metrics_path = metrics if self.lead else None
        self.out = (sys.stderr if progress is True else progress or None) if self.lead else None
        self.start_at, self.last_return = 0, float("nan")
        self.saved_at = None  # the iteration of the latest checkpoint, if any

    # ------------------------------------------------------------ the steps of a run

    def run(self, state: Any, resume: bool, stop_after: int | None) -> TrainResult:
        delays = None
        if resume:
            state, delays = self.resume(state)
        stop_at = min(self.iterations, self.start_at + stop_after) if stop_after else self.iterations
        self.writer = _metrics_writer(self.metrics_path, resume_from=self.start_at if resume else None)
        self.bar = _ProgressBar(self.iterations, self.steps, self.out) if self.out and _isatty(self.out) else None
        self.start = time.perf_counter()
        history: dict[str, np.ndarray] = {}
        self.asked, self.reached = 0, self.start_at
        try:
            if self.start_at < stop_at:
                with GracefulStop(graceful=self.checkpointer is not None) as self.stop:
                    state, history = self.prog.run(
                        state, stop_at - self.start_at, callback=self.on_metrics, delays=delays,
                        checkpoint=self.save if self.checkpointer else None,
                        checkpoint_every=self.checkpoint_every, check_finite=True,
                        stop=self.stop_requested if self.checkpointer else None)
                if self.asked:
                    raise Stopped(self.asked, self.reached)
                if not self.checkpointer:  # else `save` checked the final state
                    check_state(to_host(state), stop_at)
        except Diverged as err:
            if isinstance(err, StateNotFinite):  # counted within this call of Program.run
                err = err.shifted(self.start_at)
            raise err.keeping(self.saved_at, self.checkpointer) from None
        finally:
            if self.writer is not None:
                self.writer.close()
            if self.bar is not None:
                self.bar.close()
        return TrainResult(state, history, stop_at, self.start_at, self.last_return, time.perf_counter() - self.start)

    def resume(self, fresh_state: Any) -> tuple[Any, Any]:
        """The latest good checkpoint's state and delays, placed on the program's devices."""
        prog = self.prog
        if not self.checkpointer.steps():
            if self.out is not None:
                print(f"no checkpoint in '{self.checkpointer.directory}' yet: starting afresh", file=self.out)
            return fresh_state, None
        state, delays, saved = self.checkpointer.restore_latest(fresh_state, prog.initial_delays(fresh_state),
                                                                run=self.meta)
        self.start_at = self.saved_at = int(saved["iteration"])
        self.last_return = float(saved.get("last_return", float("nan")))
        if self.out is not None:
            print(f"resumed from the checkpoint at iteration {self.start_at}", file=self.out)
        return prog.place_state(state), prog.place_delays(delays) if delays else None

    def on_metrics(self, done: int, metrics: dict) -> None:
        """Each dispatch's metrics as they arrive; `done` counts the iterations of this call."""
        done += self.start_at
        self.reached = done
        if "episode_return" in metrics:
            self.last_return = float(np.mean(np.asarray(metrics["episode_return"])[..., -1]))
        now = time.perf_counter() - self.start
        if self.writer is not None:
            self.writer.write(done, done * self.steps, now, metrics)
        check_metrics(metrics, done, population=bool(self.prog.population))
        if self.bar is not None:
            self.bar.update(done, (done - self.start_at) * self.steps / max(now, 1e-9), self.last_return)

    def save(self, done: int, host_state: Any, host_delays: dict) -> None:
        """A checkpoint after `done` iterations of this call; every process holds the whole state
        on its host, one writes it. A state that is not finite is never saved."""
        check_state(host_state, self.start_at + done)
        if self.lead:
            self.checkpointer.save(self.start_at + done, host_state, host_delays,
                                   {**self.meta, "last_return": self.last_return})
        self.saved_at = self.start_at + done

    def stop_requested(self) -> bool:
        """Asked by `Program.run` after every dispatch (in every process alike: the processes agree
        on it): a stop signal ends the run there, after a checkpoint when there is a folder."""
        self.asked = self.stop.requested()
        return bool(self.asked)


def steps_per_iteration(algo: Any) -> int:
    """Environment steps per iteration: the algorithm's or its config's `steps_per_iteration`, else 0
    (unknown; metric lines then count 0 env steps)."""
    steps = getattr(algo, "steps_per_iteration", None) or getattr(getattr(algo, "config", None),
                                                                   "steps_per_iteration", None)
    return int(steps or 0)


def config_dict(algo: Any) -> dict | None:
    """The algorithm's config as it reads back from JSON (tuples become lists), None without one."""
    config = getattr(algo, "config", None)
    if not (dataclasses.is_dataclass(config) and not isinstance(config, type)):
        return None
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def _run_meta(prog: Any, run_info: dict | None) -> dict:
    """What a checkpoint records about its run."""
    return algo_meta(prog.algo, {"policy": prog.policy.name, "devices": len(prog.devices), **(run_info or {})})


def algo_meta(algo: Any, run_info: dict | None) -> dict:
    """The part of a checkpoint's metadata known before compiling: the algorithm, its config, and `run_info`."""
    meta = {"algo": f"{type(algo).__module__}.{type(algo).__qualname__}", "config": config_dict(algo),
            **(run_info or {})}
    return json.loads(json.dumps(meta, default=str))


def _metrics_writer(path: Any, resume_from: int | None) -> Any:
    if path is None:
        return None
    from fragc.runtime.reporting import MetricsWriter

    return MetricsWriter(os.fspath(path), resume_from=resume_from)


def _isatty(stream: TextIO) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


class _ProgressBar:
    """One terminal line, redrawn at most twice a second, shown once a run has lasted 2 seconds."""

    def __init__(self, iterations: int, steps: int, out: TextIO):
        self.iterations, self.steps, self.out = iterations, steps, out
        self.start, self.last, self.shown = time.perf_counter(), 0.0, False

    def update(self, done: int, steps_per_s: float, recent_return: float) -> None:
        now = time.perf_counter() - self.start
        if now < 2.0 or (now - self.last < 0.5 and done < self.iterations):
            return
        self.last, self.shown = now, True
        width = 24
        filled = int(width * done / self.iterations)
        self.out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.iterations} it  "
                       f"{done * self.steps} env steps  {steps_per_s:,.0f} steps/s  return {recent_return:.1f}  ")
        self.out.flush()

    def close(self) -> None:
        if self.shown:
            self.out.write("\n")
