"""`fragc export CHECKPOINT_DIR --out DIR`: a checkpoint's policy as flax msgpack and a config (src/fragc/inference.py),
which `fragc.load_policy(DIR)` reads without the training state."""

from __future__ import annotations

import argparse

from fragc.inference import EXPORT_META, EXPORT_PARAMS, export_policy

from .options import groups


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    parser.description = ("Write the policy of the latest good checkpoint in CHECKPOINT_DIR to a folder: its "
                          f"parameters ({EXPORT_PARAMS}, flax msgpack) and {EXPORT_META} (the algorithm and its "
                          "config). fragc.load_policy(DIR) reads it back.")
    parser.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="a folder fragc run --checkpoint-dir wrote")
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    parser.add_argument("--member", type=groups, default=0, help="the population member to export (default 0)")


def main(args: argparse.Namespace) -> int:
    out = export_policy(args.checkpoint_dir, args.out, args.member)
    print(f"wrote {out}: {EXPORT_PARAMS} and {EXPORT_META} (fragc.load_policy('{out}') reads them)")
    return 0
