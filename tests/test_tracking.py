"""Tracking sinks (src/fragc/sinks/tracking.py): one short run into TensorBoard, W&B (offline) and MLflow at once, each
read back with its own reader (not a mocked client): the same numbers as the run's history at the same env
steps, the hyperparameters, and the IR header."""

import contextlib
import functools
import glob
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import struct
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

import fragc
import fragc.algos
from fragc.sinks import tracking
from fragc.runtime.actions import Run
from fragc.ir.sweep import SweepState
from fragc.runtime.checkpoint import Checkpointer

if importlib.util.find_spec("imageio") is None or importlib.util.find_spec("pygame") is None:
    pytest.skip("videos to the trackers need the video extra: pip install 'fragc[video]'", allow_module_level=True)
from fragc.sinks.video import write_video  # noqa: E402

CLIENTS = ("tensorboardX", "tensorboard", "wandb", "mlflow")
pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in CLIENTS),
                                reason=f"needs the tracking clients ({', '.join(CLIENTS)}): pip install 'fragc[track]'")

ITERATIONS = 4  # 2 dispatches of 2
STEPS = 4 * 8  # env steps per iteration: num_envs * num_steps
RUN_INFO = {"algo": "ppo", "seed": 0}
NAME = r"CartPole-v1__ppo__single__0__\d{10}(-\d+)?"
"""A run's name: ENV__ALGO__POLICY__SEED__START (the Unix time it started)."""
VIDEO = [np.full((16, 24, 3), 40 * i, np.uint8) for i in range(3)]
"""The frames of the video `Videos` writes at the run's end."""


def algo(**changes):
    return fragc.algos.make("ppo", num_envs=4, num_steps=8, num_minibatches=1, update_epochs=1, hidden=8,
                            total_steps=ITERATIONS * STEPS, **changes)


@functools.cache
def program() -> fragc.Program:
    return fragc.compile(algo(), "single", iterations_per_dispatch=2)


class Videos(fragc.actions.Action):
    """What `CaptureVideo` does for the trackers, without drawing (tests/test_video.py draws): a video (a .gif of
    `VIDEO`) at the run's end, handed to `sinks`, which `fragc.train` fills with its tracking sinks."""

    every, member = ITERATIONS, 0

    def __init__(self, folder):
        self.folder, self.sinks = folder, []

    def on_state(self, iteration, state, delays):
        path = str(self.folder / "videos" / f"iteration_{iteration:07d}.gif")
        write_video(VIDEO, path, 10)
        for sink in self.sinks:
            sink.on_video(iteration, path, VIDEO, 10)


def run_folder(folder) -> str:
    """The one run's TensorBoard folder under `folder/tensorboard`, its name checked."""
    [name] = os.listdir(folder / "tensorboard")
    assert re.fullmatch(NAME, name), name
    return name


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """(folder, TrainResult, stdout) of one run tracked into all three sinks, W&B offline."""
    env = pytest.MonkeyPatch()
    env.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_GROUP", "WANDB_SILENT", "WANDB_CONSOLE",
                 "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE"):
        env.delenv(name, raising=False)
    folder = tmp_path_factory.mktemp("track")
    prog = program()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            result = fragc.train(prog, prog.init(0), ITERATIONS, track="tensorboard, wandb,mlflow", track_dir=folder,
                                 run_info=RUN_INFO, actions=[Videos(folder)])
        assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # set only while the store opened
    finally:
        env.undo()
    return folder, result, out.getvalue()


def expected(result, name):
    """{env steps: value} of metric `name` in the run's history."""
    return {(i + 1) * STEPS: float(v) for i, v in enumerate(result.history[name])}


def assert_same(read: dict, want: dict):
    assert sorted(read) == sorted(want)
    np.testing.assert_allclose([read[x] for x in sorted(want)], [want[x] for x in sorted(want)], rtol=1e-6)


# ------------------------------------------------------------------ TensorBoard


