"""The host loop's own time: a rollout call (the host-loop executor alone) and a training iteration.

    python bench/host_loop_calls.py [--groups 1] [--num-envs 8] [--num-steps 128] [--calls 32] [--repeats 9]
                                    [--iterations 8] [--out bench/results]

PPO on Gymnasium's CartPole, `single`, its time loop run from the host in `--groups` environment groups. After a
warm-up it times every call of the rollout's host loop (device work and host steps, waited for), and `--repeats`
runs of `--iterations` training iterations, and prints the medians (ms). The script measures one checkout: to
compare two commits, run it in each checkout alternately (A B A B) and compare the medians pair by pair
(docs/benchmarks.md, "The one-core IR ... side by side"). Writes host_loop_calls.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax

import fragc
from fragc.algos import ppo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--calls", type=int, default=32, help="rollout calls timed (one a training iteration)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--iterations", type=int, default=8, help="training iterations a timed repeat")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    config = ppo.Config(env="gymnasium:CartPole-v1", num_envs=args.num_envs, num_steps=args.num_steps)
    prog = fragc.compile(ppo.PPO(config), "single", env_groups=args.groups)
    calls = time_the_host_loop(prog)
    state = prog.init(0)
    state, _ = prog.run(state, args.iterations)  # warm-up: every program compiled, the pools stepping
    calls.clear()
    iterations = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        state, _ = prog.run(state, args.iterations)
        jax.block_until_ready(state)
        iterations.append((time.perf_counter() - start) / args.iterations * 1e3)
    calls = calls[:args.calls]
    row = {"groups": args.groups, "num_envs": args.num_envs, "num_steps": args.num_steps,
           "rollout_call_ms": round(statistics.median(calls), 2), "rollout_call_min_ms": round(min(calls), 2),
           "iteration_ms": round(statistics.median(iterations), 2), "iteration_min_ms": round(min(iterations), 2)}
    print(f"groups={args.groups}: rollout call {row['rollout_call_ms']} ms (min {row['rollout_call_min_ms']}), "
          f"training iteration {row['iteration_ms']} ms (min {row['iteration_min_ms']})")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_loop_calls.json"), "w") as f:
        json.dump(row, f, indent=1)


def time_the_host_loop(prog: fragc.Program) -> list[float]:
    """Put a timer around the program's host-loop executor (the staged executor calls what its table holds): each
    call is waited for and timed, in ms, appended to the list returned."""
    loops = prog._executor._host_loops  # noqa: SLF001 - a bench looks inside the staged executor
    (index, executor), = loops.items()
    times: list[float] = []

    def timed(frame, *leaves):
        jax.block_until_ready(leaves)
        start = time.perf_counter()
        out = executor(frame, *leaves)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) * 1e3)
        return out

    loops[index] = timed
    return times


if __name__ == "__main__":
    main()
