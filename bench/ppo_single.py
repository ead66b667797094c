"""fragc's single-device PPO against two baselines, timed alternately in one process. Neither is PureJaxRL's own
code: the speed goal's baseline, PureJaxRL's ppo.py itself, is bench/ppo_reference.py's. The side named `purejaxrl`
here is a rewrite (second row).

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
from fragc.algos.diagnostics import episode_metrics  # noqa: E402

SIDES = ("fragc", "plain_jit", "purejaxrl")
OPTIONAL_SIDES = ("fragc_no_trunc",)
COMPILED_COLD = ("fragc", "purejaxrl")
COLD_SIDES = COMPILED_COLD + ("purejaxrl_train",)


class PPONoTruncation(ppo.PPO):
    """fragc's PPO without truncation bootstrapping, for timing what it costs (`--sides ...,fragc_no_trunc`):
    GAE as PureJaxRL does it, every episode end terminal and V(s_{t+1}) the next step's value (the last from
    the final observation), so the rollout's [T, N] critic pass over the reached observations is gone. It
    learns differently: a bench side, not an algorithm."""

    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None))
    def rollout(self, params, runner):
        def step(runner, _):
            keys = jax.vmap(lambda k: jax.random.split(k, 3))(runner.key)
            obs = runner.obs
            action, log_prob, value = self.model.act(params, obs, keys[:, 0])
            runner, out = self.env.step(runner.replace(key=keys[:, 2]), action, keys[:, 1])
            return runner, (obs, action, log_prob, value, out.reward, out.episode_done)

        runner, (obs, action, log_prob, value, reward, done) = jax.lax.scan(step, runner, None, self.config.num_steps)
        next_value = jnp.concatenate([value[1:], self.model.value(params, runner.obs)[None]])
        traj = ppo.Transition(obs, action, log_prob, value, obs, next_value, reward, done, done)
        metrics = {**episode_metrics(runner), "episodes": fragc.psum(jnp.sum(traj.done))}
        return traj, runner, metrics


def plain_jit(algo: ppo.PPO, k: int):
    """`k` iterations of the algorithm in one `jax.jit(lax.scan(...))`, state donated."""
    return jax.jit(lambda s: jax.lax.scan(lambda s, _: algo.iteration(s), s, None, k), donate_argnums=0)


def compile_seconds(which: str, k: int = 16, iterations: int | None = None) -> float:
    """Compile one side, make its initial state and run its first `iterations` (default: one dispatch, k), the
    metrics fetched, in this (fresh) process: what a user waits for at start-up. `purejaxrl_train` is PureJaxRL's
    ppo.py as it runs: `jax.jit(train)(key)`, init and every iteration in one program."""
    config = ppo.Config()
    iterations = iterations or k
    start = time.perf_counter()
    if which == "fragc":
        prog = fragc.compile(ppo.PPO(config), "single", iterations_per_dispatch=k)
        prog.run(prog.init(0), iterations)
    elif which == "purejaxrl_train":
        pj = purejaxrl_ppo.make_train(config)
        train = jax.jit(lambda key: jax.lax.scan(pj.update_step, pj.init(key), None, iterations))
        jax.device_get(train(jax.random.key(0)))
    else:
        init, train = purejaxrl_ppo.fused(config, k)
        state = jax.block_until_ready(jax.jit(init)(jax.random.key(0)))
        for _ in range(iterations // k):
            state, metrics = train(state)
            jax.device_get(metrics)
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
    jitted = plain_jit(algo, args.k).lower(state).compile() if "plain_jit" in args.sides else None
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

    out = {"fragc": (state, lambda s: prog.run(s, args.iterations)[0]),
           "plain_jit": (state, dispatches(jitted)),
           "purejaxrl": (pj_state, dispatches(fused))}
    if "fragc_no_trunc" in args.sides:
        no_trunc = fragc.compile(PPONoTruncation(algo.config), "single", iterations_per_dispatch=args.k)
        out["fragc_no_trunc"] = (no_trunc.init(0), lambda s: no_trunc.run(s, args.iterations)[0])
    return {side: out[side] for side in args.sides}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", choices=COLD_SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--first-run", type=int, default=None, help=argparse.SUPPRESS)  # with --compile-only
    parser.add_argument("--compile-repeats", type=int, default=3, help="cold compiles per side, each in a new process")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--iterations", type=int, default=128, help="iterations timed per repeat")
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch, every side")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help=f"the sides timed in steady state: fragc and purejaxrl, and any of plain_jit, "
                             f"{', '.join(OPTIONAL_SIDES)} (fragc's PPO without truncation bootstrapping)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    args.sides = [s for s in args.sides.split(",") if s]
    if not {"fragc", "purejaxrl"} <= set(args.sides) or not set(args.sides) <= set(SIDES + OPTIONAL_SIDES):
        parser.error(f"--sides: fragc and purejaxrl, and any of {', '.join(SIDES[1:] + OPTIONAL_SIDES)}")
    if args.compile_only:
        print(compile_seconds(args.compile_only, args.k, args.first_run))
        return

    config = ppo.Config()
    steps = config.steps_per_iteration
    sides = runners(args)
    compiles = cold_compile_times(args.compile_repeats) if args.compile_repeats else {}
    states = {name: run(state) for name, (state, run) in sides.items()}  # warm up
    times: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    loads = []
    for _ in range(args.repeats):
        for name in sides:
            start, start_cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(sides[name][1](states[name]))
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
        loads.append(os.getloadavg()[0])
    baselines = [b for b in sides if b != "fragc"]
    sps = {n: [args.iterations * steps / t for t in ts] for n, ts in times.items()}
    ratios = {f"src/fragc/{b}": [a / c for a, c in zip(sps["fragc"], sps[b])] for b in baselines}
    cpu_ratios = {f"src/fragc/{b}": [c / a for a, c in zip(cpu["fragc"], cpu[b])] for b in baselines}
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
        "loads": loads,
    }
    print(f"{'':16}{'env-steps/s (median)':>22}{'compile s (cold, median)':>26}")
    for n in sides:
        print(f"{n:16}{result['env_steps_per_s'][n]:>22.0f}{compile_s.get(n, float('nan')):>26.2f}")
    for n, r in ratios.items():
        print(f"throughput ratio {n}: median {statistics.median(r):.3f} (min {min(r):.3f}, max {max(r):.3f})")
    for n, r in cpu_ratios.items():
        print(f"CPU-time ratio {n} (baseline CPU s / fragc CPU s): median {statistics.median(r):.3f} "
              f"(min {min(r):.3f}, max {max(r):.3f})")
    if compiles:
        print(f"compile ratio src/fragc/purejaxrl: {result['compile_ratio']:.2f}")
    print(f"load average after each round: {min(loads):.1f}-{max(loads):.1f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ppo_single.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