def tensorboard_run(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def tensorboard_text(acc, tag):
    from tensorboard.util.tensor_util import make_ndarray

    return make_ndarray(acc.Tensors(f"{tag}/text_summary")[-1].tensor_proto).item().decode()


def test_tensorboard_scalars_hyperparameters_and_ir_header(tracked):
    from tensorboard.plugins.hparams import plugin_data_pb2

    folder, result, _ = tracked
    acc = tensorboard_run(folder / "tensorboard" / run_folder(folder))
    assert set(result.history) <= set(acc.Tags()["scalars"])
    for name in result.history:
        assert_same({e.step: e.value for e in acc.Scalars(name)}, expected(result, name))
    assert [e.step for e in acc.Scalars("steps_per_second")] == [2 * STEPS, 4 * STEPS]  # once per dispatch
    assert "| lr | 0.00025 |" in tensorboard_text(acc, "hyperparameters")
    header = tensorboard_text(acc, "ir_header")
    assert "// fragc.ir · ppo · after" in header and "schedule fused iterations_per_dispatch=2" in header
    hparams = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["lr"].number_value == pytest.approx(0.00025)
    assert start.hparams["policy"].string_value == "single"
    end = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_end_info"]).session_end_info
    assert end.status == 1  # STATUS_SUCCESS


def test_tensorboard_video_is_an_animated_gif(tracked):
    """A video capture's video at the run's end, in TensorBoard as an animated GIF image (tensorboardX's add_video's
    form) at its env step: the frames given."""
    from PIL import Image, ImageSequence

    folder, _, _ = tracked
    acc = tensorboard_run(folder / "tensorboard" / run_folder(folder))
    [image] = acc.Images("video")
    assert (image.step, image.width, image.height) == (ITERATIONS * STEPS, 24, 16)
    with Image.open(io.BytesIO(image.encoded_image_string)) as gif:
        frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(gif)]
    np.testing.assert_array_equal(frames, VIDEO)


def test_eval_return_only_where_it_evaluated():
    """eval_every=3: the iterations run before the 1st, 4th, 7th, ... evaluated (src/fragc/algos/evaluation.py); eval_return
    (the latest evaluation's, every row) is written at those only, the other metrics at every iteration."""
    prog = types.SimpleNamespace(population=(), algo=types.SimpleNamespace(config=types.SimpleNamespace(eval_every=3)))
    run = Run(prog, start=2, stop_at=6, steps_per_iteration=10, lead=True)
    rows = tracking.points(run, 6, {"eval_return": np.array([5.0, 7.0, 7.0, 7.0]), "loss": np.arange(4.0)})
    assert [(x, v.get("eval_return")) for x, v in rows] == [(30, None), (40, 7.0), (50, None), (60, None)]
    assert [v["loss"] for _, v in rows] == [0.0, 1.0, 2.0, 3.0]


def test_tensorboard_resumed_run_replaces_the_steps_after_its_checkpoint(tracked, tmp_path):
    """A run resumed at iteration 2 in the same folder: TensorBoard shows iterations 1-2 from the first run
    and 3-4 from the resumed one (purge_step), not both runs' points at iterations 3-4."""
    folder, first, _ = tracked
    shutil.copytree(folder / "tensorboard", tmp_path / "tensorboard")
    prog = program()
    identity = tracking.RunIdentity.fresh(prog, RUN_INFO)
    assert identity.continue_from({"name": run_folder(folder), "id": "x"})  # as a checkpoint stores it
    sinks = tracking.trackers("tensorboard", tmp_path, prog, RUN_INFO, identity)
    _, resumed = prog.run(first.state, 2, sinks, start=2)
    acc = tensorboard_run(tmp_path / "tensorboard" / run_folder(folder))
    want = expected(first, "loss")
    want.update({(3 + i) * STEPS: float(v) for i, v in enumerate(resumed["loss"])})
    assert_same({e.step: e.value for e in acc.Scalars("loss")}, want)


# ------------------------------------------------------------------ Weights & Biases


