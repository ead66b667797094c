"""(CPU) `jax.random.permutation` of N rows of L elements, as PPO's minibatch shuffle draws it in a population:
JAX's CPU lowering (a stable sort of two buffers, keys and positions, through a compiled comparator) against
fragc's (`src/fragc/runtime/cpu_lowering.py`: one sort of 64-bit words, key above position). Both programs are checked
equal, then timed alternately; prints the medians and their ratio (docs/benchmarks.md, "Sorts packed").

    python bench/experiments/sort_lowering.py [--rows 64] [--length 512] [--repeats 7] [--calls 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from fragc.runtime.cpu_lowering import cpu_lowerings


def seconds_a_call(program, keys, calls: int) -> float:
    program(keys).block_until_ready()
    start = time.perf_counter()
    for _ in range(calls):
        out = program(keys)
    out.block_until_ready()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64, help="members of a population (each its own permutation)")
    parser.add_argument("--length", type=int, default=512, help="elements permuted (PPO CartPole: 128 x 4 steps)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50, help="calls a timing")
    args = parser.parse_args()

    def permutations(keys):
        return jax.vmap(lambda key: jax.random.permutation(key, args.length))(keys)

    keys = jax.random.split(jax.random.key(0), args.rows)
    jax_lowering = jax.jit(permutations).lower(keys).compile()
    with cpu_lowerings():
        fragc_lowering = jax.jit(lambda k: permutations(k)).lower(keys).compile()  # another function: its own lowering
    np.testing.assert_array_equal(np.asarray(jax_lowering(keys)), np.asarray(fragc_lowering(keys)))
    times = {"jax": [], "fragc": []}
    for _ in range(args.repeats):
        times["jax"].append(seconds_a_call(jax_lowering, keys, args.calls))
        times["fragc"].append(seconds_a_call(fragc_lowering, keys, args.calls))
    ratios = [j / f for j, f in zip(times["jax"], times["fragc"])]
    print(f"{args.rows} permutations of {args.length}: JAX's lowering {statistics.median(times['jax']) * 1e3:.2f} ms, "
          f"fragc's {statistics.median(times['fragc']) * 1e3:.2f} ms a call; JAX's / fragc's median "
          f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}); the same permutations")


if __name__ == "__main__":
    main()
