"""Host environments: fragc PPO's env-steps/s against the raw vector environment, alternating in one run.

For each environment (Gymnasium CartPole, and an EnvPool Atari game when EnvPool is installed) and each
number of environment groups G (1: `single`, one pool; 2: `anakin` on 2 devices, a pool per device,
stepped concurrently), it times, alternately:

- `raw`: the same host pools (fragc's `HostPool`s, G of them, N/G environments each, stepped one after
  the other) with random actions, no inference, no learning: what the environment alone costs;
- `fragc`: PPO training (rollout with the host step inside, and learning) over the same N environments.

    python bench/host_envs.py [--envs gymnasium:CartPole-v1,envpool:Pong-v5] [--num-envs 8]
                              [--num-steps 128] [--iterations 4] [--repeats 3] [--out bench/results]

Prints the median env-steps/s of each side and their ratio (fragc / raw) per environment and group
count, and writes host_envs.json. The ratio is below 1 by what inference, learning and the
device<->host round trip of each step cost; it approaches 1 where the environment dominates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

GROUPS = (1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="gymnasium:CartPole-v1,envpool:Pong-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=4, help="PPO iterations per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(max(GROUPS)))

    import importlib.util

    rows = []
    for name in args.envs.split(","):
        if name.startswith("envpool:") and importlib.util.find_spec("envpool") is None:
            print(f"{name}: skipped (pip install 'fragc[host]')", file=sys.stderr)
            continue
        for groups in GROUPS:
            rows.append(measure(name, groups, args))
            print_row(rows[-1])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_envs.json"), "w") as f:
        json.dump(rows, f, indent=1)


def measure(name: str, groups: int, args: argparse.Namespace) -> dict:
    import jax
    import numpy as np

    import fragc
    from fragc.algos import ppo
    from fragc.algos.envs import split_env_name
    from fragc.algos.host_envs import HOST_POOLS

    backend, env_id = split_env_name(name)
    n, t = args.num_envs, args.num_steps
    config = ppo.Config(env=name, num_envs=n, num_steps=t, total_steps=n * t * args.iterations * (args.repeats + 1),
                        activation="relu" if backend == "envpool" else "tanh")
    algo = ppo.PPO(config)
    prog = fragc.compile(algo, "single" if groups == 1 else "anakin", devices=groups,
                         iterations_per_dispatch=args.iterations)
    state = prog.init(0)
    state, _ = prog.run(state, args.iterations)  # warm-up: compiled, pools made

    pools = [HOST_POOLS[backend](env_id, n // groups) for _ in range(groups)]
    rng = np.random.default_rng(0)
    action_space = algo.env.action_space
    for i, pool in enumerate(pools):
        pool.reset(np.arange(2 * (n // groups), dtype=np.uint32).reshape(-1, 2) + 1000 * i)
    keys = np.zeros((n // groups, 2), np.uint32)

    def raw() -> float:
        start = time.perf_counter()
        for _ in range(t * args.iterations):
            for pool in pools:
                pool.step(rng.integers(0, action_space.n, n // groups), keys)
        return n * t * args.iterations / (time.perf_counter() - start)

    def trained() -> float:
        nonlocal state
        start = time.perf_counter()
        state, history = prog.run(state, args.iterations)
        jax.block_until_ready(state)
        return n * t * args.iterations / (time.perf_counter() - start)

    rates: dict[str, list[float]] = {"raw": [], "fragc": []}
    for _ in range(args.repeats):  # alternating: drift on a shared machine hits both alike
        rates["raw"].append(raw())
        rates["fragc"].append(trained())
    for pool in pools:
        pool.close()
    ratios = [f / r for f, r in zip(rates["fragc"], rates["raw"])]
    return {"env": name, "groups": groups, "num_envs": n, "num_steps": t, "iterations": args.iterations,
            "raw_env_steps_per_s": statistics.median(rates["raw"]),
            "fragc_env_steps_per_s": statistics.median(rates["fragc"]),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "each": rates}


def print_row(row: dict) -> None:
    print(f"{row['env']:<26} groups={row['groups']}  raw {row['raw_env_steps_per_s']:>9.0f} env-steps/s  "
          f"fragc PPO {row['fragc_env_steps_per_s']:>9.0f}  ratio {row['ratio_median']:.3f} "
          f"({row['ratio_min']:.3f}-{row['ratio_max']:.3f})", flush=True)


if __name__ == "__main__":
    main()
