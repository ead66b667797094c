"""`fragc plot FILE`: the learning curve of a `--metrics` file as a PNG."""

from __future__ import annotations

import argparse

from fragc.runtime.plots import plot_learning_curve


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    parser.add_argument("file", help="a JSON-lines file written by fragc run --metrics")
    parser.add_argument("--out", default=None, help="the PNG to write (default: FILE with .png)")


def main(args: argparse.Namespace) -> int:
    out = args.out or (args.file.rsplit(".", 1)[0] + ".png")
    plot_learning_curve(args.file, out)
    print(out)
    return 0
