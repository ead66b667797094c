"""Full-length learning runs of every algorithm, one seed each, for docs/results.md.

    python bench/results.py [--seed 0] [--out bench/results]

Prints, per run: algorithm, policy, environment, seed, env steps, wall time
(compile included), final mean episode return (mean over environments of
each one's last completed episode, at the end of training).
"""

from __future__ import annotations

import argparse
import json
import os
import time

RUNS = [  # (algorithm, policy, devices, config overrides)
    ("ppo", "single", 1, {}),
    ("a2c", "single", 1, {}),
    ("dqn", "single", 1, {}),
    ("impala", "actor_learner_async", 8, {}),
    ("ppo_continuous", "single", 1, {}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import fragc
    from fragc import algos

    rows = []
    for name, policy, devices, overrides in RUNS:
        algo = algos.make(name, **overrides)
        start = time.perf_counter()
        prog = fragc.compile(algo, policy, devices=devices, iterations_per_dispatch=32)
        _, history = prog.run(prog.init(args.seed), algo.config.iterations)
        wall = time.perf_counter() - start
        row = {"algo": name, "policy": policy, "env": algo.config.env, "seed": args.seed,
               "env_steps": algo.config.iterations * algo.steps_per_iteration, "wall_s": round(wall, 1),
               "final_return": round(float(history["episode_return"][-1]), 1)}
        rows.append(row)
        print(" | ".join(str(v) for v in row.values()), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