def wandb_records(path):
    """The records of an offline run's `.wandb` file (LevelDB log framing: 32 KiB blocks of records with a
    7-byte header: CRC-32, length, type 1 whole / 2 first / 3 middle / 4 last), as wandb's protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def _key(item):
    return item.key or ".".join(item.nested_key)


def test_wandb_offline_history_config_and_ir_header(tracked):
    folder, result, stdout = tracked
    assert stdout == ""  # nothing of W&B's on stdout (fragc run --json prints JSON there)
    [path] = glob.glob(str(folder / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, config, name = {}, {}, None
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in record.history.item}
            history.setdefault(row["_step"], {}).update(row)
        elif kind == "run":
            name = record.run.display_name
            config.update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({_key(i): json.loads(i.value_json) for i in record.config.update})
    assert re.fullmatch(NAME, name)
    for metric in result.history:
        assert_same({step: row[metric] for step, row in history.items() if metric in row}, expected(result, metric))
    last = history[ITERATIONS * STEPS]  # a wandb.Video of the .gif, in the run's media
    assert last["video._type"] == "video-file" and last["video.path"].endswith(".gif")
    [media] = glob.glob(str(folder / "wandb" / "offline-run-*" / "files" / last["video.path"]))
    assert open(media, "rb").read() == (folder / "videos" / "iteration_0000004.gif").read_bytes()
    assert config["lr"] == pytest.approx(0.00025) and config["policy"] == "single" and config["seed"] == 0
    assert config["ir_header"].startswith("// fragc.ir · ppo · after")


# ------------------------------------------------------------------ MLflow


def test_mlflow_metrics_params_and_ir_header(tracked, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    folder, result, _ = tracked
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 opens a file store only with it
    client = MlflowClient((folder / "mlruns").as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("fragc").experiment_id])
    assert re.fullmatch(NAME, run.info.run_name) and run.info.status == "FINISHED"
    for metric in result.history:
        assert_same({m.step: m.value for m in client.get_metric_history(run.info.run_id, metric)},
                    expected(result, metric))
    assert run.data.params["lr"] == "0.00025" and run.data.params["policy"] == "single"
    header = mlflow.artifacts.load_text(f"{run.info.artifact_uri}/ir_header.txt")
    assert header.startswith("// fragc.ir · ppo · after")
    [video] = client.list_artifacts(run.info.run_id, "videos")
    assert video.path == "videos/iteration_0000004.gif"
    assert video.file_size == os.path.getsize(folder / "videos" / "iteration_0000004.gif")


# ------------------------------------------------------------------ what the sinks share


def test_population_members_and_unknown_steps():
    """A population's rows on axis 1: each row's mean over members and environments, and each member's;
    x is the iteration where the steps per iteration are unknown."""
    run = Run(types.SimpleNamespace(population=(0, 1)), start=4, stop_at=6, steps_per_iteration=0, lead=True)
    returns = np.array([[[1.0, 3.0], [5.0, 7.0]], [[2.0, 2.0], [0.0, 0.0]]])  # member, iteration, environment
    assert tracking.points(run, 6, {"episode_return": returns}) == [
        (5, {"episode_return": 2.0, "episode_return/member_0": 2.0, "episode_return/member_1": 2.0}),
        (6, {"episode_return": 3.0, "episode_return/member_0": 6.0, "episode_return/member_1": 0.0})]
    run = Run(types.SimpleNamespace(population=()), start=0, stop_at=2, steps_per_iteration=10, lead=True)
    rows = tracking.points(run, 2, {"loss": np.array([1.0, 2.0])})
    assert [x for x, _ in rows] == [10, 20] and tracking.THROUGHPUT in rows[1][1]


def test_mlflow_population_members(tmp_path, monkeypatch):
    """A population's members in MLflow as `metric.member_i` (its file store makes `metric/member_i` a file in a
    folder `metric`, which clashes with the metric itself)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    [sink] = tracking.trackers("mlflow", tmp_path, program(), RUN_INFO)
    run = Run(types.SimpleNamespace(population=(0, 1)), start=0, stop_at=1, steps_per_iteration=STEPS, lead=True)
    sink.on_start(run)
    sink.on_metrics(1, {"loss": np.array([[1.0], [3.0]])}, None)
    sink.on_end(run)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    for name, value in [("loss", 2.0), ("loss.member_0", 1.0), ("loss.member_1", 3.0)]:
        assert [(m.step, m.value) for m in client.get_metric_history(sink.run_id, name)] == [(STEPS, value)]


