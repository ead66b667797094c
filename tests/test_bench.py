"""`fragc bench`'s driver, and a smoke test of every script in bench/ at tiny sizes (so that none can rot)."""

from fragc.cli.bench import run_bench
from fragc.runtime.bench import format_table
from toy_algos import Regression


def test_bench_times_an_algorithm_that_says_neither_its_steps_nor_a_return():
    """Regression has no `steps_per_iteration` and no `episode_return` metric: iterations per second stand in for
    env steps per second, and the return is left out."""
    rows = run_bench(lambda: Regression(num_envs=8), ["single"], None, iterations=2, repeats=1, log=lambda line: None)
    row = rows["single"]
    assert row["unit"] == "iterations/s" and row["median"] == row["iterations_per_s"][0] > 0
    assert row["env_steps_per_s"] is None and row["final_return"] is None
    line = format_table(rows).splitlines()[1]
    assert line.split()[:2] == ["single", "1"] and line.split()[-1] == "-", line
