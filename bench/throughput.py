"""Training throughput rows (env-steps/s) of fragc programs, written as a JSON table.

    python bench/throughput.py [--rows ppo-2048,population-256] [--iterations 32] [--repeats 3] [--out FILE]

Each row compiles one program (compile time recorded), runs one warm-up
dispatch, then times `--iterations` iterations `--repeats` times and reports
the median env-steps/s (a population counts the steps of all its members).
Rows are measured one after another, so compare rows of one file taken on
one machine; `bench/gpu.sh` runs the GPU set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from results import MINATAR  # bench/results.py: the learning runs' MinAtar configuration

ROWS = {  # name: (algorithm, policy, config overrides, population size or 0)
    "ppo-cartpole-2048": ("ppo", "single", {"num_envs": 2048, "num_steps": 128, "num_minibatches": 32}, 0),
    "ppo-cartpole-8192": ("ppo", "single", {"num_envs": 8192, "num_steps": 128, "num_minibatches": 128}, 0),
    "ppo-cartpole-16384": ("ppo", "single", {"num_envs": 16384, "num_steps": 128, "num_minibatches": 64}, 0),
    "ppo-cartpole-32768": ("ppo", "single", {"num_envs": 32768, "num_steps": 128, "num_minibatches": 128}, 0),
    "ppo-cartpole-population-256": ("ppo", "single", {}, 256),
    **{f"ppo-minatar-{game.lower()}": ("ppo", "single", {"env": f"{game}-MinAtar", **MINATAR}, 0)
       for game in ("Breakout", "SpaceInvaders", "Asterix", "Freeway")},
    "muzero-minatar-breakout": ("muzero", "single", {}, 0),
}
"""PPO CartPole at PureJaxRL's scale (2048 and 8192 environments, 8,192-sample minibatches), larger rows for a GPU
(16384 and 32768 environments, 32,768-sample minibatches: 64 and 128 of them an epoch, where 8192 takes 128 of a
quarter the size), a population of 256 seeds of PureJaxRL's CartPole configuration (its "2048 agents" experiment
at 256; bench/population.py times 2048 beside PureJaxRL's own), and PPO on MinAtar with PureJaxRL's MinAtar
configuration (examples/brax_minatar.ipynb: 64 envs x 128 steps, lr 5e-3, 4 epochs x 8 minibatches, relu MLP),
the same as bench/results.py's MinAtar learning runs. The CartPole rows use PureJaxRL's CartPole network (tanh).
MuZero on Breakout-MinAtar at its defaults (64 environments x 32 steps, 8 simulations a step)."""


def measure(name: str, iterations: int, repeats: int) -> dict:
    import jax

    import fragc
    from fragc import algos

    algo_name, policy, overrides, population = ROWS[name]
    algo = algos.make(algo_name, **overrides)
    policy = fragc.population(policy, population) if population else policy
    start = time.perf_counter()
    prog = fragc.compile(algo, policy, devices=1, iterations_per_dispatch=min(iterations, 16))
    state = prog.init(0)
    compile_s = time.perf_counter() - start
    state, _ = prog.run(state, min(iterations, 16))  # warm-up
    steps = iterations * algo.steps_per_iteration * max(population, 1)
    rates, returns = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        state, history = prog.run(state, iterations)
        jax.block_until_ready(state)
        rates.append(steps / (time.perf_counter() - start))
        returns = history["episode_return"]
    return {"row": name, "algo": algo_name, "policy": str(policy), "config": overrides, "population": population,
            "device": str(jax.devices()[0].device_kind), "backend": jax.default_backend(),
            "compile_s": round(compile_s, 2), "env_steps_per_s": round(statistics.median(rates)),
            "env_steps_per_s_each": [round(r) for r in rates], "iterations_per_repeat": iterations,
            "final_return_mean": float(returns[..., -1].mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from: {', '.join(ROWS)}")
    parser.add_argument("--iterations", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/throughput.json")
    args = parser.parse_args()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    table = []
    for name in args.rows.split(","):
        row = measure(name, args.iterations, args.repeats)
        table.append(row)
        print(f"{name:32} {row['env_steps_per_s']:>14,} env-steps/s  compile {row['compile_s']:.1f} s", flush=True)
        with open(args.out, "w") as f:  # after every row: a run cut short keeps the rows it measured
            json.dump(table, f, indent=2)


if __name__ == "__main__":
    main()
