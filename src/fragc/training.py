"""`fragc.train`: the training driver around `Program.run`.

`Program.run` runs iterations and calls periodic actions between dispatches
(src/fragc/runtime/actions.py). A training run is a list of them, which `train` builds
for Python users and for `fragc run` (which only parses options, calls it and
prints the result):

- `CheckFinite`: the first NaN or infinity in a metric or the state stops the run;
- `StopOnSignal`: SIGINT, SIGTERM or SIGHUP stop it after the dispatch in flight;
- `WriteMetrics`: one JSON line per dispatch;
- `ShowProgress` or `LogProgress`: a progress bar on a terminal, lines with an ETA in a log;
- `SaveCheckpoints`: the whole state every `checkpoint_every` iterations and at the end;
- the tracking sinks (`track=`) and the user's own (`actions=`).

Resuming is `train`'s own step, before the run: the latest good checkpoint's
state, delays and iteration count. In a multi-process run every process calls
`train` alike; process 0 alone writes checkpoints and metric lines and shows
progress.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Sequence, TextIO

import jax
import numpy as np

from fragc.ir.errors import FragcError
from fragc.runtime.actions import Action, Run, check_actions
from fragc.runtime.checkpoint import Checkpointer
from fragc.runtime.divergence import CheckFinite, Diverged, check_state
from fragc.runtime.reporting import MetricsWriter, config_dict
from fragc.runtime.stopping import Stopped, StopOnSignal
from fragc.sinks import tracking
from fragc.sinks.progress import LogProgress, ShowProgress, progress_action


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
          stop_after: int | None = None, run_info: dict | None = None, track: Any = None,
          track_dir: str | os.PathLike | None = None, actions: Sequence[Action] = (),
          track_members: bool = True) -> TrainResult:
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
      resuming, a progress bar if the stream is a terminal, and a line each tenth of the run
      (and at least every minute) otherwise.
    stop_after: run at most this many iterations now (to be continued with
      `resume=True`).
    run_info: JSON-serialisable facts saved with each checkpoint (the CLI saves
      its algorithm name and seed).
    track: tracking sinks ("tensorboard", "wandb", "mlflow"; a comma-separated
      string or a list): every metric against the env step, with the run's
      hyperparameters and IR header (src/fragc/sinks/tracking.py); `track_dir` is where
      they write (default: the metrics file's folder, else the checkpoints',
      else `runs`). Each run is named `ENV__ALGO__POLICY__SEED__START` (its own TensorBoard folder, W&B run and
      MLflow run); the name and the ids are saved with the checkpoints, so a resumed run continues the same runs.
      A run stopped by a signal is recorded as interrupted, one that raised as failed. A `CaptureVideo` among
      `actions` sends its videos to the sinks too.
    track_members: a population's members as tracked runs of their own, one per member
      (`NAME/config_K/seed_S`, grouped per configuration; under PBT with their current hyperparameters and
      lineage); False: one run with each metric also per member (`metric/member_i`).
    actions: your own periodic actions (fragc.actions), run after the built-in ones.
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
    own = check_actions(actions)
    checkpoints = _open_checkpoints(checkpoint_dir)
    try:
        track_dir = _track_dir(track_dir, metrics, checkpoints)
        identity = tracking.RunIdentity.fresh(prog, run_info, track_dir)
        training = _Training(prog, int(iterations), checkpoints, checkpoint_every, run_info, progress, identity)
        sinks = tracking.trackers(track, track_dir, prog, run_info, identity, track_members) if track else []
        _send_videos(own, sinks)
        return training.run(state, resume, stop_after, metrics, sinks + own)
    finally:
        if checkpoints is not None and checkpoints is not checkpoint_dir:  # opened here: closed here
            checkpoints.close()


def _open_checkpoints(checkpoint_dir: Any) -> Any:
    if checkpoint_dir is None or isinstance(checkpoint_dir, Checkpointer):
        return checkpoint_dir
    return Checkpointer(os.fspath(checkpoint_dir))


def _track_dir(track_dir: Any, metrics: Any, checkpoints: Any) -> str:
    """Where the tracking sinks write: `track_dir`, else the metrics file's folder, else the checkpoints', else `runs`."""
    if track_dir is None:
        track_dir = (os.path.dirname(os.path.abspath(metrics)) if metrics is not None
                     else checkpoints.directory if checkpoints is not None else "runs")
    return os.fspath(track_dir)


def _send_videos(actions: list[Action], sinks: list[Action]) -> None:
    """Each video capture among `actions` (an action with a list `sinks`, as `CaptureVideo`) hands its videos
    to the tracking sinks: a population's member's video to that member's run."""
    for action in actions:
        if isinstance(getattr(action, "sinks", None), list):
            member = getattr(action, "member", 0)
            action.sinks += [s for s in sinks if isinstance(s, tracking.Sink)
                             and (s.member is None or s.member.index == member)]


