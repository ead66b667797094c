"""Cold start: compile + init + the first iterations of PPO CartPole, each in a fresh process, sides alternating.

The sides (`--sides`), each timed by `ppo_single.compile_seconds` from after the imports to the first run's
metrics on the host:

- `fragc`: fragc's built-in PPO under `single`, k iterations a dispatch; `base`: the same with another tree's
  fragc (`--base DIR`, a folder holding a `fragc` package laid out as installed: `DIR/fragc/{ir,passes,...}`);
- `purejaxrl_train`: PureJaxRL's ppo.py as it runs (bench/purejaxrl_ppo.py): `jax.jit(train)(key)`, init and
  every iteration in one program;
- `purejaxrl`: the same PPO as ppo_single.py's steady-state side runs it: init jitted, then a k-iteration program.

`--first-run` iterations (default k, one fragc dispatch; 976 is PureJaxRL's whole CartPole run of 5e5 steps).
Each round runs every side once, in an order rotated by one each round; the ratios are per round, then the median.

    python bench/cold_start.py [--repeats 7] [--k 16] [--first-run 16] [--sides fragc,purejaxrl_train]
        [--base /tmp/base-pkg] [--out bench/results]

No persistent compilation cache: JAX's is off unless configured, and the children run with
`JAX_ENABLE_COMPILATION_CACHE=false` to be sure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def one(side: str, k: int, first_run: int, base: str | None) -> tuple[float, float, float]:
    """(compile + init + first run s, the child's whole wall s, the child's CPU s) of `side` in a new process."""
    env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
    which = "fragc" if side == "base" else side
    if side == "base":
        env["PYTHONPATH"] = base + os.pathsep + env.get("PYTHONPATH", "")
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, os.path.join(HERE, "ppo_single.py"), "--compile-only", which, "--k", str(k),
                          "--first-run", str(first_run)],
                         capture_output=True, text=True, env=env, cwd="/tmp" if side == "base" else None)
    whole, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise SystemExit(f"{side}: {out.stderr[-2000:]}")
    cpu_s = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    return float(out.stdout.strip().splitlines()[-1]), whole, cpu_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch, both sides")
    parser.add_argument("--first-run", type=int, default=None, help="iterations run after init (default: k)")
    parser.add_argument("--sides", default="fragc,purejaxrl_train,purejaxrl")
    parser.add_argument("--base", default=None, help="a folder with another tree's fragc package")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    sides = args.sides.split(",") + (["base"] if args.base else [])
    first_run = args.first_run or args.k
    times: dict[str, list[float]] = {s: [] for s in sides}
    wholes: dict[str, list[float]] = {s: [] for s in sides}
    cpus: dict[str, list[float]] = {s: [] for s in sides}
    loads = []
    for r in range(args.repeats):
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:
            t, w, c = one(side, args.k, first_run, args.base)
            times[side].append(t)
            wholes[side].append(w)
            cpus[side].append(c)
        loads.append(os.getloadavg()[0])
        print(f"round {r}: " + ", ".join(f"{s} {times[s][-1]:.2f} (CPU {cpus[s][-1]:.1f})" for s in sides) + f" (load {loads[-1]:.1f})",
              flush=True)
    ratios = {f"{p}/{s}": [a / b for a, b in zip(times[p], times[s])] for p in sides if p.startswith("purejaxrl")
              for s in ("fragc", "base") if s in sides}
    if args.base:
        ratios["base/fragc"] = [b / t for b, t in zip(times["base"], times["fragc"])]
    cpu_ratios = {name: [cpus[name.split("/")[0]][i] / cpus[name.split("/")[1]][i] for i in range(args.repeats)]
                  for name in ratios}
    result = {"k": args.k, "first_run": first_run, "repeats": args.repeats, "seconds": times, "process_seconds": wholes, "process_cpu_seconds": cpus,
              "loads": loads, "cpu_ratios": cpu_ratios,
              "cpu_ratio_median": {n: statistics.median(v) for n, v in cpu_ratios.items()},
              "median_s": {s: statistics.median(v) for s, v in times.items()},
              "ratios": ratios, "ratio_median": {n: statistics.median(v) for n, v in ratios.items()}}
    for s in sides:
        print(f"{s:16} compile+init+first run median {result['median_s'][s]:.2f} s, process "
              f"{statistics.median(wholes[s]):.2f} s, process CPU {statistics.median(cpus[s]):.2f} s")
    for n, v in ratios.items():
        print(f"ratio {n} (> 1: the second is faster): median {statistics.median(v):.3f} (min {min(v):.3f}, "
              f"max {max(v):.3f}); whole process's CPU time: median {statistics.median(cpu_ratios[n]):.3f}")
    print(f"load average during the rounds: {min(loads):.1f}-{max(loads):.1f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cold_start.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
