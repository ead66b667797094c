"""Run summaries, metric files, plots and listings from the command line."""

import json

import jax
import numpy as np
import pytest

from fragc import FragcError
from fragc.cli import main

SHORT = ["run", "ppo", "--total-steps", "8192", "--iterations-per-dispatch", "4"]


def run_json(capsys, *extra):
    assert main(SHORT + ["--json", *extra]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_json_summary_and_fingerprint(capsys, commands_compile_each_configuration_once):
    first, progress = run_json(capsys, "--seed", "3")
    assert {"final_return", "env_steps", "iterations", "wall_s", "policy", "devices", "params_fingerprint"} <= set(first)
    assert first["iterations"] == 16 and first["env_steps"] == 16 * 512 and first["policy"] == "single"
    assert "fragc run ppo" in progress  # progress goes to stderr, stdout is only the JSON
    commands_compile_each_configuration_once.clear()  # compiled again with --no-cache; seed 4 reuses that program
    again, _ = run_json(capsys, "--seed", "3", "--no-cache")
    other, _ = run_json(capsys, "--seed", "4")
    assert again["params_fingerprint"] == first["params_fingerprint"]
    assert other["params_fingerprint"] != first["params_fingerprint"]


def test_a_metrics_file_that_is_a_folder_is_refused_before_compiling(capsys, monkeypatch, tmp_path):
    from fragc.cli import algorithm

    monkeypatch.setattr(algorithm, "compile_with", lambda *a: pytest.fail("compiled before refusing the path"))
    assert main(SHORT + ["--metrics", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot write metrics to '{tmp_path}': it is a folder" in err, err


def test_metrics_file_and_plot(capsys, tmp_path, commands_compile_each_configuration_once):
    metrics = tmp_path / "m.jsonl"
    assert main(SHORT + ["--quiet", "--metrics", str(metrics)]) == 0
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [4, 8, 12, 16]
    assert {"env_steps", "wall_s", "episode_return", "loss", "value_loss"} <= set(rows[0])
    capsys.readouterr()
    assert main(["plot", str(metrics)]) == 0
    png = tmp_path / "m.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("command,expected", [("policies", "actor_learner_async"), ("algos", "impala"),
                                              ("envs", "Breakout-MinAtar")])
def test_listings(capsys, command, expected):
    assert main([command]) == 0
    assert expected in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (SHORT + ["--metrics", "/nonexistent/dir/m.jsonl"], "cannot write metrics to '/nonexistent/dir/m.jsonl'"),
    (["plot", "/nonexistent.jsonl"], "cannot read metrics file"),
])
def test_bad_paths_are_one_line_and_exit_code_2(capsys, monkeypatch, argv, message):
    from fragc.cli import algorithm

    monkeypatch.setattr(algorithm, "compile_with", lambda *a: pytest.fail("compiled before refusing the path"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_bench_unknown_policy_fails_before_compiling(capsys):
    assert main(["bench", "ppo", "--policies", "single,anakn"]) == 2
    assert "unknown policy 'anakn' (did you mean 'anakin'?)" in capsys.readouterr().err


def metric_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_writer_resuming_drops_the_rows_after_the_checkpoint(tmp_path):
    """A run killed after writing rows past its last checkpoint writes them again when resumed:
    the file keeps the rows up to the checkpoint, then the resumed run's, as one run's would."""
    from fragc.runtime.reporting import MetricsWriter

    path = tmp_path / "m.jsonl"
    first = MetricsWriter(str(path))
    for it in (2, 4, 6, 8):
        first.write(it, it * 10, 0.0, {"loss": np.full(2, it / 10)})
    first.close()
    with open(path, "a") as f:
        f.write('{"iteration": 10, "env_st')  # killed mid-line
    resumed = MetricsWriter(str(path), resume_from=4)
    for it in (6, 8, 10):
        resumed.write(it, it * 10, 0.0, {"loss": np.full(2, it / 10)})
    resumed.close()
    assert [(r["iteration"], r["env_steps"], r["loss"]) for r in metric_rows(path)] == [
        (it, it * 10, pytest.approx(it / 10)) for it in (2, 4, 6, 8, 10)]


def test_metrics_writer_resuming_without_a_file_starts_one(tmp_path):
    from fragc.runtime.reporting import MetricsWriter

    writer = MetricsWriter(str(tmp_path / "new.jsonl"), resume_from=4)
    writer.write(6, 60, 0.0, {})
    writer.close()
    assert [r["iteration"] for r in metric_rows(tmp_path / "new.jsonl")] == [6]


def test_metrics_writer_on_a_full_disk_is_one_line():
    from fragc.runtime.reporting import MetricsWriter

    writer = MetricsWriter("/dev/full")
    with pytest.raises(FragcError, match=r"^cannot write metrics to '/dev/full': No space left on device$"):
        writer.write(1, 1, 0.0, {"loss": np.zeros(1)})
    writer.close()


def test_divergence_names_the_first_non_finite_metric_and_its_iteration():
    from fragc.runtime.divergence import Diverged, check_metrics, check_state

    check_metrics({"loss": np.ones(4), "episodes": np.arange(4)}, done=8)  # finite: nothing happens
    metrics = {"entropy": np.array([1.0, 1.0, np.inf, np.nan]), "loss": np.array([[0.0, 1.0], [np.nan, 0.0],
                                                                                  [0.0, 0.0], [0.0, 0.0]])}
    with pytest.raises(Diverged, match=r"^training diverged: metric 'loss' is nan in iteration 6$") as err:
        check_metrics(metrics, done=8)  # rows are iterations 5..8; the first bad one is 6
    assert err.value.exit_code == 3 and err.value.iteration == 6
    population = {"loss": np.ones((3, 4))}
    population["loss"][2, 3] = -np.inf  # seed 2, last iteration of the dispatch
    with pytest.raises(Diverged, match=r"metric 'loss' is -inf in iteration 8$"):
        check_metrics(population, done=8, population=True)
    check_state({"params": np.ones(3), "key": jax.random.key(0), "count": np.int32(3)}, 8)
    with pytest.raises(Diverged, match=r"^training diverged: the state's params.w is not finite after iteration 8$"):
        check_state({"params": {"w": np.array([1.0, np.nan])}}, 8)
