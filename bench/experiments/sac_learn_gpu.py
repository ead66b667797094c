"""SAC on Pendulum-v1 on the GPU with the default config (unrolled learner loop there): the slow test's check
(mean episode return of the last 1,000 steps > -250) on seeds 0-3, one compile.

    python bench/experiments/sac_learn_gpu.py [--seeds 4]
"""
import argparse
import time

import numpy as np

import fragc
from fragc.algos import sac


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    algo = sac.SAC(sac.Config())
    t = time.perf_counter()
    prog = fragc.compile(algo, "single", iterations_per_dispatch=125)
    print(f"unrolled steps {algo.unrolled_steps}; compile {time.perf_counter() - t:.1f} s", flush=True)
    for seed in range(args.seeds):
        t = time.perf_counter()
        _, history = prog.run(prog.init(seed), algo.config.iterations)
        r = float(np.asarray(history["episode_return"])[-125:].mean())
        print(f"seed {seed}: last 1,000 steps' mean return {r:.1f} ({'pass' if r > -250 else 'FAIL'}), "
              f"{algo.config.total_steps} steps in {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main()