def test_only_the_lead_process_writes(tmp_path):
    [sink] = tracking.trackers("tensorboard", tmp_path, None)
    run = Run(types.SimpleNamespace(population=()), start=0, stop_at=2, steps_per_iteration=10, lead=False)
    sink.on_start(run)
    sink.on_metrics(2, {"loss": np.array([1.0, 2.0])}, None)
    sink.on_end(run)
    assert not os.listdir(tmp_path)


def test_unknown_sink_and_missing_package(monkeypatch, tmp_path):
    with pytest.raises(fragc.FragcError) as err:
        tracking.trackers("tensorboard,tensorbord", tmp_path, None)
    assert str(err.value) == ("unknown tracking sink 'tensorbord' (did you mean 'tensorboard'?); "
                              "known: tensorboard, wandb, mlflow")
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(fragc.FragcError) as err:
        tracking.trackers(["tensorboard", "wandb"], tmp_path, None)
    assert str(err.value) == "--track wandb needs the wandb package: pip install 'fragc[wandb]'"
    mine = fragc.actions.StopAtReturn(100.0)
    assert tracking.trackers([mine], tmp_path, None) == [mine]


class Fails(fragc.actions.Action):
    def on_metrics(self, iteration, metrics, queued):
        raise RuntimeError("a user's action failing")


