"""Every built-in policy on the same PPO configuration: throughput, compile time, bytes moved.

    python bench/policies.py [--devices 8] [--iterations 16] [--repeats 3] [--out bench/results]

Policies are timed alternately (A B C ... A B C ...) so drift hits all equally;
medians are reported. On simulated CPU devices sharing 2 cores these numbers
show fragc's overheads (dispatch, transfers, collectives), not scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=16, help="iterations per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--num-steps", type=int, default=64)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    import fragc
    from fragc.algos import ppo

    algo = ppo.PPO(ppo.Config(num_envs=args.num_envs, num_steps=args.num_steps))
    policies = {
        "single": ("single", 1, 1),
        "anakin": ("anakin", args.devices, 1),
        "gspmd": ("gspmd", args.devices, 1),
        "actor_learner": ("actor_learner", args.devices, 1),
        "actor_learner_async": ("actor_learner_async", args.devices, 1),
        "population(single,4)": (fragc.population("single", 4), None, 4),
    }
    programs, rows = {}, {}
    for name, (policy, devices, runs) in policies.items():
        t0 = time.perf_counter()
        prog = fragc.compile(algo, policy, devices=devices)
        compile_s = time.perf_counter() - t0
        cost = prog.cost()["total"]
        state = prog.init(0)
        state, _ = prog.run(state, args.iterations)  # warm up
        programs[name] = [prog, state, runs]
        rows[name] = {"compile_s": compile_s, "collective_bytes": cost["collective_bytes"],
                      "transfer_bytes": cost["transfer_bytes"], "times": [], "returns": []}
        print(f"compiled {name} in {compile_s:.1f} s", file=sys.stderr)
    for _ in range(args.repeats):
        for name, (prog, state, runs) in programs.items():
            start = time.perf_counter()
            state, history = prog.run(state, args.iterations)
            jax.block_until_ready(state)
            rows[name]["times"].append(time.perf_counter() - start)
            programs[name][1] = state
    steps = algo.config.steps_per_iteration * args.iterations
    print(f"\nPPO CartPole-v1, {args.num_envs} envs x {args.num_steps} steps, {args.devices} simulated CPU devices, "
          f"{jax.device_count()} devices, median of {args.repeats} alternating repeats of {args.iterations} iterations")
    print(f"{'policy':24}{'env-steps/s':>14}{'compile s':>11}{'collective B/iter':>19}{'transfer B/iter':>17}")
    for name, row in rows.items():
        row["env_steps_per_s"] = statistics.median(steps * programs[name][2] / t for t in row["times"])
        print(f"{name:24}{row['env_steps_per_s']:>14.0f}{row['compile_s']:>11.1f}"
              f"{row['collective_bytes']:>19.0f}{row['transfer_bytes']:>17.0f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "policies.json"), "w") as f:
        json.dump({"config": vars(args), "policies": rows}, f, indent=2)


if __name__ == "__main__":
    main()
