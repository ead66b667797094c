"""fragc's single-device PPO against two baselines, timed alternately in one process.

- `purejaxrl`: PPO written independently, the way PureJaxRL writes it
  (`bench/purejaxrl_ppo.py`: closures, a `TrainState`, the info dict as
  metrics; it ignores truncation), jitted as one fused scan. The ratio
  fragc / purejaxrl says whether fragc's PPO (which bootstraps truncated
  episodes from V(final observation)) is as fast as the reference.
- `plain_jit`: `jax.jit(lax.scan(algo.iteration))` of fragc's own PPO (outside
  a trace a fragment call is the plain function). The ratio fragc / plain_jit
  isolates fragc's lowering: same algorithm, same maths.

All run the same configuration (PureJaxRL's CartPole-v1), scan the same
number of iterations per dispatch, fetch their metrics after every dispatch
and are timed alternately (A B C A B C ...), so drift on a shared machine
hits each alike. Prints medians and per-repeat ratios of wall-clock
throughput and of process CPU time (steadier on a shared machine, and the
measure that shows a program using more threads); writes JSON.

    python bench/ppo_single.py [--repeats 9] [--iterations 128] [--compile-repeats 3] [--out bench/results]

Compile time is measured cold, each compile in a new process (alternating
sides), because in one process whichever side compiles second finds JAX's
caches warm: compile, init and the first dispatch (`compile_seconds`;
bench/cold_start.py runs it against another tree's fragc too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import purejaxrl_ppo  # noqa: E402

import fragc  # noqa: E402
from fragc.algos import ppo  # noqa: E402

SIDES = ("fragc", "plain_jit", "purejaxrl")
COMPILED_COLD = ("fragc", "purejaxrl")


def plain_jit(algo: ppo.PPO, k: int):
    """`k` iterations of the algorithm in one `jax.jit(lax.scan(...))`, state donated."""
    return jax.jit(lambda s: jax.lax.scan(lambda s, _: algo.iteration(s), s, None, k), donate_argnums=0)


def compile_seconds(which: str, k: int = 16) -> float:
    """Compile one side, make its initial state and run its first dispatch (k iterations, metrics fetched) in this
    (fresh) process: what a user waits for at start-up."""
    config = ppo.Config()
    start = time.perf_counter()
    if which == "fragc":
        prog = fragc.compile(ppo.PPO(config), "single", iterations_per_dispatch=k)
        prog.run(prog.init(0), k)
    else:
        init, train = purejaxrl_ppo.fused(config, k)
        state = jax.block_until_ready(jax.jit(init)(jax.random.key(0)))
        jax.device_get(train.lower(state).compile()(state))
    return time.perf_counter() - start


def cold_compile_times(repeats: int) -> dict[str, list[float]]:
    """Each compile in a new process (no warm JAX caches), alternating sides."""
    times: dict[str, list[float]] = {side: [] for side in COMPILED_COLD}
    for _ in range(repeats):
        for which in times:
            out = subprocess.run([sys.executable, __file__, "--compile-only", which], capture_output=True, text=True,
                                 check=True)
            times[which].append(float(out.stdout.strip().splitlines()[-1]))
    return times


def runners(args: argparse.Namespace) -> dict:
    """Per side: (initial state, a function running `args.iterations` iterations from a state)."""
    algo = ppo.PPO(ppo.Config())
    prog = fragc.compile(algo, "single", iterations_per_dispatch=args.k)
    state = prog.init(0)
    jitted = plain_jit(algo, args.k).lower(state).compile()
    init, fused = purejaxrl_ppo.fused(algo.config, args.k)
    pj_state = init(jax.random.key(0))
    fused = fused.lower(pj_state).compile()

    def dispatches(step):
        def run(state):
            state = jax.tree.map(jnp.copy, state)  # the step donates its input
            for _ in range(args.iterations // args.k):
                state, metrics = step(state)
                jax.device_get(metrics)
            return state
        return run

    return {"fragc": (state, lambda s: prog.run(s, args.iterations)[0]),
            "plain_jit": (state, dispatches(jitted)),
            "purejaxrl": (pj_state, dispatches(fused))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", choices=COMPILED_COLD, help=argparse.SUPPRESS)
    parser.add_argument("--compile-repeats", type=int, default=3, help="cold compiles per side, each in a new process")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--iterations", type=int, default=128, help="iterations timed per repeat")
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch, every side")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    if args.compile_only:
        print(compile_seconds(args.compile_only, args.k))
        return

    config = ppo.Config()
    steps = config.steps_per_iteration
    sides = runners(args)
    compiles = cold_compile_times(args.compile_repeats) if args.compile_repeats else {}
    states = {name: run(state) for name, (state, run) in sides.items()}  # warm up
    times: dict[str, list[float]] = {name: [] for name in SIDES}
    cpu: dict[str, list[float]] = {name: [] for name in SIDES}
    for _ in range(args.repeats):
        for name in SIDES:
            start, start_cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(sides[name][1](states[name]))
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    sps = {n: [args.iterations * steps / t for t in ts] for n, ts in times.items()}
    ratios = {f"fragc/{b}": [a / c for a, c in zip(sps["fragc"], sps[b])] for b in ("purejaxrl", "plain_jit")}
    cpu_ratios = {f"fragc/{b}": [c / a for a, c in zip(cpu["fragc"], cpu[b])] for b in ("purejaxrl", "plain_jit")}
    compile_s = {n: statistics.median(v) for n, v in compiles.items()}
    result = {
        "config": {"env": config.env, "num_envs": config.num_envs, "num_steps": config.num_steps,
                   "iterations_per_repeat": args.iterations, "iterations_per_dispatch": args.k,
                   "repeats": args.repeats, "backend": jax.default_backend()},
        "env_steps_per_s": {n: statistics.median(v) for n, v in sps.items()},
        "env_steps_per_s_each": sps,
        "ratio_median": {n: statistics.median(r) for n, r in ratios.items()},
        "ratios": ratios,
        "cpu_s_each": cpu,
        "cpu_ratio_median": {n: statistics.median(r) for n, r in cpu_ratios.items()},
        "cpu_ratios": cpu_ratios,
        "compile_s": compile_s,
        "compile_s_each": compiles,
        "compile_ratio": compile_s["fragc"] / compile_s["purejaxrl"] if compiles else None,
    }
    print(f"{'':12}{'env-steps/s (median)':>22}{'compile s (cold, median)':>26}")
    for n in SIDES:
        print(f"{n:12}{result['env_steps_per_s'][n]:>22.0f}{compile_s.get(n, float('nan')):>26.2f}")
    for n, r in ratios.items():
        print(f"throughput ratio {n}: median {statistics.median(r):.3f} (min {min(r):.3f}, max {max(r):.3f})")
    for n, r in cpu_ratios.items():
        print(f"CPU-time ratio {n} (baseline CPU s / fragc CPU s): median {statistics.median(r):.3f} "
              f"(min {min(r):.3f}, max {max(r):.3f})")
    if compiles:
        print(f"compile ratio fragc/purejaxrl: {result['compile_ratio']:.2f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ppo_single.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
