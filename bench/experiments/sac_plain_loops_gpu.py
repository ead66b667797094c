"""Does the CleanRL side gain from unrolling when its dispatch loop is written as fragc's (fori_loop, static trip
count, metrics written into preallocated rows) instead of lax.scan with stacked outputs? Alternating medians.

    python bench/experiments/sac_plain_loops_gpu.py [--k 16] [--iterations 64] [--repeats 9]
"""
import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sac_plain  # noqa: E402

import fragc  # noqa: E402
from fragc.algos import sac  # noqa: E402


def fori(train, K):
    def loop(s):
        def body(i, carry):
            s, rows = carry
            s, m = train.update_step(s, None)
            return s, jax.tree.map(lambda r, x: r.at[i].set(x), rows, m)
        _, m0 = jax.eval_shape(train.update_step, s, None)
        rows = jax.tree.map(lambda x: jnp.zeros((K,) + x.shape, x.dtype), m0)
        return jax.lax.fori_loop(0, K, body, (s, rows))
    return loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch")
    parser.add_argument("--iterations", type=int, default=64, help="iterations timed per repeat")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    K, IT, REPEATS = args.k, args.iterations, args.repeats
    config = sac.Config(learning_starts=0)
    prog = fragc.compile(sac.SAC(config), "single", iterations_per_dispatch=K)
    sides = {"fragc": (prog.init(0), lambda s: prog.run(s, IT)[0])}
    for unroll in (1, 8):
        train = sac_plain.make_train(config, unroll)
        ps = jax.jit(train.init)(jax.random.key(0))
        scan = jax.jit(lambda s: jax.lax.scan(train.update_step, s, None, K), donate_argnums=0).lower(ps).compile()
        loop = jax.jit(fori(train, K), donate_argnums=0).lower(ps).compile()
        sides[f"cleanrl_scan_u{unroll}"] = (ps, sac_plain.dispatched(scan, IT, K))
        sides[f"cleanrl_fori_u{unroll}"] = (ps, sac_plain.dispatched(loop, IT, K))
    states = {n: jax.block_until_ready(run(s)) for n, (s, run) in sides.items()}
    times = {n: [] for n in sides}
    for _ in range(REPEATS):
        for n, (_, run) in sides.items():
            t = time.perf_counter()
            jax.block_until_ready(run(states[n]))
            times[n].append(time.perf_counter() - t)
    print(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, {REPEATS} alternating repeats of {IT} "
          f"iterations")
    for n, ts in times.items():
        r = [b / t for b, t in zip(times["cleanrl_scan_u1"], ts)]
        sps = statistics.median([IT * config.steps_per_iteration / t for t in ts])
        print(f"{n:18} {sps:8.0f} env-steps/s  / cleanrl_scan_u1: median {statistics.median(r):.3f} "
              f"(min {min(r):.3f}, max {max(r):.3f})", flush=True)


if __name__ == "__main__":
    main()
