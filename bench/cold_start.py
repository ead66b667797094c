"""Cold start: compile + init + first dispatch of PPO CartPole, each in a fresh process, sides alternating.

The sides are fragc's built-in PPO under `single` (this tree, and optionally another tree's fragc given by
`--base DIR`, a folder holding a `fragc` package laid out as installed: `DIR/fragc/{ir,passes,runtime,algos}`)
and the PureJaxRL-style PPO of bench/purejaxrl_ppo.py (its init jitted, its k-iteration train compiled), both
timed by `ppo_single.compile_seconds` from after the imports to the first dispatch's metrics on the host. Each
round runs every side once, in an order rotated by one each round; the ratios are per round, then the median.

    python bench/cold_start.py [--repeats 7] [--k 16] [--base /tmp/base-pkg] [--out bench/results]

No persistent compilation cache: JAX's is off unless configured, and the children run with
`JAX_ENABLE_COMPILATION_CACHE=false` to be sure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def one(side: str, k: int, base: str | None) -> tuple[float, float]:
    """(compile + init + first dispatch s, the child's whole wall s) of `side` in a new process."""
    env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
    which = "purejaxrl" if side == "purejaxrl" else "fragc"
    if side == "base":
        env["PYTHONPATH"] = base + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, os.path.join(HERE, "ppo_single.py"), "--compile-only", which, "--k", str(k)],
                         capture_output=True, text=True, env=env, cwd="/tmp" if side == "base" else None)
    whole = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"{side}: {out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1]), whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch, both sides")
    parser.add_argument("--base", default=None, help="a folder with another tree's fragc package")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    sides = ["fragc", "purejaxrl"] + (["base"] if args.base else [])
    times: dict[str, list[float]] = {s: [] for s in sides}
    wholes: dict[str, list[float]] = {s: [] for s in sides}
    loads = []
    for r in range(args.repeats):
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:
            t, w = one(side, args.k, args.base)
            times[side].append(t)
            wholes[side].append(w)
        loads.append(os.getloadavg()[0])
        print(f"round {r}: " + ", ".join(f"{s} {times[s][-1]:.2f}" for s in sides) + f" (load {loads[-1]:.1f})",
              flush=True)
    ratios = {f"purejaxrl/{s}": [p / t for p, t in zip(times["purejaxrl"], times[s])] for s in sides if s != "purejaxrl"}
    if args.base:
        ratios["base/fragc"] = [b / t for b, t in zip(times["base"], times["fragc"])]
    result = {"k": args.k, "repeats": args.repeats, "seconds": times, "process_seconds": wholes, "loads": loads,
              "median_s": {s: statistics.median(v) for s, v in times.items()},
              "ratios": ratios, "ratio_median": {n: statistics.median(v) for n, v in ratios.items()}}
    for s in sides:
        print(f"{s:10} compile+init+first dispatch median {result['median_s'][s]:.2f} s, process "
              f"{statistics.median(wholes[s]):.2f} s")
    for n, v in ratios.items():
        print(f"ratio {n} (> 1: the second is faster): median {statistics.median(v):.3f} (min {min(v):.3f}, "
              f"max {max(v):.3f})")
    print(f"load average during the rounds: {min(loads):.1f}-{max(loads):.1f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cold_start.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
