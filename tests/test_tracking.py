"""Tracking sinks (fragc/sinks/tracking.py): one short run into TensorBoard, W&B (offline) and MLflow at once, each
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

import numpy as np
import pytest

import fragc
import fragc.algos
from fragc.sinks import tracking
from fragc.runtime.actions import Run
from fragc.runtime.checkpoint import Checkpointer

if importlib.util.find_spec("imageio") is None or importlib.util.find_spec("pygame") is None:
    pytest.skip("videos to the trackers need the video extra: pip install 'fragc[video]'", allow_module_level=True)
from fragc.sinks.video import CaptureVideo  # noqa: E402

CLIENTS = ("tensorboardX", "tensorboard", "wandb", "mlflow")
pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in CLIENTS),
                                reason=f"needs the tracking clients ({', '.join(CLIENTS)}): pip install 'fragc[track]'")

ITERATIONS = 4  # 2 dispatches of 2
STEPS = 4 * 8  # env steps per iteration: num_envs * num_steps
RUN_INFO = {"algo": "ppo", "seed": 0}
NAME = r"CartPole-v1__ppo__single__0__\d{10}(-\d+)?"
"""A run's name: ENV__ALGO__POLICY__SEED__START (the Unix time it started)."""
EVALUATED = [STEPS, 3 * STEPS]
"""eval_every=2: iterations 1 and 3 evaluate (the iterations run before them: 0 and 2)."""
VIDEO_FRAMES = 6
"""The video CaptureVideo(4, max_steps=5) records at the run's end: an episode of 5 steps is 6 frames."""


@functools.cache
def program(lr: float = 0.00025) -> fragc.Program:
    algo = fragc.algos.make("ppo", num_envs=4, num_steps=8, num_minibatches=1, update_epochs=1, hidden=8,
                            total_steps=ITERATIONS * STEPS, eval_every=2, eval_episodes=1, lr=lr)
    return fragc.compile(algo, "single", iterations_per_dispatch=2)


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
            capture = CaptureVideo(4, folder, max_steps=5)  # its video goes to the sinks too
            result = fragc.train(prog, prog.init(0), ITERATIONS, track="tensorboard, wandb,mlflow", track_dir=folder,
                                 run_info=RUN_INFO, actions=[capture])
        assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # set only while the store opened
    finally:
        env.undo()
    return folder, result, out.getvalue()


def expected(result, name):
    """{env steps: value} of metric `name` in the run's history; `eval_return` where it evaluated only."""
    every = {(i + 1) * STEPS: float(v) for i, v in enumerate(result.history[name])}
    return {x: v for x, v in every.items() if x in EVALUATED} if name == "eval_return" else every


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
    assert [e.step for e in acc.Scalars("eval_return")] == EVALUATED  # evaluated at iterations 1 and 3 only
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
    """CaptureVideo's video at the run's end, in TensorBoard as an animated GIF image (tensorboardX's add_video's
    form) at its env step, with the frames of the .mp4 it wrote."""
    from PIL import Image

    folder, _, _ = tracked
    acc = tensorboard_run(folder / "tensorboard" / run_folder(folder))
    [image] = acc.Images("video")
    assert (image.step, image.width, image.height) == (ITERATIONS * STEPS, 600, 400)
    with Image.open(io.BytesIO(image.encoded_image_string)) as gif:
        assert gif.format == "GIF" and gif.size == (600, 400) and 1 < gif.n_frames <= VIDEO_FRAMES


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
    last = history[ITERATIONS * STEPS]  # a wandb.Video of the .mp4, in the run's media
    assert last["video._type"] == "video-file" and last["video.path"].endswith(".mp4")
    [media] = glob.glob(str(folder / "wandb" / "offline-run-*" / "files" / last["video.path"]))
    assert os.path.getsize(media) == os.path.getsize(folder / "videos" / "iteration_0000004.mp4")
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
    assert video.path == "videos/iteration_0000004.mp4"
    assert video.file_size == os.path.getsize(folder / "videos" / "iteration_0000004.mp4")


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
