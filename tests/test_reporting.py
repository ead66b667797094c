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


def test_bench_table_json_and_plot(capsys, tmp_path):
    out = tmp_path / "bench"
    assert main(["bench", "ppo", "--policies", "single,actor_learner", "--devices", "8", "--num-envs", "8",
                 "--num-steps", "16", "--iterations", "2", "--repeats", "2", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "single" in table and "actor_learner" in table and "env-steps/s" in table
    data = json.loads((out / "bench.json").read_text())
    row = data["policies"]["actor_learner"]
    assert len(row["env_steps_per_s"]) == 2 and row["min"] <= row["median"] <= row["max"]
    assert row["transfer_bytes_per_iteration"] > 0 and data["policies"]["single"]["transfer_bytes_per_iteration"] == 0
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_unknown_policy_fails_before_compiling(capsys):
    assert main(["bench", "ppo", "--policies", "single,anakn"]) == 2
    assert "unknown policy 'anakn' (did you mean 'anakin'?)" in capsys.readouterr().err
