"""fragc's PPO under one XLA CPU thread against XLA's default threads, in fresh processes (the thread count is fixed
when JAX starts, src/fragc/runtime/cpu_threads.py), sides alternating: a population of N members (vmapped, one
device), so that a choice measured on PPO's small iteration is checked where the batches are N times larger.

    python bench/cpu_threads.py --members 64 --iterations 64 --repeats 2
    python bench/cpu_threads.py --members 256 --iterations 16 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIDES = {"one": "1", "xla": "xla"}


def child(members: int, iterations: int) -> None:
    """Compile the population, run 16 iterations untimed, then `iterations` timed; print wall and CPU seconds."""
    import jax

    import fragc
    from fragc.algos import ppo

    prog = fragc.compile(ppo.PPO(ppo.Config()), fragc.population("single", members), iterations_per_dispatch=16)
    state = jax.block_until_ready(prog.run(prog.init(0), 16)[0])
    start, start_cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(prog.run(state, iterations)[0])
    print(json.dumps({"wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - start_cpu}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.members, args.iterations)
    times: dict[str, list[dict]] = {side: [] for side in SIDES}
    for r in range(args.repeats):
        for side, value in SIDES.items():
            env = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC", "JAX_NUM_CPU_DEVICES")}
            out = subprocess.run([sys.executable, __file__, "--child", "--members", str(args.members),
                                  "--iterations", str(args.iterations)], env={**env, "FRAGC_CPU_THREADS": value},
                                 capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"{side} failed:\n{out.stderr[-3000:]}")
            times[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r}: {side} {times[side][-1]['wall_s']:.2f} s (CPU {times[side][-1]['cpu_s']:.2f} s)  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    for what in ("wall_s", "cpu_s"):
        medians = {side: statistics.median(t[what] for t in runs) for side, runs in times.items()}
        print(f"{what}: one thread {medians['one']:.2f} s, XLA's default {medians['xla']:.2f} s: "
              f"ratio {medians['xla'] / medians['one']:.3f} (above 1: one thread is faster)")


if __name__ == "__main__":
    main()
