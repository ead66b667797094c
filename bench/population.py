"""N seeds of PPO CartPole as one population against PureJaxRL's `jax.jit(jax.vmap(make_train(config)))(keys)`.

Both sides are written the same way: one call trains N members for `--iterations` PPO iterations from their
seeds, init included, and its metrics reach the host.

- `purejaxrl`: `jax.jit(jax.vmap(train))(keys)` with `train(key)` = PureJaxRL's `make_train(config)(key)`:
  init, then a `lax.scan` of `update_step` over the iterations, returning the per-step info dict (as PureJaxRL's
  `train` does) (bench/purejaxrl_ppo.py).
- `fragc`: `prog = fragc.compile(PPO(config), fragc.population("single", N), iterations_per_dispatch=iterations)`,
  then `prog.run(prog.init(seed), iterations)`: one init program and one dispatch.

Both compile first (not timed); then the sides alternate, `--repeats` rounds per N, and the ratio
purejaxrl s / fragc s (> 1: fragc is faster) is taken per round, then the median. fragc's init and run are
also timed apart (`fragc_init_s`), to show where the time goes.

    python bench/population.py [--sizes 8,32,64,256] [--iterations 8] [--repeats 5] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import purejaxrl_ppo  # noqa: E402

import fragc  # noqa: E402
from fragc.algos import ppo  # noqa: E402


def purejaxrl_side(config: ppo.Config, n: int, iterations: int):
    """PureJaxRL's `jax.jit(jax.vmap(make_train(config)))(keys)`, compiled; -> a function of a seed."""
    train = purejaxrl_ppo.make_train(config)

    def make_train(key: jax.Array):  # PureJaxRL's `train(rng)`: init, then the scan over the updates
        runner_state, metrics = jax.lax.scan(train.update_step, train.init(key), None, iterations)
        return runner_state, metrics

    keys = jax.random.split(jax.random.key(0), n)
    compiled = jax.jit(jax.vmap(make_train)).lower(keys).compile()

    def run(seed: int) -> float:
        start = time.perf_counter()
        state, metrics = compiled(jax.random.split(jax.random.key(seed), n))
        jax.device_get(metrics)
        jax.block_until_ready(state)
        return time.perf_counter() - start

    return run


def fragc_side(config: ppo.Config, n: int, iterations: int, init_times: list[float]):
    """fragc's PPO as a population of `n`, one dispatch of `iterations`; -> a function of a seed."""
    prog = fragc.compile(ppo.PPO(config), fragc.population("single", n), iterations_per_dispatch=iterations)
    prog.run(prog.init(0), iterations)  # compiles what a run compiles on first use

    def run(seed: int) -> float:
        start = time.perf_counter()
        state = jax.block_until_ready(prog.init(seed))
        init_times.append(time.perf_counter() - start)
        state, _ = prog.run(state, iterations)
        jax.block_until_ready(state)
        return time.perf_counter() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,32,64,256")
    parser.add_argument("--iterations", type=int, default=8, help="PPO iterations a call, both sides")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    config = ppo.Config()
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        init_times: list[float] = []
        sides = {"fragc": fragc_side(config, n, args.iterations, init_times),
                 "purejaxrl": purejaxrl_side(config, n, args.iterations)}
        for run in sides.values():  # warm up
            run(1)
        init_times.clear()
        times: dict[str, list[float]] = {s: [] for s in sides}
        loads = []
        for r in range(args.repeats):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for side in order:
                times[side].append(sides[side](r + 2))
            loads.append(os.getloadavg()[0])
        ratios = [p / f for p, f in zip(times["purejaxrl"], times["fragc"])]
        steps = n * args.iterations * config.steps_per_iteration
        row = {"members": n, "iterations": args.iterations, "seconds": times, "fragc_init_s": init_times,
               "ratios": ratios, "ratio_median": statistics.median(ratios),
               "env_steps_per_s": {s: steps / statistics.median(v) for s, v in times.items()},
               "loads": loads}
        rows.append(row)
        print(f"N={n:4}: purejaxrl/fragc median {row['ratio_median']:.3f} (min {min(ratios):.3f}, max "
              f"{max(ratios):.3f}); env-steps/s fragc {row['env_steps_per_s']['fragc']:,.0f}, purejaxrl "
              f"{row['env_steps_per_s']['purejaxrl']:,.0f}; fragc init {statistics.median(init_times):.3f} s of "
              f"{statistics.median(times['fragc']):.3f} s; load {min(loads):.1f}-{max(loads):.1f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "population.json"), "w") as f:
        json.dump({"iterations": args.iterations, "repeats": args.repeats, "rows": rows,
                   "backend": jax.default_backend()}, f, indent=2, default=np.asarray)


if __name__ == "__main__":
    main()
