"""Where a CPU population's time goes, thunk by thunk: fragc's PPO against PureJaxRL's `jit(vmap(train))`.

XLA's CPU runtime runs a program as thunks (a fusion, a copy, a loop, a sort...) and reports each to JAX's profiler.
For each side this traces one call of `--iterations` PPO iterations of N members (bench/population.py's sides) and
prints the thunks by kind (the name less its number): how many ran and their time (a loop's holds its body's),
and the while loops of the optimised HLO by trip count. This is how threefry's rolled CPU loop (a loop of 5 trips
for every random draw, the `"n":"5"` loops) was found: docs/benchmarks.md, "Threefry straight".

The profiler costs about a microsecond a thunk, so the times are inflated where thunks are many and small; the
counts are exact unless the profiler's buffer fills (keep N x iterations small: the default is 8 x 2).

    python bench/experiments/cpu_thunks.py [--members 8] [--iterations 2] [--sides fragc,fragc_rolled,purejaxrl]
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile

import jax
from jax.profiler import ProfileData

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import population  # noqa: E402

from fragc.algos import ppo  # noqa: E402

SIDES = {
    "fragc": population.fragc_side,
    "fragc_rolled": population.rolled_side,
    "purejaxrl": population.purejaxrl_side,
    "purejaxrl_straight": lambda c, n, k: population.purejaxrl_side(c, n, k, straight=True),
}


def thunks(run, seed: int) -> tuple[collections.Counter, collections.Counter]:
    """(count, nanoseconds) by thunk kind over one timed call of `run` (population.timed's)."""
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            run(seed)
        [path] = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
        data = ProfileData.from_file(path)
    count, time_ns = collections.Counter(), collections.Counter()
    for plane in data.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if line.name == "python":
                continue
            for event in line.events:
                if event.name.startswith(("end:", "Threadpool", "ThunkExecutor")):
                    continue
                kind = re.sub(r"[._]\d+$", "", event.name)
                count[kind] += 1
                time_ns[kind] += event.duration_ns
    return count, time_ns


def loops(hlo: str) -> collections.Counter:
    """The optimised HLO's while loops by known trip count ("?" where XLA knows none)."""
    trips = collections.Counter()
    for line in hlo.splitlines():
        if " while(" in line:
            found = re.search(r'known_trip_count":\{"n":"(\d+)"', line)
            trips[found.group(1) if found else "?"] += 1
    return trips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--sides", default="fragc,fragc_rolled,purejaxrl")
    parser.add_argument("--top", type=int, default=12, help="thunk kinds shown per side")
    args = parser.parse_args()
    config = ppo.Config()
    for side in args.sides.split(","):
        run = SIDES[side](config, args.members, args.iterations)
        run(1)  # compiled and warm
        count, time_ns = thunks(run, 2)
        inside = sum(ns for kind, ns in time_ns.items() if kind != "while")  # a loop's time holds its body's
        print(f"== {side}: N = {args.members}, {args.iterations} iterations: {sum(count.values()):,} thunks, "
              f"{inside / 1e6:.0f} ms in those that are not loops; loops of the HLO by trip count "
              f"{dict(sorted(loops(run.hlo()).items()))}")
        for kind, ns in time_ns.most_common(args.top):
            print(f"   {kind:40s} {count[kind]:9,} {ns / 1e6:9.1f} ms")


if __name__ == "__main__":
    main()
