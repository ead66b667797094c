"""fragc's lowering against plain `jax.jit` of the same iteration, for an algorithm written PureJaxRL's way.

The algorithm is `purejaxrl_ppo.FragcPort`: PureJaxRL's PPO with its closures,
its flax `TrainState` in the state and its whole per-step info dict
([num_steps, num_envs] arrays) as the metrics, split into a rollout and a
learn fragment. Both sides scan the same number of iterations per dispatch,
donate the state, fetch the metrics after every dispatch, and are timed
alternately (A B A B ...) in one process. Prints medians and per-repeat
ratios of wall-clock throughput, and of process CPU time (steadier than
wall time on a machine shared with other jobs, and the measure that shows a
program using more threads); writes JSON.

    python bench/lowering.py [--repeats 9] [--iterations 128] [--k 16] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import purejaxrl_ppo  # noqa: E402

import fragc  # noqa: E402
from fragc.algos import ppo  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--iterations", type=int, default=128, help="iterations timed per repeat")
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch, both sides")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    algo = purejaxrl_ppo.FragcPort(ppo.Config())
    prog = fragc.compile(algo, "single", iterations_per_dispatch=args.k)
    state = prog.init(0)
    plain = jax.jit(lambda s: jax.lax.scan(lambda s, _: algo.iteration(s), s, None, args.k), donate_argnums=0)
    plain = plain.lower(state).compile()

    def run_plain(state):
        state = jax.tree.map(jnp.copy, state)
        for _ in range(args.iterations // args.k):
            state, metrics = plain(state)
            jax.device_get(metrics)
        return state

    sides = {"fragc": lambda s: prog.run(s, args.iterations)[0], "plain_jit": run_plain}
    states = {name: run(state) for name, run in sides.items()}  # warm up
    times: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, run in sides.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(run(states[name]))
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    steps = args.iterations * algo.steps_per_iteration
    sps = {n: [steps / t for t in ts] for n, ts in times.items()}
    ratios = [a / b for a, b in zip(sps["fragc"], sps["plain_jit"])]
    cpu_ratios = [b / a for a, b in zip(cpu["fragc"], cpu["plain_jit"])]
    result = {
        "algorithm": "purejaxrl_ppo.FragcPort (PureJaxRL's PPO as two fragments, CartPole-v1)",
        "config": {"iterations_per_repeat": args.iterations, "iterations_per_dispatch": args.k,
                   "repeats": args.repeats, "backend": jax.default_backend()},
        "env_steps_per_s": {n: statistics.median(v) for n, v in sps.items()},
        "env_steps_per_s_each": sps,
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "cpu_s_each": cpu,
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "cpu_ratios": cpu_ratios,
    }
    for n, v in result["env_steps_per_s"].items():
        print(f"{n:12}{v:>12.0f} env-steps/s (median)")
    print(f"throughput ratio src/fragc/plain_jit: median {result['ratio_median']:.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    print(f"CPU-time ratio (plain_jit CPU s / fragc CPU s, > 1: fragc does less work): median "
          f"{result['cpu_ratio_median']:.3f} (min {min(cpu_ratios):.3f}, max {max(cpu_ratios):.3f})")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "lowering.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
