"""An audit of the surfaces around training (issue 46's 'done when'): every bad input over run, sweep, tune, video,
tracking, config files and multi-process options is refused with exit code 2, one `error` line on stderr (a
progress line saying what is being compiled may come first), no traceback, and nothing left in the working folder
or where the command was asked to write.

The cases run in-process (no JAX start-up each) from an empty working folder; each is refused before anything
is compiled. tests/test_bad_input.py holds the Python API's and the older command lines' cases; this file holds
those of the issue's audit, and more of the same families.
"""

import os

import pytest

from fragc.cli import main

SMALL = ["--num-envs", "4", "--num-steps", "8", "--total-steps", "256"]

CASES = [
    # (case, argv, extra environment, a phrase of the error line)
    # 1, 2, 5, 6, 7: sweeps
    ("sweep --out under /proc", ["sweep", "ppo", "--seeds", "0-1", "--out", "/proc/nope/sw"], {},
     "cannot write the sweep's output in '/proc/nope/sw'"),
    ("sweep --out a file", ["sweep", "ppo", "--seeds", "0-1", "--out", "afile/sw"], {}, "afile/sw"),
    ("sweep seeds past 2**32", ["sweep", "ppo", "--seeds", "0-4294967296"], {}, "seeds must be in 0 .. 2**32 - 1"),
    ("population(auto,0)", ["run", "ppo", "--policy", "population(auto,0)"], {}, "population"),
    ("sweep --policy auto", ["sweep", "ppo", "--seeds", "0-1", "--policy", "auto"], {},
     "--policy auto searches one program's placement, not a sweep's"),
    ("sweep --anneal-lr true,false", ["sweep", "ppo", "--seeds", "0", "--anneal-lr", "true,false", *SMALL], {},
     "anneal_lr"),
    ("sweep --activation tanh,relu", ["sweep", "ppo", "--seeds", "0", "--activation", "tanh,relu", *SMALL], {},
     "activation"),
    ("sweep --lr nan,1e-4", ["sweep", "ppo", "--lr", "nan,1e-4"], {}, "lr must be finite"),
    ("sweep --policy actor_learner", ["sweep", "ppo", "--seeds", "0-1", "--policy", "actor_learner", *SMALL], {},
     "actor_learner"),
    ("sweep sac on CartPole", ["sweep", "sac", "--seeds", "0-1", "--env", "CartPole-v1"], {}, "sac"),
    ("sweep --pbt-seed without --pbt-every", ["sweep", "ppo", "--seeds", "0-1", "--pbt-seed", "3"], {},
     "--pbt-seed is an option of population-based training"),
    ("sweep --track-dir without --track", ["sweep", "ppo", "--seeds", "0-1", "--track-dir", "t"], {}, "--track-dir"),
    ("sweep --track nosuch", ["sweep", "ppo", "--seeds", "0-1", "--track", "nosuch"], {}, "nosuch"),
    # 8, 9, 10: tracking and videos
    ("WANDB_MODE=bogus", ["run", "ppo", "--track", "wandb", "--track-dir", "t", *SMALL], {"WANDB_MODE": "bogus"},
     "WANDB_MODE"),
    ("--track nosuch", ["run", "ppo", "--track", "nosuch"], {}, "nosuch"),
    ("--track-dir without --track", ["run", "ppo", "--track-dir", "t"], {}, "--track-dir"),
    ("--capture-video into a file's folder", ["run", "ppo", "--capture-video", "--eval-every", "2", "--track-dir", "afile/t", *SMALL],
     {}, "afile/t"),
    ("--track into /proc", ["run", "ppo", "--track", "tensorboard", "--track-dir", "/proc/nope/t", *SMALL], {},
     "/proc/nope/t"),
    ("video of no checkpoint", ["video", "nockpt", "--out", "a.gif"], {}, "nockpt"),
    # 4: joining a multi-process run
    ("--join-timeout 0", ["run", "ppo", "--join-timeout", "0"], {}, "--join-timeout"),
    ("--join-timeout abc", ["run", "ppo", "--join-timeout", "abc"], {}, "--join-timeout"),
    ("FRAGC_JOIN_TIMEOUT_S=abc", ["run", "ppo"], {"FRAGC_JOIN_TIMEOUT_S": "abc"}, "FRAGC_JOIN_TIMEOUT_S"),
    # 10, 11: the command line
    ("an unknown option", ["run", "ppo", "--lrr", "1e-3"], {}, "did you mean --lr?"),
    ("a bool's --no- form with a value", ["run", "ppo", "--no-anneal-lr", "true"], {}, "--no-anneal-lr takes no value"),
    ("a bool of another word", ["run", "ppo", "--anneal-lr", "maybe"], {}, "anneal"),
    ("--env-workers abc", ["run", "ppo", "--env", "gymnasium:CartPole-v1", "--env-workers", "abc"], {},
     "--env-workers: expected a whole number from 0, got abc"),
    ("a YAML string for a number", ["run", "ppo", "--config", "bad.yaml"], {}, "lr must be a number"),
    # 4 (tune): Optuna over populations
    ("tune --trials 0", ["tune", "ppo", "--trials", "0"], {}, "--trials"),
    ("tune a log range from 0", ["tune", "ppo", "--lr", "log:0..1e-3"], {}, "lr"),
    ("tune a reversed range", ["tune", "ppo", "--gamma", "0.999..0.9"], {}, "gamma"),
    ("tune a bool range", ["tune", "ppo", "--anneal-lr", "0..1"], {}, "anneal"),
    ("tune --sampler bogus", ["tune", "ppo", "--sampler", "bogus"], {}, "--sampler"),
    ("tune --study-dir under /proc", ["tune", "ppo", "--study-dir", "/proc/nope/s", "--trials", "2"], {},
     "/proc/nope/s"),
]


def refusal(argv):
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's own refusals
        return stop.code


@pytest.mark.parametrize("argv,env,phrase", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_audit_finds_one_line_no_traceback_and_nothing_written(capsys, monkeypatch, tmp_path, argv, env, phrase):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file, where a folder was asked for\n")
    (tmp_path / "bad.yaml").write_text("lr: fast\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = sorted(os.listdir(tmp_path))
    assert refusal(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if " compiling " not in line]  # what is compiled, said first
    assert len(lines) == 1 and "error" in lines[0] and phrase in lines[0], err
    assert "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == before  # no folder or file left behind
