"""Tracking sinks: every metric of a run against its env step, in TensorBoard, Weights & Biases or MLflow.

`fragc.train(..., track="tensorboard,wandb")` (and `fragc run ... --track`)
adds one periodic action (runtime/actions.py) per sink named. Each writes,
for every iteration row of every dispatch, each metric's mean over
environments (and population members; a population's members also as
`metric/member_i`) at x = the env steps reached after that iteration (the
iteration itself when the algorithm does not say its steps per iteration),
plus `steps_per_second` (env steps since the run started over its wall time)
once per dispatch. With the run it records its hyperparameters (the
algorithm's config, the policy, devices and `run_info`) and the header of the
printed IR (mesh, transfers, schedule).

Only process 0 writes. Each client is an optional extra, imported when its sink
is asked for (`trackers`, then inside the sink's methods: never when this
module is imported); one that is not installed is refused in one line with the
extra to install. docs/tracking.md says where each sink
writes and how to open what it wrote.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from fragc.ir.errors import FragcError
from fragc.runtime.actions import Action, Run
from fragc.runtime.reporting import config_dict

THROUGHPUT = "steps_per_second"
"""The throughput metric each sink adds once per dispatch (when the algorithm says its steps per iteration)."""


# ------------------------------------------------------------------ what every sink writes


def run_name(prog: Any, run_info: dict | None) -> str:
    """`ALGO-POLICY[-seedS]`: the TensorBoard folder, the W&B and MLflow run name. ALGO is `run_info["algo"]`
    (the CLI's algorithm spec, cut to its class or module name) or the algorithm's class name."""
    info = run_info or {}
    algo = str(info.get("algo") or type(prog.algo).__name__)
    algo = re.split(r"[:/\\]", algo)[-1].removesuffix(".py")
    name = f"{algo}-{prog.policy.name}" + (f"-seed{info['seed']}" if info.get("seed") is not None else "")
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def hyperparameters(prog: Any, run_info: dict | None, run: Run | None = None) -> dict[str, Any]:
    """The run's hyperparameters as one flat dict of JSON values: the algorithm config's fields (nested
    ones as `outer.inner`), then `algo` (its class), `policy`, `devices`, `population` (if any), and with
    `run` its `steps_per_iteration`, `iterations` and `resumed_from`, then `run_info`'s entries. One of
    these that a config field already names is logged as `run.NAME`."""
    params = _flatten(config_dict(prog.algo) or {})
    facts: dict[str, Any] = {"algo": f"{type(prog.algo).__module__}.{type(prog.algo).__qualname__}",
                             "policy": prog.policy.name, "devices": len(prog.devices)}
    if prog.population:
        facts["population"] = [int(s) for s in prog.population]
    if run is not None:
        facts.update(steps_per_iteration=run.steps_per_iteration, iterations=run.stop_at, resumed_from=run.start)
    facts.update(json.loads(json.dumps(run_info or {}, default=str)))
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


def points(run: Run, iteration: int, metrics: dict[str, np.ndarray]) -> list[tuple[int, dict[str, float]]]:
    """A dispatch's metrics (one row per iteration, a population's on axis 1) as (x, {name: value}) per
    iteration: each metric's mean over environments and members, a population member's mean as
    `name/member_i`, and `steps_per_second` with the last row."""
    axis = 1 if run.program.population else 0
    arrays = {k: np.asarray(v) for k, v in metrics.items()}
    arrays = {k: v for k, v in arrays.items() if v.ndim > axis and v.size}
    if not arrays:
        return []
    n = next(iter(arrays.values())).shape[axis]
    rows: list[tuple[int, dict[str, float]]] = []
    for j in range(n):
        at = iteration - n + 1 + j
        values: dict[str, float] = {}
        for name, v in arrays.items():
            row = np.take(v, j, axis=axis).astype(np.float64)
            values[name] = float(np.mean(row))
            if axis:
                for m in range(row.shape[0]):
                    values[f"{name}/member_{m}"] = float(np.mean(row[m]))
        rows.append((x_of(run, at), values))
    if run.steps_per_iteration:
        rows[-1][1][THROUGHPUT] = run.env_steps(iteration - run.start) / max(run.wall_s, 1e-9)
    return rows


def x_of(run: Run, iteration: int) -> int:
    """The x axis: env steps after `iteration`, or the iteration when steps per iteration are unknown."""
    return run.env_steps(iteration) if run.steps_per_iteration else iteration


class Sink(Action):
    """A tracking sink: on process 0, `open` at the start, `write` each dispatch's points, `close` at the
    end (`failed` when the run raised)."""

    name = ""
    """As `--track` names it."""

    def __init__(self, directory: str, prog: Any, run_info: dict | None):
        self.directory, self.prog, self.run_info = directory, prog, run_info
        self.active, self._outer = False, None

    def on_start(self, run: Run) -> None:
        self.run = run
        if not run.lead:
            return
        self._outer = sys.exc_info()[1]  # an exception being handled around the run is not the run failing
        try:
            self.open(run, hyperparameters(self.prog, self.run_info, run), ir_header(self.prog))
        except FragcError:
            raise
        except Exception as err:  # noqa: BLE001 - a client refusing its settings (a login, a store): one line
            first = (str(err).strip().splitlines() or [""])[0]
            raise FragcError(f"--track {self.name}: {type(err).__name__}: {first}") from err
        self.active = True

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        if self.active:
            rows = points(self.run, iteration, metrics)
            if rows:
                self.write(rows)

    def on_end(self, run: Run) -> None:
        if self.active:
            self.active = False
            err = sys.exc_info()[1]
            self.close(failed=err is not None and err is not self._outer)

    def open(self, run: Run, hparams: dict[str, Any], header: str) -> None:
        raise NotImplementedError

    def write(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        raise NotImplementedError

    def close(self, failed: bool) -> None:
        raise NotImplementedError


# ------------------------------------------------------------------ the sinks


class TensorBoard(Sink):
    """Event files (tensorboardX) in `DIRECTORY/tensorboard/RUN_NAME/`: a scalar per metric, the
    hyperparameters as a text table and in the HParams dashboard, the IR header as text. The folder
    shows one run: a fresh run hides what an earlier one wrote there, and a resumed run what was
    written after its checkpoint (TensorBoard's purge_step), as the metrics file is rewritten."""

    name = "tensorboard"

    def open(self, run: Run, hparams: dict[str, Any], header: str) -> None:
        from tensorboardX import SummaryWriter

        self.logdir = os.path.join(self.directory, "tensorboard", run_name(self.prog, self.run_info))
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

    def close(self, failed: bool) -> None:
        if self.hparams_written:  # the HParams dashboard's session status
            self.writer.file_writer.add_summary(_session_end(failed), x_of(self.run, self.run.reached))
        self.writer.close()


def _session_end(failed: bool) -> Any:
    from tensorboardX.proto.api_pb2 import Status
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData, SessionEndInfo
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata

    status = Status.Value("STATUS_FAILURE" if failed else "STATUS_SUCCESS")
    content = HParamsPluginData(session_end_info=SessionEndInfo(status=status), version=0)
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="hparams",
                                                                      content=content.SerializeToString()))
    return Summary(value=[Summary.Value(tag="_hparams_/session_end_info", metadata=metadata)])


