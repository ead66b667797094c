"""Host environments: fragc PPO's env-steps/s against the raw vector environment, alternating in one run.

For each environment (Gymnasium CartPole, and an EnvPool Atari game when EnvPool is installed) and each
way of running the host step on one device:

- `in-program` (`env_groups=0`): the host step is a callback inside the compiled rollout;
- `loop G=1`: the rollout's time loop runs from the host, inference and stepping alternating;
- `loop G=2`: the same with the environments in 2 groups, inference of one overlapping the stepping
  of the other (pipelined);

it times, alternately, in one run:

- `raw`: the same host pools as fragc steps (G of them, N/G environments each, stepped one after the
  other; one pool for `in-program`) with random actions, no inference, no learning;
- `rollout`: fragc's PPO rollout alone (PPO's network choosing the actions, the host step, the
  trajectory), compiled by fragc as an algorithm whose iteration is the rollout;
- `train`: PPO training (rollout and learning).

    python bench/host_envs.py [--envs gymnasium:CartPole-v1,envpool:Pong-v5] [--num-envs 8]
                              [--num-steps 128] [--iterations 4] [--repeats 3] [--out bench/results]

Prints the median env-steps/s of each and the ratios rollout/raw and train/raw (median, min-max over
the repeats), and writes host_envs.json. A ratio is below 1 by what inference (and learning) and the
device<->host round trip of each step cost beyond the environment; pipelining hides inference behind
stepping where there are cores to run both.
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

import fragc

MODES = (("in-program", 0), ("loop G=1", 1), ("loop G=2", 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="gymnasium:CartPole-v1,envpool:Pong-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=4, help="iterations per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--env-workers", type=int, default=0,
                        help="workers of each pool (EnvPool's threads), the same for fragc's pools and the raw ones; "
                             "0: the backend's default")
    parser.add_argument("--modes", default=",".join(str(g) for _, g in MODES),
                        help="environment groups to measure (0: in-program)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    import importlib.util

    rows = []
    wanted = {int(g) for g in args.modes.split(",")}
    for name in args.envs.split(","):
        if name.startswith("envpool:") and importlib.util.find_spec("envpool") is None:
            print(f"{name}: skipped (pip install 'fragc[host]')", file=sys.stderr)
            continue
        for mode, groups in MODES:
            if groups in wanted:
                rows.append(measure(name, mode, groups, args))
                print_row(rows[-1])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_envs.json"), "w") as f:
        json.dump(rows, f, indent=1)


class RolloutOnly:
    """PPO's rollout as a whole algorithm: the iteration collects a trajectory and learns nothing.

    A learner fragment reads the whole trajectory once (a sum of each leaf), as learning does: a
    trajectory that nothing reads would let XLA drop the critic, the bootstrap values and the trajectory
    buffers from a fused program (in-program) but not from a host loop, whose rollout is a stage of its own."""

    def __init__(self, algo):
        self.algo, self.config, self.env = algo, algo.config, algo.env

    def init(self, key):
        return self.algo.init(key)

    def iteration(self, state):
        traj, runner, metrics = self.algo.rollout(state.learner.params, state.runner)
        return state.replace(runner=runner), {**metrics, "trajectory_sum": self.read(traj)}

    @fragc.fragment(role="learner", in_axes=(1,), out_axes=None)
    def read(self, traj):
        return fragc.psum(sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(traj)))


def measure(name: str, mode: str, groups: int, args: argparse.Namespace) -> dict:
    import numpy as np

    from fragc.algos import ppo
    from fragc.algos.envs import split_env_name
    from fragc.algos.host_envs import HOST_POOLS

    backend, env_id = split_env_name(name)
    n, t, k = args.num_envs, args.num_steps, args.iterations
    config = ppo.Config(env=name, num_envs=n, num_steps=t, total_steps=n * t * k * (args.repeats + 1),
                        activation="relu" if backend == "envpool" else "tanh")
    algo = ppo.PPO(config)
    # each program its own algorithm, so its own host pools: a pool follows one runner's steps
    workers = args.env_workers
    programs = {what: fragc.compile(a, "single", iterations_per_dispatch=k, env_groups=groups, env_workers=workers)
                for what, a in (("rollout", RolloutOnly(ppo.PPO(config))), ("train", algo))}
    states = {}
    for what, prog in programs.items():  # warm-up: compiled, pools made
        states[what], _ = prog.run(prog.init(0), k)

    extra = (workers,) if workers else ()  # Gymnasium's pools take no worker count
    pools = [HOST_POOLS[backend](env_id, n // max(groups, 1), *extra) for _ in range(max(groups, 1))]
    rng = np.random.default_rng(0)
    actions = algo.env.action_space.n
    for i, pool in enumerate(pools):
        pool.reset(np.arange(2 * pool.num_envs, dtype=np.uint32).reshape(-1, 2) + 1000 * i)
    keys = np.zeros((n // len(pools), 2), np.uint32)

    def raw() -> float:
        start = time.perf_counter()
        for _ in range(t * k):
            for pool in pools:
                pool.step(rng.integers(0, actions, pool.num_envs), keys)
        return n * t * k / (time.perf_counter() - start)

    def fragc_rate(what: str) -> float:
        start = time.perf_counter()
        states[what], _ = programs[what].run(states[what], k)
        jax.block_until_ready(states[what])
        return n * t * k / (time.perf_counter() - start)

    rates: dict[str, list[float]] = {"raw": [], "rollout": [], "train": []}
    for _ in range(args.repeats):  # alternating: drift on a shared machine hits all alike
        rates["raw"].append(raw())
        rates["rollout"].append(fragc_rate("rollout"))
        rates["train"].append(fragc_rate("train"))
    for pool in pools:
        pool.close()
    row = {"env": name, "mode": mode, "env_groups": groups, "env_workers": workers, "num_envs": n, "num_steps": t,
           "iterations": k, "each": rates, **{f"{w}_env_steps_per_s": statistics.median(r) for w, r in rates.items()}}
    for what in ("rollout", "train"):
        ratios = [f / r for f, r in zip(rates[what], rates["raw"])]
        row[f"{what}_ratio"] = [statistics.median(ratios), min(ratios), max(ratios)]
    return row


def print_row(row: dict) -> None:
    def ratio(what: str) -> str:
        med, lo, hi = row[f"{what}_ratio"]
        return f"{med:.3f} ({lo:.3f}-{hi:.3f})"

    print(f"{row['env']:<24} {row['mode']:<10} raw {row['raw_env_steps_per_s']:>8.0f}  rollout "
          f"{row['rollout_env_steps_per_s']:>8.0f}  train {row['train_env_steps_per_s']:>8.0f} env-steps/s  "
          f"rollout/raw {ratio('rollout')}  train/raw {ratio('train')}", flush=True)


if __name__ == "__main__":
    main()
