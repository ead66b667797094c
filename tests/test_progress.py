"""Progress off a terminal (issue 46): lines with elapsed time and an ETA in a log, the bar on a terminal, and a
line before compiling."""

import io
import time

import numpy as np
import pytest

from fragc.runtime.actions import Run
from fragc.sinks.progress import LogProgress, ShowProgress, clock, eta_seconds, progress_action


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def a_run(start: int = 0, stop_at: int = 100, steps: int = 512) -> Run:
    return Run(program=None, start=start, stop_at=stop_at, steps_per_iteration=steps, lead=True)


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (75.2, "1:15"), (3725, "1:02:05"), (float("nan"), "?")])
def test_clock(seconds, text):
    assert clock(seconds) == text


def test_the_eta_is_the_time_left_at_the_rate_so_far():
    run = a_run(start=20, stop_at=120)
    run.began = time.perf_counter() - 10.0  # 10 s for iterations 20 -> 40: 2 iterations a second
    assert eta_seconds(run, 40, 120) == pytest.approx(40.0, rel=0.01)  # 80 left
    assert eta_seconds(run, 20, 120) != eta_seconds(run, 20, 120)  # NaN: nothing run yet


def test_a_log_gets_a_line_each_tenth_of_the_run_and_the_last():
    out = io.StringIO()
    progress = LogProgress(100, out, every_s=3600)
    run = a_run()
    progress.on_start(run)
    run.last["episode_return"] = 21.5
    for it in range(4, 101, 4):  # a dispatch every 4 iterations
        progress.on_metrics(it, {}, None)
    lines = out.getvalue().splitlines()
    shown = [int(line.split()[0].split("/")[0]) for line in lines]
    assert shown == [4, 12, 20, 32, 40, 52, 60, 72, 80, 92, 100]  # the first dispatch past each tenth
    assert "eta" in lines[0] and "elapsed" in lines[0] and "return 21.5" in lines[0]
    assert "2048 env steps" in lines[0]


def test_a_slow_run_gets_a_line_every_every_s_seconds():
    out = io.StringIO()
    progress = LogProgress(1000, out, every_s=0.0)  # every dispatch is past the time limit
    run = a_run(stop_at=1000)
    progress.on_start(run)
    for it in (1, 2, 3):
        progress.on_metrics(it, {}, None)
    assert len(out.getvalue().splitlines()) == 3


def test_a_terminal_gets_the_bar_and_a_log_the_lines():
    assert isinstance(progress_action(10, Terminal()), ShowProgress)
    assert isinstance(progress_action(10, io.StringIO()), LogProgress)
    bar, run = Terminal(), a_run(stop_at=10)
    run.began -= 5.0
    show = ShowProgress(10, bar)
    show.on_start(run)
    show.on_metrics(5, {}, None)
    assert "[############............] 5/10 it" in bar.getvalue() and "eta 0:05" in bar.getvalue()


def test_a_sweeps_lines_name_its_best_member_at_the_dispatchs_last_iteration():
    from fragc.sweep import best_member

    returns = np.array([[[50.0, 60.0], [10.0, 20.0]],  # member 0 [iterations, envs]: 55, then 15
                        [[90.0, 100.0], [30.0, 30.0]]])  # member 1: 95, then 30
    assert best_member({"episode_return": returns}) == "  best member 30.0"  # at the dispatch's last iteration
    assert best_member({"loss": returns}) == ""


def test_a_run_that_reports_a_win_rate_shows_it_after_the_return():
    out = io.StringIO()
    progress = LogProgress(10, out, every_s=3600)
    run = a_run(stop_at=10)
    progress.on_start(run)
    run.last.update(episode_return=1.25, win_rate=0.4375)
    progress.on_metrics(1, {}, None)
    assert "return 1.2  win 0.44  " in out.getvalue()
    run.last.pop("win_rate")
    progress.on_metrics(10, {}, None)
    assert "win" not in out.getvalue().splitlines()[-1]


@pytest.mark.parametrize("make", [lambda out: LogProgress(100, out, every_s=3600, first_every_s=0.05),
                                  lambda out: ShowProgress(100, out, first_every_s=0.05)], ids=["log", "terminal"])
def test_a_long_first_dispatch_gets_lines_until_its_metrics_come(make):
    """A first dispatch of k iterations can take minutes (Atari on a CPU): a line every first_every_s seconds
    (30 by default) says the run is alive, and stops at the first metrics."""
    out = io.StringIO()
    progress = make(out)
    run = a_run()
    run.program = type("Program", (), {"k": 16})()
    progress.on_start(run)
    time.sleep(0.3)
    progress.on_metrics(16, {}, None)
    waiting = [line for line in out.getvalue().splitlines() if "still running" in line]
    assert len(waiting) >= 2 and waiting[0].endswith("elapsed: the first dispatch (16 iterations) is still running")
    before = len(out.getvalue())
    time.sleep(0.2)
    assert "still running" not in out.getvalue()[before:]
    progress.on_end(run)
