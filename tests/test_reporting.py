"""Run summaries, metric files, plots and listings from the command line."""

import json

import pytest

from fragc.cli import main

SHORT = ["run", "ppo", "--total-steps", "8192", "--iterations-per-dispatch", "4"]


def run_json(capsys, *extra):
    assert main(SHORT + ["--json", *extra]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_json_summary_and_fingerprint(capsys):
    first, progress = run_json(capsys, "--seed", "3")
    assert {"final_return", "env_steps", "iterations", "wall_s", "policy", "devices", "params_fingerprint"} <= set(first)
    assert first["iterations"] == 16 and first["env_steps"] == 16 * 512 and first["policy"] == "single"
    assert "fragc run ppo" in progress  # progress goes to stderr, stdout is only the JSON
    again, _ = run_json(capsys, "--seed", "3", "--no-cache")
    other, _ = run_json(capsys, "--seed", "4")
    assert again["params_fingerprint"] == first["params_fingerprint"]
    assert other["params_fingerprint"] != first["params_fingerprint"]


def test_metrics_file_and_plot(capsys, tmp_path):
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
def test_bad_paths_are_one_line_and_exit_code_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