class _Training:
    """One call of `train`: its settings, the resumed starting point, and the actions of its run."""

    def __init__(self, prog: Any, iterations: int, checkpointer: Any, checkpoint_every: int,
                 run_info: dict | None, progress: bool | TextIO, identity: tracking.RunIdentity):
        self.prog, self.iterations, self.checkpointer, self.identity = prog, iterations, checkpointer, identity
        self.checkpoint_every = checkpoint_every
        self.lead = jax.process_index() == 0  # metrics, progress and checkpoints come from process 0
        self.meta = _run_meta(prog, run_info)
        self.out = (sys.stderr if progress is True else progress or None) if self.lead else None
        self.start_at, self.resumed_return = 0, float("nan")

    def run(self, state: Any, resume: bool, stop_after: int | None, metrics: Any,
            extra: list[Action]) -> TrainResult:
        delays = None
        if resume:
            state, delays = self.resume(state)
        stop_at = min(self.iterations, self.start_at + stop_after) if stop_after else self.iterations
        stop = StopOnSignal(graceful=self.checkpointer is not None)
        saving = (SaveCheckpoints(self.checkpointer, self.checkpoint_every, self.meta, self.identity)
                  if self.checkpointer else None)
        if saving is not None and self.start_at:
            saving.saved_at = self.start_at  # the checkpoint resumed from
        actions: list[Action] = [CheckFinite(), stop]
        if metrics is not None and self.lead:
            actions.append(WriteMetrics(os.fspath(metrics), resume_from=self.start_at if resume else None))
        if self.out is not None and not any(isinstance(a, (ShowProgress, LogProgress)) for a in extra):
            actions.append(progress_action(self.iterations, self.out))
        actions += ([saving] if saving else []) + extra
        start = time.perf_counter()
        history: dict[str, np.ndarray] = {}
        last = Run(self.prog, self.start_at, stop_at, 0, self.lead)
        try:
            if self.start_at < stop_at:
                state, history = self.prog.run(state, stop_at - self.start_at, actions, delays=delays,
                                                start=self.start_at)
                last = self.prog.last_run
                if stop.signum:
                    raise Stopped(stop.signum, last.reached)
        except Diverged as err:
            raise err.keeping(saving.saved_at if saving else None, self.checkpointer) from None
        final_return = last.last.get("episode_return", self.resumed_return)
        return TrainResult(state, history, stop_at, self.start_at, final_return, time.perf_counter() - start)

    def resume(self, fresh_state: Any) -> tuple[Any, Any]:
        """The latest good checkpoint's state and delays, placed on the program's devices."""
        prog = self.prog
        if not self.checkpointer.steps():
            if self.out is not None:
                print(f"no checkpoint in '{self.checkpointer.directory}' yet: starting afresh", file=self.out)
            return fresh_state, None
        state, delays, saved = self.checkpointer.restore_latest(fresh_state, prog.initial_delays(fresh_state),
                                                                run=self.meta)
        self.start_at = int(saved["iteration"])
        self.identity.continue_from(saved.get("tracking"))  # the same runs in the trackers
        self.resumed_return = float(saved.get("last_return", float("nan")))
        if self.out is not None:
            print(f"resumed from the checkpoint at iteration {self.start_at}", file=self.out)
        return prog.place_state(state), prog.place_delays(delays) if delays else None


class SaveCheckpoints(Action):
    """The whole state (and delays) every `every` iterations and at the run's last iteration. Every
    process holds the whole state on its host; process 0 writes it. A state that is not finite is
    never saved. The metadata holds the run's identity in the trackers (`tracking`), taken when saved:
    the sinks add their MLflow run ids to it as they open."""

    def __init__(self, checkpointer: Any, every: int, meta: dict, identity: Any = None):
        self.checkpointer, self.every, self.meta, self.identity = checkpointer, every, meta, identity
        self.saved_at: int | None = None  # the iteration of the latest checkpoint of this run, if any

    def on_start(self, run: Run) -> None:
        self.run = run

    def on_state(self, iteration: int, state: Any, delays: dict) -> None:
        check_state(state, iteration)
        if self.run.lead:
            tracked = {"tracking": self.identity.saved()} if self.identity is not None else {}
            self.checkpointer.save(iteration, state, delays, {**self.meta, **tracked,
                                                              "last_return": self.run.last_return})
        self.saved_at = iteration


class WriteMetrics(Action):
    """One JSON line per dispatch: the iteration, env steps, wall time and each metric's mean
    (src/fragc/runtime/reporting.py). A resumed run first drops the lines after its checkpoint."""

    def __init__(self, path: str, resume_from: int | None = None):
        self.path, self.resume_from, self.writer = path, resume_from, None

    def on_start(self, run: Run) -> None:
        self.run = run
        self.writer = MetricsWriter(self.path, resume_from=self.resume_from)

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        self.writer.write(iteration, self.run.env_steps(iteration), self.run.wall_s, metrics)

    def on_end(self, run: Run) -> None:
        if self.writer is not None:
            self.writer.close()


def _run_meta(prog: Any, run_info: dict | None) -> dict:
    """What a checkpoint records about its run."""
    return algo_meta(prog.algo, {"policy": prog.policy.name, "devices": len(prog.devices), **(run_info or {})})


def algo_meta(algo: Any, run_info: dict | None) -> dict:
    """The part of a checkpoint's metadata known before compiling: the algorithm, its config, and `run_info`."""
    meta = {"algo": f"{type(algo).__module__}.{type(algo).__qualname__}", "config": config_dict(algo),
            **(run_info or {})}
    return json.loads(json.dumps(meta, default=str))