class WandB(Sink):
    """A Weights & Biases run: `wandb.log(row, step=x)`, the hyperparameters and IR header (`ir_header`)
    as its config. Mode: WANDB_MODE if set, else online with WANDB_API_KEY and offline without (a run
    folder under `DIRECTORY/wandb/` to `wandb sync`). Project WANDB_PROJECT or `fragc`, name
    WANDB_NAME or `run_name`. Quiet (no console capture, no banner) unless WANDB_SILENT / WANDB_CONSOLE
    say otherwise. Each `train` call is its own W&B run: a resumed one starts at its checkpoint's step
    (`resumed_from` in its config; WANDB_RUN_GROUP groups them). Inside a W&B run of your own, it logs
    to that one and leaves it open; that run keeps its own steps (W&B drops a step behind its latest),
    so x goes in as `env_steps`."""

    name = "wandb"

    def open(self, run: Run, hparams: dict[str, Any], header: str) -> None:
        import wandb

        config = {**hparams, "ir_header": header}
        self.owned = wandb.run is None
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
        name = os.environ.get("WANDB_NAME") or run_name(self.prog, self.run_info)
        self.wb = wandb.init(project=os.environ.get("WANDB_PROJECT") or "fragc", name=name, dir=self.directory,
                             config=config, mode=mode, settings=wandb.Settings(**settings))

    def write(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        for x, values in rows:
            if self.owned:
                self.wb.log(values, step=x)
            else:  # a run of yours keeps its own steps (W&B drops a step behind its latest): x as a value
                self.wb.log({**values, "env_steps": x})

    def close(self, failed: bool) -> None:
        if self.owned:
            self.wb.finish(exit_code=1 if failed else 0)


class MLflow(Sink):
    """An MLflow run: params (the hyperparameters, values cut to 500 characters), metrics at step x (a
    population member's as `metric.member_i`: in a file store `metric/member_i` would clash with `metric`),
    the IR header as the artifact `ir_header.txt` and the run's description. Store: MLFLOW_TRACKING_URI
    if set, else the file store `DIRECTORY/mlruns` (MLflow 3 keeps that store only with
    MLFLOW_ALLOW_FILE_STORE=true, which this sets while it opens the store if you have not set it).
    Experiment MLFLOW_EXPERIMENT_NAME or `fragc`. Inside an active MLflow run of your own, it logs
    to that one and leaves it open. Each `train` call is its own MLflow run."""

    name = "mlflow"
    VALUE_CHARS = 500  # MLflow's param value limit was 500 characters before 2.x (now 6000)

    def open(self, run: Run, hparams: dict[str, Any], header: str) -> None:
        import mlflow
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        active = mlflow.active_run()
        self.owned = active is None
        if active is not None:
            self.client, self.run_id = MlflowClient(mlflow.get_tracking_uri()), active.info.run_id
        else:
            uri = os.environ.get("MLFLOW_TRACKING_URI") or _file_uri(os.path.join(self.directory, "mlruns"))
            with _file_store_allowed(uri):
                self.client = MlflowClient(uri)  # MLflow caches the store by its URI: opened once, here
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "fragc"
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
            self.run_id = self.client.create_run(experiment_id, run_name=run_name(self.prog, self.run_info)).info.run_id
        params = [Param(k[:250], _param_value(v, self.VALUE_CHARS)) for k, v in hparams.items()]
        for i in range(0, len(params), 100):  # MLflow's limit of params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        if self.owned:
            self.client.log_batch(self.run_id, tags=[RunTag("mlflow.note.content", f"```\n{header}\n```")])
        self.client.log_text(self.run_id, header + "\n", "ir_header.txt")

    def write(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name.replace("/member_", ".member_"), value, now, x)  # the file store makes `a/b` a
                   for x, values in rows for name, value in values.items()]  # file in a folder `a`, clashing with `a`
        for i in range(0, len(metrics), 1000):  # MLflow's limit of metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def close(self, failed: bool) -> None:
        if self.owned:
            self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


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


def trackers(track: Any, directory: str | os.PathLike, prog: Any, run_info: dict | None = None) -> list[Action]:
    """The sinks `track` names, as actions writing under `directory`.

    track: "tensorboard", "wandb", "mlflow", comma-separated ("tensorboard,wandb") or as a list; an
      `Action` in the list is passed through as it is.
    Each client is imported here, in every process, so that a missing one stops the run before it
    starts; process 0 alone opens and writes the sinks.
    """
    if isinstance(track, (str, Action)):
        track = [track]
    try:
        items = list(track)
    except TypeError:
        raise FragcError(f"track: expected sink names or a list of them, got {type(track).__name__}") from None
    directory = os.fspath(directory)
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
        actions.append(cls(directory, prog, run_info))
    return actions


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
