"""Every built-in policy on the same PPO configuration: throughput, compile time, bytes moved.

    python bench/policies.py [--devices 8] [--iterations 16] [--repeats 3] [--num-envs 32] [--num-steps 64]
                             [--policies POLICIES] [--out bench/results]

The same as `fragc bench ppo --num-envs 32 --num-steps 64 --policies ...,population(single,4)`;
see docs/benchmarking.md for how to read it. On simulated CPU devices sharing
2 cores these numbers show fragc's overheads, not scaling.
"""

from __future__ import annotations

import argparse
import sys

POLICIES = "single,anakin,gspmd,actor_learner,actor_learner_async,population(single,4)"
"""Every built-in policy, and a population of the single run."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--num-steps", type=int, default=64)
    parser.add_argument("--policies", default=POLICIES, help=f"comma-separated (default {POLICIES})")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    from fragc.cli import main as fragc_main

    sys.exit(fragc_main([
        "bench", "ppo", "--num-envs", str(args.num_envs), "--num-steps", str(args.num_steps),
        "--devices", str(args.devices), "--iterations", str(args.iterations), "--repeats", str(args.repeats),
        "--out", args.out, "--policies", args.policies,
    ]))


if __name__ == "__main__":
    main()
