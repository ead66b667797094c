"""`fragc video CHECKPOINT_DIR`: greedy episodes of a checkpoint's policy as .mp4 or .gif (src/fragc/sinks/video.py)."""

from __future__ import annotations

import argparse
import os

from fragc.sinks.video import video_from_checkpoint

from .options import count, groups


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    parser.description = ("Play greedy episodes with the policy of the latest good checkpoint in CHECKPOINT_DIR and "
                          "write them as a video (docs/videos.md).")
    parser.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="a folder fragc run --checkpoint-dir wrote")
    parser.add_argument("--out", default="agent.mp4", help="the video to write: .mp4 or .gif (default agent.mp4)")
    parser.add_argument("--episodes", type=count, default=2, help="episodes, one after another (default 2)")
    parser.add_argument("--member", type=groups, default=0, help="the population member to show (default 0)")
    parser.add_argument("--seed", type=groups, default=0, help="the episodes' seed (default 0)")
    parser.add_argument("--fps", type=count, default=None,
                        help="frames per second (default: the environment's own rate)")
    parser.add_argument("--max-steps", type=count, default=None,
                        help="end each episode after this many steps (default: the environment's time limit)")


def main(args: argparse.Namespace) -> int:
    """One line saying what it wrote."""
    path, frames, (width, height) = video_from_checkpoint(args.checkpoint_dir, args.out, args.episodes,
                                                          args.member, args.seed, args.fps, args.max_steps)
    kib = os.path.getsize(path) / 1024
    print(f"wrote {path}: {args.episodes} episode{'s' if args.episodes != 1 else ''}, {frames} frames of "
          f"{width}x{height}, {kib:.1f} KiB")
    return 0
