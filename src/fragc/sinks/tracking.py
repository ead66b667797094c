"""Tracking sinks: every metric of a run against its env step, in TensorBoard, Weights & Biases or MLflow.

`fragc.train(..., track="tensorboard,wandb")` (and `fragc run ... --track`)
adds one periodic action (src/fragc/runtime/actions.py) per sink named. Each writes,
for every iteration row of every dispatch, each metric's mean over
environments at x = the env steps reached after that iteration (the
iteration itself when the algorithm does not say its steps per iteration;
`eval_return` only where it evaluated), plus `steps_per_second` (env steps
since the run started over its wall time) once per dispatch. With the run it
records its hyperparameters (the algorithm's config, the policy, devices and
`run_info`), the header of the printed IR (mesh, transfers, schedule), the
videos a `CaptureVideo` hands it, and how the run ended (finished, failed,
interrupted). A run's name and ids (`RunIdentity`) are its own, and a resumed
run continues them (`fragc.train` keeps them with the checkpoints). A
population's members are runs of their own (`Member`), grouped per
configuration, with PBT's current values and lineage.

Only process 0 writes. Each client is an optional extra, imported when its sink
is asked for (`trackers`, then inside the sink's methods: never when this
module is imported); one that is not installed is refused in one line with the
extra to install. docs/tracking.md says where each sink
writes and how to open what it wrote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import errno
import importlib
import json
import math
import os
import re
import signal
import sys
import time
import typing
import uuid
from pathlib import Path
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from fragc.ir.errors import FragcError
from fragc.ir.sweep import SweepState
from fragc.runtime.actions import Action, Run
from fragc.runtime.reporting import config_dict, write_error

THROUGHPUT = "steps_per_second"
"""The throughput metric each sink adds once per dispatch (when the algorithm says its steps per iteration)."""


# ------------------------------------------------------------------ what every sink writes


def base_name(prog: Any, run_info: dict | None) -> str:
    """`ENV__ALGO__POLICY__SEED` (as CleanRL's `env__exp__seed`; a part not known is left out). ALGO is
    `run_info["algo"]` (the CLI's algorithm spec, cut to its class or module name) or the algorithm's class name."""
    info, algo_obj = run_info or {}, getattr(prog, "algo", None)
    algo = str(info.get("algo") or type(algo_obj).__name__)
    algo = re.split(r"[:/\\]", algo)[-1].removesuffix(".py")
    config = getattr(algo_obj, "config", None)
    env = getattr(config, "env", None) or getattr(config, "env_name", None)
    policy = getattr(getattr(prog, "policy", None), "name", None)
    parts = ([str(env)] if isinstance(env, str) and env else []) + [algo] + ([policy] if policy else [])
    parts += [str(info["seed"])] if info.get("seed") is not None else []
    return "__".join(re.sub(r"[^A-Za-z0-9_.-]+", "_", part).strip("_") for part in parts)


@dataclasses.dataclass
class RunIdentity:
    """Who a tracked run is in every tracker: `name` (the TensorBoard folder, the W&B and MLflow run name),
    `id` (the W&B run id) and the MLflow run ids (`mlflow`, per run key: "" for the run, `member_i` for a
    population's members). `fragc.train` saves it with every checkpoint (`saved`) and a resumed run takes it
    back (`continue_from`), so that it continues the same runs."""

    name: str
    id: str
    mlflow: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def fresh(cls, prog: Any, run_info: dict | None, directory: str | os.PathLike | None = None) -> "RunIdentity":
        """`base_name__START` (START: the Unix time, `-2`, `-3`, ... added where `directory` already holds a
        TensorBoard folder of that name) and a random W&B id."""
        name = f"{base_name(prog, run_info)}__{int(time.time())}"
        taken, n = name, 2
        while directory is not None and os.path.exists(os.path.join(directory, "tensorboard", taken)):
            taken, n = f"{name}-{n}", n + 1
        return cls(taken, uuid.uuid4().hex[:16])

    def saved(self) -> dict[str, Any]:
        """What a checkpoint stores of it (JSON)."""
        return {"name": self.name, "id": self.id, "mlflow": dict(self.mlflow)}

    def continue_from(self, saved: Any) -> bool:
        """Take back a checkpoint's identity (`saved`); False (and unchanged) if it stores none."""
        if not (isinstance(saved, dict) and isinstance(saved.get("name"), str) and isinstance(saved.get("id"), str)):
            return False
        self.name, self.id = saved["name"], saved["id"]
        self.mlflow = {str(k): str(v) for k, v in (saved.get("mlflow") or {}).items()}
        return True


@dataclasses.dataclass(frozen=True)
class Member:
    """One member of a population as a tracked run of its own: its index, its configuration (the index of its
    starting hyperparameters among the population's, in member order), its seed and starting hyperparameters."""

    index: int
    config: int
    seed: int
    hyper: dict[str, Any]

    @property
    def key(self) -> str:
        return f"member_{self.index}"

    def path(self, name: str) -> str:
        """`NAME/config_K/seed_S`: the member's run name (and TensorBoard folder)."""
        return f"{name}/config_{self.config}/seed_{self.seed}"

    def group(self, name: str) -> str:
        return f"{name}/config_{self.config}"


def members(prog: Any, run_info: dict | None) -> list[Member]:
    """A population's members (none for one run): member i starts from seed `seed + offset_i` (the run's seed,
    `run_info["seed"]`, 0 if not given) with its values of the swept fields."""
    offsets = list(getattr(prog, "population", ()) or ())
    seed = (run_info or {}).get("seed")
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else 0
    swept = dict(getattr(getattr(prog, "module", None), "hyperparameters", ()) or ())
    configs: dict[tuple, int] = {}
    found = []
    for m, offset in enumerate(offsets):
        hyper = {field: _plain(values[m]) for field, values in swept.items()}
        k = configs.setdefault(tuple(hyper.items()), len(configs))
        found.append(Member(m, k, seed + int(offset), hyper))
    return found


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def hyperparameters(prog: Any, run_info: dict | None, run: Run | None = None,
                    member: Member | None = None) -> dict[str, Any]:
    """The run's hyperparameters as one flat dict of JSON values: the algorithm config's fields (nested
    ones as `outer.inner`), then `algo` (its class), `policy`, `devices`, `population` (if any), and with
    `run` its `steps_per_iteration`, `iterations` and `resumed_from`, then `run_info`'s entries. One of
    these that a config field already names is logged as `run.NAME`. A population's `member`: its own
    starting values of the swept fields, and `member`, `config`, `seed`."""
    params = _flatten(config_dict(prog.algo) or {})
    facts: dict[str, Any] = {"algo": f"{type(prog.algo).__module__}.{type(prog.algo).__qualname__}",
                             "policy": prog.policy.name, "devices": len(prog.devices)}
    if prog.population:
        facts["population"] = [int(s) for s in prog.population]
    if run is not None:
        facts.update(steps_per_iteration=run.steps_per_iteration, iterations=run.stop_at, resumed_from=run.start)
    facts.update(json.loads(json.dumps(run_info or {}, default=str)))
    if member is not None:
        params.update(member.hyper)
        facts.update(member=member.index, config=member.config, seed=member.seed)
    for key, value in facts.items():
        params[f"run.{key}" if key in params else key] = value
    return params


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def ir_header(prog: Any) -> str:
    """The printed IR's header: its `// fragc.ir` line and the mesh, population, transfer and schedule lines."""
    head: list[str] = []
    for line in prog.ir().splitlines():
        if head and (not line.strip() or line.startswith(("type ", "fragment ", "func ", " "))):
            break
        head.append(line)
    return "\n".join(head)


EVALUATED = "eval_return"
"""The metric of periodic evaluation (src/fragc/algos/evaluation.py): reported every iteration, the latest evaluation's value;
the sinks write it only at the iterations that evaluated."""


def points(run: Run, iteration: int, metrics: dict[str, np.ndarray],
           member: int | None = None) -> list[tuple[int, dict[str, float]]]:
    """A dispatch's metrics (one row per iteration, a population's on axis 1) as (x, {name: value}) per
    iteration: each metric's mean over environments and members, a population member's mean as
    `name/member_i`, and `steps_per_second` with the last row. With `member`, that member's means only.
    `eval_return` only at the iterations that evaluated (`evaluated_at`)."""
    axis = 1 if run.program.population else 0
    arrays = {k: np.asarray(v) for k, v in metrics.items()}
    arrays = {k: v for k, v in arrays.items() if v.ndim > axis and v.size}
    if not arrays:
        return []
    n = next(iter(arrays.values())).shape[axis]
    every = evaluation_every(run.program)
    rows: list[tuple[int, dict[str, float]]] = []
    for j in range(n):
        at = iteration - n + 1 + j
        values: dict[str, float] = {}
        for name, v in arrays.items():
            if name == EVALUATED and not evaluated_at(at, every):
                continue
            row = np.take(v, j, axis=axis).astype(np.float64)
            if member is not None:
                values[name] = float(np.mean(row[member]))
                continue
            values[name] = float(np.mean(row))
            if axis:
                for m in range(row.shape[0]):
                    values[f"{name}/member_{m}"] = float(np.mean(row[m]))
        rows.append((x_of(run, at), values))
    if run.steps_per_iteration:
        rows[-1][1][THROUGHPUT] = run.env_steps(iteration - run.start) / max(run.wall_s, 1e-9)
    return rows


def evaluation_every(prog: Any) -> int:
    """The algorithm's `eval_every` (iterations between evaluations; 0: none)."""
    every = getattr(getattr(getattr(prog, "algo", None), "config", None), "eval_every", 0)
    return every if isinstance(every, int) and not isinstance(every, bool) and every > 0 else 0


def evaluated_at(iteration: int, every: int) -> bool:
    """Whether the `iteration`-th iteration (counted from 1) evaluated: src/fragc/algos/evaluation.py evaluates the
    iterations run so far 0, K, 2K, ..., i.e. the 1st, (K+1)-th, ... With `every` 0, every row counts."""
    return not every or (iteration - 1) % every == 0


def x_of(run: Run, iteration: int) -> int:
    """The x axis: env steps after `iteration`, or the iteration when steps per iteration are unknown."""
    return run.env_steps(iteration) if run.steps_per_iteration else iteration


FINISHED, FAILED, INTERRUPTED = "finished", "failed", "interrupted"
"""How a run ended, as `Sink.close` is told: it ran to its end (or an early stop it asked for), it raised, or a
signal stopped it (SIGINT, SIGTERM, SIGHUP: a graceful stop with a checkpoint, or at once)."""


class Sink(Action):
    """A tracking sink: on process 0, `open` at the start, `write` each dispatch's points, `video` each
    video a `CaptureVideo` writes, `close` at the end with how the run ended. `member`: this sink is one
    member's run of a population (its own metrics, hyperparameters and, under PBT, lineage)."""

    name = ""
    """As `--track` names it."""

    def __init__(self, directory: str, prog: Any, run_info: dict | None, identity: RunIdentity | None = None,
                 member: Member | None = None):
        self.directory, self.prog, self.run_info = directory, prog, run_info
        self.identity = identity or RunIdentity.fresh(prog, run_info, directory)
        self.member = member
        self.active, self._outer = False, None
        self.lineage: list[tuple[int, int]] = []  # PBT: (x, the member whose training this one continues from x)

    @property
    def label(self) -> str:
        """The run's name: the identity's, or `NAME/config_K/seed_S` for a member."""
        return self.identity.name if self.member is None else self.member.path(self.identity.name)

    @property
    def key(self) -> str:
        """The run among the identity's (its MLflow run id's key; "" for the run itself)."""
        return "" if self.member is None else self.member.key

    def on_start(self, run: Run) -> None:
        self.run = run
        if not run.lead:
            return
        self._outer = sys.exc_info()[1]  # an exception being handled around the run is not the run failing
        try:
            self.open(run, hyperparameters(self.prog, self.run_info, run, self.member), ir_header(self.prog))
        except FragcError:
            raise
        except Exception as err:  # noqa: BLE001 - a client refusing its settings (a login, a store): one line
            first = (str(err).strip().splitlines() or [""])[0]
            raise FragcError(f"--track {self.name}: {type(err).__name__}: {first}") from err
        self.active = True

    def on_dispatch(self, iteration: int, state: Any) -> Any:
        """A member of a population with swept fields: its current values and lineage (PBT changes them)."""
        if not (self.active and self.member is not None and isinstance(state, SweepState)):
            return None
        return jax.tree.map(jnp.copy, (state.hyper, state.lineage))  # copies: the state's buffers are donated

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        if not self.active:
            return
        rows = points(self.run, iteration, metrics, None if self.member is None else self.member.index)
        if rows and queued is not None:
            rows[-1][1].update(self._swept(rows[-1][0], *queued))
        if rows:
            self.write(rows)

    def _swept(self, x: int, hyper: dict, lineage: Any) -> dict[str, float]:
        """The member's current values (`hyper/FIELD`) and `lineage`, noting when the lineage changes."""
        m = self.member.index
        source = int(np.asarray(lineage)[m])
        if not self.lineage or self.lineage[-1][1] != source:
            self.lineage.append((x, source))
        return {**{f"hyper/{k}": float(np.asarray(v)[m]) for k, v in hyper.items()}, "lineage": float(source)}

    def on_end(self, run: Run) -> None:
        if self.active:
            self.active = False
            self.close(self.ending(run))

    def ending(self, run: Run) -> str:
        """FINISHED, FAILED or INTERRUPTED (called from `on_end`, where the run's exception is being handled)."""
        err = sys.exc_info()[1]
        if err is not None and err is not self._outer and not isinstance(err, KeyboardInterrupt):
            return FAILED
        if err is not None and err is not self._outer or run.stopped_by:
            self.signum = run.stopped_by or getattr(err, "signum", signal.SIGINT)  # Ctrl-C's, or the one it names
            return INTERRUPTED
        return FINISHED

    def lineage_text(self) -> str:
        """PBT's lineage as one line: `from env step X: member J's training` per change."""
        return "; ".join(f"from x={x}: member {j}'s training" for x, j in self.lineage)

    def open(self, run: Run, hparams: dict[str, Any], header: str) -> None:
        raise NotImplementedError

    def write(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        raise NotImplementedError

    def on_video(self, iteration: int, path: str, frames: list[np.ndarray], fps: int) -> None:
        """A video `CaptureVideo` wrote to `path` (its `frames`, at `fps`) after `iteration`."""
        if self.active:
            self.video(x_of(self.run, iteration), path, frames, fps)

    def video(self, x: int, path: str, frames: list[np.ndarray], fps: int) -> None:
        raise NotImplementedError

    def close(self, status: str) -> None:
        raise NotImplementedError


# ------------------------------------------------------------------ the sinks


class TensorBoard(Sink):
    """Event files (tensorboardX) in `DIRECTORY/tensorboard/RUN_NAME/` (a member's in `RUN_NAME/config_K/seed_S/`):
    a scalar per metric, the hyperparameters as a text table and in the HParams dashboard (with how the run
    ended), the IR header as text, videos as animated GIF images. A resumed run writes into its folder again and
    hides what was written there after its checkpoint (TensorBoard's purge_step), as the metrics file is rewritten."""

    name = "tensorboard"

    def open(self, run: Run, hparams: dict[str, Any], header: str) -> None:
        from tensorboardX import SummaryWriter

        self.logdir = os.path.join(self.directory, "tensorboard", *self.label.split("/"))
        start = x_of(run, run.start) if run.start else 0
        self.writer = SummaryWriter(self.logdir, purge_step=start + 1 if run.start else 0, flush_secs=10,
                                    filename_suffix=f".{time.time_ns() % 10**9:09d}.{os.getpid()}")  # sorts in time
        self.hparams = {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v) for k, v in hparams.items()}
        table = "\n".join(["| hyperparameter | value |", "|---|---|"] +
                          [f"| {k} | {v} |" for k, v in self.hparams.items()])
        self.writer.add_text("hyperparameters", table, start)
        self.writer.add_text("ir_header", "\n".join("    " + line for line in header.splitlines()), start)
        self.hparams_written = False

    def write(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        if not self.hparams_written:  # the HParams dashboard's metric columns: the metrics, known now
            from tensorboardX.summary import hparams

            names = [k for k in rows[0][1] if "/member_" not in k]
            experiment, session_start, _ = hparams(self.hparams, {k: 0.0 for k in names})
            for summary in (experiment, session_start):
                self.writer.file_writer.add_summary(summary, x_of(self.run, self.run.start))
            self.hparams_written = True
        for x, values in rows:
            for name, value in values.items():
                self.writer.add_scalar(name, value, x)

    def video(self, x: int, path: str, frames: list[np.ndarray], fps: int) -> None:
        """An animated GIF in an image summary: what tensorboardX's `add_video` writes, encoded by imageio
        (Pillow) instead of moviepy, which fragc does not install."""
        from tensorboardX.proto.summary_pb2 import Summary

        height, width = np.shape(frames[0])[:2]
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif_bytes(frames, fps))
        self.writer.file_writer.add_summary(Summary(value=[Summary.Value(tag="video", image=image)]), x)

    def close(self, status: str) -> None:
        x = x_of(self.run, self.run.reached)
        if self.hparams_written and status != INTERRUPTED:  # the HParams dashboard's session status
            self.writer.file_writer.add_summary(_session_end(status), x)
        if status != FINISHED:
            self.writer.add_text("status", f"{status} at iteration {self.run.reached}", x)
        if self.lineage:
            self.writer.add_text("lineage", self.lineage_text(), x)
        self.writer.close()


SESSION_STATUS = {FINISHED: "STATUS_SUCCESS", FAILED: "STATUS_FAILURE"}
"""TensorBoard's HParams session status per ending. A run stopped by a signal writes none (the dashboard shows
its status as unknown) and a `status` text: TensorBoard keeps the first session end a folder holds, which would
hide the ending of the run resumed into it."""


def _session_end(status: str) -> Any:
    from tensorboardX.proto.api_pb2 import Status
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData, SessionEndInfo
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata

    content = HParamsPluginData(session_end_info=SessionEndInfo(status=Status.Value(SESSION_STATUS[status])),
                                version=0)
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="hparams",
                                                                      content=content.SerializeToString()))
    return Summary(value=[Summary.Value(tag="_hparams_/session_end_info", metadata=metadata)])


def gif_bytes(frames: list[np.ndarray], fps: int) -> bytes:
    """`frames` as an animated GIF (imageio's Pillow plugin, in memory)."""
    import imageio.v3 as iio

    return iio.imwrite("<bytes>", np.stack(frames), extension=".gif", plugin="pillow", duration=1000 / fps, loop=0)


class WandB(Sink):
    """A Weights & Biases run: `wandb.log(row, step=x)`, the hyperparameters and IR header (`ir_header`)
    as its config, videos as `wandb.Video`. Mode: WANDB_MODE if set, else online with WANDB_API_KEY and
    offline without (a run folder under `DIRECTORY/wandb/` to `wandb sync`). Project WANDB_PROJECT or
    `fragc`, name WANDB_NAME or the run's, id the run identity's (a resumed run continues it: resume="allow"),
    group WANDB_RUN_GROUP, else a member's configuration. Quiet (no console capture, no banner) unless
    WANDB_SILENT / WANDB_CONSOLE say otherwise. The exit code says how the run ended: 0, 1 (failed), 128 +
    the signal that stopped it. Inside a W&B run of your own, one run (not a population's members) logs to that
    one and leaves it open; that run keeps its own steps (W&B drops a step behind its latest), so x goes in as
    `env_steps`."""

    name = "wandb"

    @staticmethod
    def check() -> None:
        """WANDB_MODE, if set, is one W&B knows (else its pydantic error names no setting), before anything runs."""
        import wandb

        mode = os.environ.get("WANDB_MODE")
        field = getattr(wandb.Settings, "model_fields", {}).get("mode")
        known = typing.get_args(field.annotation) if field is not None else ()
        if mode and known and mode not in known:
            raise FragcError(f"--track wandb: WANDB_MODE is {mode!r}; W&B takes {', '.join(map(str, known))}")

    def open(self, run: Run, hparams: dict[str, Any], header: str) -> None:
        import wandb

        config = {**hparams, "ir_header": header}
        self.owned = wandb.run is None or self.member is not None
        if not self.owned:
            self.wb = wandb.run
            self.wb.config.update(config, allow_val_change=True)
            return
        settings: dict[str, Any] = {}
        if "WANDB_SILENT" not in os.environ:
            settings["silent"] = True
        if "WANDB_CONSOLE" not in os.environ:
            settings["console"] = "off"  # leave stdout alone (fragc run --json prints JSON there)
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        os.makedirs(self.directory, exist_ok=True)
        name = os.environ.get("WANDB_NAME") or self.label
        group = os.environ.get("WANDB_RUN_GROUP") or (self.member.group(self.identity.name) if self.member else None)
        run_id = self.identity.id + (f"-{self.key}" if self.key else "")
        self.wb = wandb.init(project=os.environ.get("WANDB_PROJECT") or "fragc", name=name, id=run_id,
                             resume="allow", group=group, dir=self.directory, config=config, mode=mode,
                             reinit="create_new", settings=wandb.Settings(**settings))
        if run.start:
            self.wb.config.update({"resumed_from": run.start}, allow_val_change=True)

    def write(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        for x, values in rows:
            if self.owned:
                self.wb.log(values, step=x)
            else:  # a run of yours keeps its own steps (W&B drops a step behind its latest): x as a value
                self.wb.log({**values, "env_steps": x})

    def video(self, x: int, path: str, frames: list[np.ndarray], fps: int) -> None:
        import wandb

        clip = wandb.Video(path, format=os.path.splitext(path)[1].lstrip(".").lower())
        self.wb.log({"video": clip}, step=x) if self.owned else self.wb.log({"video": clip, "env_steps": x})

    def close(self, status: str) -> None:
        if self.lineage:
            self.wb.summary["lineage"] = self.lineage_text()
        if self.owned:
            self.wb.finish(exit_code=128 + int(self.signum) if status == INTERRUPTED else int(status == FAILED))


class MLflow(Sink):
    """An MLflow run: params (the hyperparameters, values cut to 500 characters), metrics at step x (a
    population member's as `metric.member_i`: in a file store `metric/member_i` would clash with `metric`),
    the IR header as the artifact `ir_header.txt` and the run's description, videos as artifacts under
    `videos/`, and the run ended FINISHED, FAILED or KILLED (a signal stopped it). A resumed run continues its
    MLflow run (the run identity's id), RUNNING again; its params keep their first values (MLflow's params do not
    change), `resumed_from` goes in as the tag `fragc.resumed_from`. A population's member's run has the tags
    `fragc.run` (the population's name) and `fragc.group` (its configuration's). Store: MLFLOW_TRACKING_URI if set
    (a SQL store such as `sqlite:///mlflow.db` too), else the file store `DIRECTORY/mlruns` (MLflow 3 keeps that
    store only with MLFLOW_ALLOW_FILE_STORE=true, which this sets while it opens the store if you have not set it).
    Experiment MLFLOW_EXPERIMENT_NAME or `fragc`. Inside an active MLflow run of your own, one run logs to that
    one and leaves it open."""

    name = "mlflow"
    VALUE_CHARS = 500  # MLflow's param value limit was 500 characters before 2.x (now 6000)

    def open(self, run: Run, hparams: dict[str, Any], header: str) -> None:
        import mlflow
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        active = mlflow.active_run() if self.member is None else None
        self.owned = active is None
        if active is not None:
            self.client, self.run_id = MlflowClient(mlflow.get_tracking_uri()), active.info.run_id
        else:
            uri = os.environ.get("MLFLOW_TRACKING_URI") or _file_uri(os.path.join(self.directory, "mlruns"))
            with _file_store_allowed(uri):
                self.client = MlflowClient(uri)  # MLflow caches the store by its URI: opened once, here
            self.run_id = self._continued() or self._created()
            self.identity.mlflow[self.key] = self.run_id
        logged = self.client.get_run(self.run_id).data.params
        params = [Param(k[:250], _param_value(v, self.VALUE_CHARS)) for k, v in hparams.items() if k[:250] not in logged]
        for i in range(0, len(params), 100):  # MLflow's limit of params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        tags = [RunTag("fragc.resumed_from", str(run.start))] if run.start else []
        if self.owned:
            tags.append(RunTag("mlflow.note.content", f"```\n{header}\n```"))
        if self.member is not None:
            tags += [RunTag("fragc.run", self.identity.name), RunTag("fragc.group", self.member.group(self.identity.name))]
        if tags:
            self.client.log_batch(self.run_id, tags=tags)
        self.client.log_text(self.run_id, header + "\n", "ir_header.txt")

    def _continued(self) -> str | None:
        """The run identity's MLflow run, RUNNING again, if this store has it (a resumed run)."""
        run_id = self.identity.mlflow.get(self.key)
        if not run_id:
            return None
        try:
            self.client.get_run(run_id)
        except Exception:  # noqa: BLE001 - not in this store (another MLFLOW_TRACKING_URI): a run of its own
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def _created(self) -> str:
        """A new run; a new experiment's artifacts in `DIRECTORY/mlartifacts` when the store is a database (MLflow
        would put them in `./mlruns` of whatever folder the run starts in)."""
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "fragc"
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            uri = str(self.client.tracking_uri)
            database = "://" in uri and uri.split(":", 1)[0].split("+")[0] in ("sqlite", "postgresql", "mysql", "mssql")
            artifacts = _file_uri(os.path.join(self.directory, "mlartifacts")) if database else None
            experiment_id = self.client.create_experiment(experiment, artifact_location=artifacts)
        return self.client.create_run(experiment_id, run_name=self.label).info.run_id

    def write(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name.replace("/member_", ".member_"), value, now, x)  # the file store makes `a/b` a
                   for x, values in rows for name, value in values.items()]  # file in a folder `a`, clashing with `a`
        for i in range(0, len(metrics), 1000):  # MLflow's limit of metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def video(self, x: int, path: str, frames: list[np.ndarray], fps: int) -> None:
        self.client.log_artifact(self.run_id, path, "videos")

    def close(self, status: str) -> None:
        if self.lineage:
            self.client.set_tag(self.run_id, "fragc.lineage", self.lineage_text()[:5000])
        if self.owned:
            self.client.set_terminated(self.run_id, {FINISHED: "FINISHED", FAILED: "FAILED"}.get(status, "KILLED"))


def _param_value(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _file_uri(path: str) -> str:
    return Path(os.path.abspath(path)).as_uri()


@contextlib.contextmanager
def _file_store_allowed(uri: str) -> Iterator[None]:
    """MLFLOW_ALLOW_FILE_STORE=true while a file store opens, unless the user set it (MLflow 3 refuses the
    file store without it)."""
    if "MLFLOW_ALLOW_FILE_STORE" in os.environ or "://" in uri and not uri.startswith("file:"):
        yield
        return
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)


# ------------------------------------------------------------------ choosing them


SINKS: dict[str, tuple[type[Sink], str, str]] = {
    "tensorboard": (TensorBoard, "tensorboardX", "tensorboard"),
    "wandb": (WandB, "wandb", "wandb"),
    "mlflow": (MLflow, "mlflow", "mlflow"),
}
"""name -> (sink class, the package it imports, the fragc extra that installs it)."""

PROBE_TIMEOUT = 10.0
"""Seconds a tracking server has to answer before a run that logs to it is refused (`fragc run --track-timeout`)."""


def trackers(track: Any, directory: str | os.PathLike, prog: Any, run_info: dict | None = None,
             identity: RunIdentity | None = None, per_member: bool = True,
             timeout: float = PROBE_TIMEOUT) -> list[Action]:
    """The sinks `track` names, as actions writing under `directory`.

    track: "tensorboard", "wandb", "mlflow", comma-separated ("tensorboard,wandb") or as a list; an
      `Action` in the list is passed through as it is.
    identity: the run's name and ids in the trackers (default: a fresh one); `fragc.train` keeps it with the
      checkpoints, so that a resumed run continues its runs.
    per_member: a population's members as runs of their own (`NAME/config_K/seed_S`), one per member and
      sink; else one run with each metric also per member (`metric/member_i`).
    timeout: seconds a tracking server has to answer (`check_reachable`), else the run is refused.
    Each client is imported here, in every process, so that a missing one stops the run before it
    starts; process 0 alone opens and writes the sinks.
    """
    names, actions = sink_names(track, timeout)
    directory = os.fspath(directory)
    identity = identity or RunIdentity.fresh(prog, run_info, directory)
    population = members(prog, run_info) if per_member and prog is not None else []
    for name in names:
        cls = SINKS[name][0]
        actions += [cls(directory, prog, run_info, identity, m) for m in population] or [
            cls(directory, prog, run_info, identity)]
    return actions


def sink_names(track: Any, timeout: float = PROBE_TIMEOUT) -> tuple[list[str], list[Action]]:
    """(the sink names `track` holds, each checked: known, its client installed, its settings, its server
    answering within `timeout` seconds (`check_reachable`); the actions in it), before anything runs: `fragc run`
    calls it before compiling."""
    if isinstance(track, (str, Action)):
        track = [track]
    try:
        items = list(track)
    except TypeError:
        raise FragcError(f"track: expected sink names or a list of them, got {type(track).__name__}") from None
    names: list[str] = []
    actions: list[Action] = []
    for item in items:
        if isinstance(item, Action):
            actions.append(item)
            continue
        if not isinstance(item, str):
            raise FragcError(f"track: expected sink names ({', '.join(SINKS)}) or actions, got {item!r}")
        for name in (part.strip().lower() for part in item.split(",")):
            if name and name not in names:
                _check_name(name)
                names.append(name)
    for name in names:
        cls, package, extra = SINKS[name]
        _require(name, package, extra)
        check = getattr(cls, "check", None)
        if check is not None:
            check()
    check_reachable(names, timeout)
    return names, actions


def check_reachable(names: list[str], timeout: float = PROBE_TIMEOUT) -> None:
    """Refuse, in one line naming the URI, a tracking server that does not answer within `timeout` seconds:
    the clients retry for minutes (MLflow's requests: 279 s at an unreachable port) before failing, after the
    compiling. Only a network URI is probed (MLflow's http(s) MLFLOW_TRACKING_URI, W&B online's
    WANDB_BASE_URL); a file store, a database, W&B offline and a run of your own already open are not."""
    for name in names:
        endpoint = _endpoint(name)
        if endpoint is None or time.monotonic() - _answered.get(endpoint[0], -math.inf) < ANSWERED_S:
            continue
        uri, source = endpoint
        problem = probe(uri, timeout)
        if problem is not None:
            raise FragcError(f"--track {name}: the tracking server {_shown(uri)} ({source}) cannot be reached "
                             f"within {timeout:g} s: {problem}")
        _answered[uri] = time.monotonic()


ANSWERED_S = 300.0
"""A server that answered this long ago or less is not probed again: `fragc run` probes with its --track-timeout
before compiling, and `fragc.train` checks its sinks again with the default timeout (a slow server that answered
within the longer one is not refused then)."""

_answered: dict[str, float] = {}
"""URI -> when (time.monotonic) it last answered a probe."""


def _endpoint(name: str) -> tuple[str, str] | None:
    """(the network URI sink `name` will talk to, where it comes from), or None where it talks to none."""
    if name == "mlflow":
        uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        if not uri.lower().startswith(("http://", "https://")) or sys.modules["mlflow"].active_run() is not None:
            return None
        return uri, "MLFLOW_TRACKING_URI"
    if name == "wandb":
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        if mode in ("offline", "dryrun", "disabled") or sys.modules["wandb"].run is not None:
            return None
        uri = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
        return uri, "WANDB_BASE_URL" if os.environ.get("WANDB_BASE_URL") else "W&B online"
    return None


def probe(uri: str, timeout: float) -> str | None:
    """Why the http(s) server at `uri` does not answer a GET within `timeout` seconds, or None if it answers
    (any HTTP status counts: the server is there; so does a TLS handshake the client may judge otherwise). Through
    the proxies the environment names, as the clients' `requests` goes."""
    import ssl
    import urllib.error
    import urllib.parse
    import urllib.request

    try:
        parts = urllib.parse.urlsplit(uri)
        host = parts.hostname
        port = parts.port
    except ValueError as err:
        return f"not a URL ({err})"
    if not host:
        return "no host in the URL"
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    target = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path or "/", "", ""))  # without credentials
    try:
        with urllib.request.urlopen(urllib.request.Request(target, method="GET"), timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as err:
        reason = err.reason
        if isinstance(reason, ssl.SSLError):
            return None
        return _reason(reason)
    except (OSError, ValueError) as err:  # a timeout while reading, a reset connection, a malformed reply
        return _reason(err)


def _reason(err: Any) -> str:
    if isinstance(err, TimeoutError) or "timed out" in str(err):
        return "no answer (timed out)"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


def _shown(uri: str) -> str:
    """`uri` without a password in it."""
    return re.sub(r"//[^/@]*@", "//", uri)


def check_writable(folder: str | os.PathLike, what: str) -> None:
    """Refuse, in one line and before anything runs, a `folder` that cannot be written or made: it (or the
    nearest folder above it that exists) must be a writable folder. Nothing is made."""
    path = os.path.abspath(os.fspath(folder))
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise FragcError(f"cannot write {what} in '{folder}': '{probe}' is a file, not a folder")
    if (err := write_error(probe)) is not None:
        why = f" ({err.strerror})" if err.strerror and err.errno != errno.ENOENT else ""
        raise FragcError(f"cannot write {what} in '{folder}': '{probe}' is not writable{why}")


def _check_name(name: str) -> None:
    if name in SINKS:
        return
    close = difflib.get_close_matches(name, SINKS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise FragcError(f"unknown tracking sink '{name}'{hint}; known: {', '.join(SINKS)}")


def _require(name: str, package: str, extra: str) -> None:
    """Import `package` for sink `name`; one line naming the extra if it is not installed."""
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as err:
        if err.name != package:  # installed, but something it imports is missing
            raise FragcError(f"--track {name}: importing {package} failed: {err}") from err
        raise FragcError(f"--track {name} needs the {package} package: pip install 'fragc[{extra}]'") from None
    except ImportError as err:
        raise FragcError(f"--track {name}: importing {package} failed: {err}") from err
