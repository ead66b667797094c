"""`fragc launch -n N -- COMMAND ...`: N local processes of one multi-process run (src/fragc/launch.py). Imports no
JAX: each launched process pays for its own."""

from __future__ import annotations

import argparse

from fragc.launch import launch

from .options import count


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    parser.description = ("Start N local processes on loopback, each with its own simulated CPU devices (--devices "
                          "counts each process's), forward their output with a [i] prefix, and exit non-zero if any "
                          "fails. Example: fragc launch -n 2 -- fragc run ppo --policy anakin --devices 4")
    parser.add_argument("-n", "--num-processes", type=count, required=True, help="how many processes")
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command every process runs")


def main(args: argparse.Namespace) -> int:
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return launch(args.num_processes, command)