def test_a_failed_run_is_closed_as_failed(tmp_path):
    """The sink closes on failure too (on_end), marking the run failed: TensorBoard's HParams session status."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    prog = program()
    with pytest.raises(RuntimeError, match="failing"):
        fragc.train(prog, prog.init(0), 2, track="tensorboard", track_dir=tmp_path, actions=[Fails()])
    [name] = os.listdir(tmp_path / "tensorboard")
    assert re.fullmatch(r"CartPole-v1__PPO__single__\d{10}", name)  # no run_info: the class, no seed
    acc = tensorboard_run(tmp_path / "tensorboard" / name)
    assert [e.step for e in acc.Scalars("loss")] == [STEPS, 2 * STEPS]
    end = acc.PluginTagToContent("hparams")["_hparams_/session_end_info"]
    assert plugin_data_pb2.HParamsPluginData.FromString(end).session_end_info.status == 2  # STATUS_FAILURE


# ------------------------------------------------------------------ run identity: reruns, interruptions, resuming


class InMemory(Checkpointer):
    """Checkpoints kept in a dict (what `train` asks of a Checkpointer, without orbax): the state, delays and
    metadata each save is given, as JSON for the metadata, as a checkpoint stores it."""

    def __init__(self, directory):
        self.directory, self.saved = str(directory), {}

    def steps(self):
        return sorted(self.saved)

    def save(self, iteration, state, delays, meta):
        self.saved[iteration] = (state, delays, json.loads(json.dumps(meta)))

    def restore_latest(self, like_state, like_delays, run=None):
        state, delays, meta = self.saved[max(self.saved)]
        return state, delays, {**meta, "iteration": max(self.saved)}

    def close(self):
        pass


class SignalAfterFirstDispatch(fragc.actions.Action):
    """SIGTERM to this process as the first dispatch is queued: the run stops gracefully after it."""

    def on_dispatch(self, iteration, state):
        if iteration == 2:
            os.kill(os.getpid(), signal.SIGTERM)


def session_status(acc):
    from tensorboard.plugins.hparams import plugin_data_pb2

    hparams = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"]).session_start_info
    end = hparams.get("_hparams_/session_end_info")  # none: STATUS_UNKNOWN
    return start.hparams, plugin_data_pb2.HParamsPluginData.FromString(end).session_end_info.status if end else 0


def wandb_run(path):
    """(run id, exit code) of an offline W&B run file."""
    run_id = code = None
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "exit":
            code = record.exit.exit_code
    return run_id, code


@pytest.fixture(scope="module")
def rerun(tracked, tmp_path_factory):
    """A second run into the first run's tracking folder (a copy of it), stopped by SIGTERM after its first dispatch
    (with an in-memory checkpoint), what the trackers said then, and the run resumed to its end."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("rerun")
    shutil.copytree(tracked[0] / "tensorboard", folder / "tensorboard")
    first = run_folder(tracked[0])
    prog, memory = program(), InMemory(folder / "checkpoints")
    env = pytest.MonkeyPatch()
    env.setenv("WANDB_MODE", "offline")
    env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for name in ("WANDB_API_KEY", "WANDB_NAME", "WANDB_RUN_GROUP", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        env.delenv(name, raising=False)
    track = dict(track="tensorboard,wandb,mlflow", track_dir=folder, run_info=RUN_INFO, checkpoint_dir=memory)
    try:
        with pytest.raises(fragc.runtime.stopping.Stopped, match="SIGTERM at iteration 2"):
            fragc.train(prog, prog.init(0), ITERATIONS, actions=[SignalAfterFirstDispatch()], **track)
        [name] = set(os.listdir(folder / "tensorboard")) - {first}
        [wandb_file] = glob.glob(str(folder / "wandb" / "offline-run-*" / "run-*.wandb"))
        client = MlflowClient((folder / "mlruns").as_uri())
        [stopped] = client.search_runs([client.get_experiment_by_name("fragc").experiment_id])
        acc = tensorboard_run(folder / "tensorboard" / name)
        interrupted = dict(tensorboard=session_status(acc)[1], text=tensorboard_text(acc, "status"),
                           wandb=wandb_run(wandb_file), mlflow=stopped.info.status)
        result = fragc.train(prog, prog.init(0), ITERATIONS, resume=True, **track)
    finally:
        env.undo()
    return folder, first, name, memory, interrupted, stopped.info.run_id, result


def test_a_rerun_is_a_second_run_with_its_own_hyperparameters(tracked, tmp_path):
    """Issue 46's check: a rerun with another lr into the same folder appears in TensorBoard as a second run (its
    own name: environment, algorithm, policy, seed, start time; `-2` if it started in the same second), each with
    its own lr in the HParams dashboard. The rerun's sinks are driven by hand, as `Program.run` drives them, for
    the config of lr 1e-3 (not compiled: the sinks read its config)."""
    folder, _, _ = tracked
    shutil.copytree(folder / "tensorboard", tmp_path / "tensorboard")
    first = run_folder(folder)
    base = program()
    prog = types.SimpleNamespace(algo=algo(lr=1e-3), policy=base.policy, devices=base.devices, ir=base.ir,
                                 population=())
    [sink] = tracking.trackers("tensorboard", tmp_path, prog, RUN_INFO)
    run = Run(prog, start=0, stop_at=1, steps_per_iteration=STEPS, lead=True)
    sink.on_start(run)
    sink.on_metrics(1, {"loss": np.array([1.0])}, None)
    sink.on_end(run)
    [name] = set(os.listdir(tmp_path / "tensorboard")) - {first}
    assert re.fullmatch(NAME, name)
    lrs = {run: session_status(tensorboard_run(tmp_path / "tensorboard" / run))[0]["lr"].number_value
           for run in (first, name)}
    assert lrs == {first: pytest.approx(0.00025), name: pytest.approx(0.001)}


def test_an_interrupted_run_is_recorded_as_such(rerun):
    """SIGTERM's graceful stop: not STATUS_SUCCESS in TensorBoard (no session end: unknown; a `status` text), W&B's
    exit code 128 + 15, MLflow's KILLED."""
    _, _, _, memory, interrupted, _, _ = rerun
    assert interrupted["tensorboard"] == 0 and interrupted["text"] == "interrupted at iteration 2"
    assert interrupted["wandb"][1] == 128 + signal.SIGTERM
    assert interrupted["mlflow"] == "KILLED"
    assert memory.saved[2][2]["tracking"]["mlflow"] == {"": rerun[5]}  # the checkpoint knows the MLflow run


def test_a_resumed_run_continues_the_same_runs(rerun):
    """Resumed from its checkpoint, the run writes into the same TensorBoard folder (one curve of 4 points), the same
    W&B run id (a second offline folder of it) and the same MLflow run, which ends FINISHED."""
    from mlflow.tracking import MlflowClient

    folder, first, name, memory, interrupted, run_id, result = rerun
    assert sorted(os.listdir(folder / "tensorboard")) == sorted([first, name])
    acc = tensorboard_run(folder / "tensorboard" / name)
    assert [e.step for e in acc.Scalars("loss")] == [STEPS, 2 * STEPS, 3 * STEPS, 4 * STEPS]
    assert session_status(acc)[1] == 1  # STATUS_SUCCESS, now that it ran to its end
    runs = [wandb_run(p) for p in sorted(glob.glob(str(folder / "wandb" / "offline-run-*" / "run-*.wandb")))]
    assert len(runs) == 2 and {r[0] for r in runs} == {interrupted["wandb"][0]} and sorted(r[1] for r in runs) == [0, 143]
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        client = MlflowClient((folder / "mlruns").as_uri())
        [run] = client.search_runs([client.get_experiment_by_name("fragc").experiment_id])
        history = client.get_metric_history(run_id, "loss")
    finally:
        del os.environ["MLFLOW_ALLOW_FILE_STORE"]
    assert (run.info.run_id, run.info.status, run.data.tags["fragc.resumed_from"]) == (run_id, "FINISHED", "2")
    assert run.data.params["lr"] == "0.00025" and run.data.params["resumed_from"] == "0"  # params keep their first values
    resumed = {m.step: m.value for m in history if m.step > 2 * STEPS}
    assert_same(resumed, {(3 + i) * STEPS: float(v) for i, v in enumerate(result.history["loss"])})


# ------------------------------------------------------------------ a population's members as runs of their own


def test_population_members_are_runs_of_their_own(tmp_path, monkeypatch):
    """A population of 2 configurations x 2 seeds (run seed 5): a TensorBoard folder NAME/config_K/seed_S and an
    MLflow run per member, each with its own starting lr and seed and its own metrics; under PBT its current lr
    (`hyper/lr`) and `lineage`, and when the lineage changed."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    base = program()
    prog = types.SimpleNamespace(algo=base.algo, policy=base.policy, devices=base.devices, ir=base.ir,
                                 population=(0, 1, 0, 1),
                                 module=types.SimpleNamespace(hyperparameters=(("lr", (1e-3, 1e-3, 3e-4, 3e-4)),)))
    sinks = tracking.trackers("tensorboard,mlflow", tmp_path, prog, {"algo": "ppo", "seed": 5})
    name = sinks[0].identity.name
    assert [s.label for s in sinks[:4]] == [f"{name}/config_{k}/seed_{s}" for k in (0, 1) for s in (5, 6)]
    run = Run(prog, start=0, stop_at=4, steps_per_iteration=STEPS, lead=True)
    losses = np.arange(16.0).reshape(4, 4, 1)  # member, iteration, environment
    lineages = [[0, 1, 2, 3], [0, 1, 0, 3]]  # member 2 copies member 0 in the second dispatch (PBT)
    lrs = [[1e-3, 1e-3, 3e-4, 3e-4], [1e-3, 1e-3, 1.2e-3, 3e-4]]
    for sink in sinks:
        sink.on_start(run)
    for d in range(2):
        state = SweepState(None, {"lr": jnp.asarray(lrs[d])}, jnp.asarray(lineages[d]))
        queued = [sink.on_dispatch(2 * d + 2, state) for sink in sinks]
        for sink, q in zip(sinks, queued):
            sink.on_metrics(2 * d + 2, {"loss": losses[:, 2 * d:2 * d + 2]}, q)
    for sink in sinks:
        sink.on_end(run)
    acc = tensorboard_run(tmp_path / "tensorboard" / name / "config_1" / "seed_5")  # member 2
    hparams, status = session_status(acc)
    assert (hparams["lr"].number_value, hparams["seed"].number_value, hparams["config"].number_value,
            hparams["member"].number_value) == (pytest.approx(3e-4), 5, 1, 2)
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [((i + 1) * STEPS, 8.0 + i) for i in range(4)]
    assert [(e.step, e.value) for e in acc.Scalars("lineage")] == [(2 * STEPS, 2), (4 * STEPS, 0)]
    assert [e.value for e in acc.Scalars("hyper/lr")] == pytest.approx([3e-4, 1.2e-3])
    assert tensorboard_text(acc, "lineage") == f"from x={2 * STEPS}: member 2's training; from x={4 * STEPS}: member 0's training"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("fragc").experiment_id])}
    assert sorted(runs) == sorted(s.label for s in sinks[:4])
    member = runs[f"{name}/config_1/seed_6"]
    assert member.data.params["lr"] == "0.0003" and member.data.tags["fragc.group"] == f"{name}/config_1"
    assert [m.value for m in client.get_metric_history(member.info.run_id, "loss")] == [12.0, 13.0, 14.0, 15.0]


# ------------------------------------------------------------------ refused before anything is compiled or made


def test_bad_settings_refused_before_compiling_in_one_line(tmp_path, monkeypatch, capsys):
    """WANDB_MODE=bogus (W&B's own error names no setting), an unwritable --track-dir, and --capture-video into an
    unwritable folder: one line each, before compiling, and no folder made."""
    from fragc.cli import commands, run as run_command

    def compiled(*args, **kwargs):
        raise AssertionError("compiled")

    monkeypatch.setattr(run_command, "compile_algo", compiled)
    base = ["run", "ppo", "--num-envs", "4", "--num-steps", "8", "--iterations", "1", "--no-cache"]
    monkeypatch.setenv("WANDB_MODE", "bogus")
    assert commands.main(base + ["--track", "wandb", "--track-dir", str(tmp_path / "t"),
                                 "--checkpoint-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fragc: error: --track wandb: WANDB_MODE is 'bogus'; W&B takes online, offline")
    assert err.count("\n") == 1 and not os.listdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    (tmp_path / "file").write_text("")
    for bad in (["--track", "tensorboard", "--track-dir", str(tmp_path / "file" / "t")],
                ["--capture-video", "--eval-every", "1", "--track-dir", "/proc/nope"]):
        assert commands.main(base + bad) == 2
        err = capsys.readouterr().err
        assert "is a file, not a folder" in err or "'/proc' is not writable" in err, err
        assert err.count("\n") == 1 and os.listdir(tmp_path) == ["file"]


@pytest.mark.slow
def test_mlflow_sql_store(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI=sqlite:///... works with the mlflow extra as shipped (its SQLAlchemy store; slow: MLflow
    makes the database's tables with some thirty migrations, 10-30 s): the metrics read back, the artifacts in
    TRACK_DIR/mlartifacts, not in the working folder."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    [sink] = tracking.trackers("mlflow", tmp_path / "track", program(), RUN_INFO)
    run = Run(types.SimpleNamespace(population=()), start=0, stop_at=1, steps_per_iteration=STEPS, lead=True)
    sink.on_start(run)
    sink.on_metrics(1, {"loss": np.array([2.5])}, None)
    sink.on_end(run)
    client = MlflowClient(uri)
    assert [(m.step, m.value) for m in client.get_metric_history(sink.run_id, "loss")] == [(STEPS, 2.5)]
    assert client.get_run(sink.run_id).info.status == "FINISHED"
    assert os.listdir(tmp_path / "track" / "mlartifacts") and not os.path.exists(tmp_path / "mlruns")
