"""N seeds of PPO CartPole as one population against `jax.jit(jax.vmap(...))` of bench/purejaxrl_ppo.py, a rewrite in
PureJaxRL's style (not PureJaxRL's own ppo.py, which bench/ppo_reference.py runs).

Both sides are written the same way: the members' init, mapped over them (`lax.map`), then one call that trains
the N members for `--iterations` PPO iterations, whose metrics reach the host. The training call is timed (the
ratio); each side's init is timed apart (`init_s`).

- `purejaxrl`: `jax.jit(jax.vmap(lambda s: lax.scan(update_step, s, None, iterations)))` of PureJaxRL's
  `make_train` (bench/purejaxrl_ppo.py), returning the per-step info dict as PureJaxRL's `train` does. Its
  init is not inside the vmap as in PureJaxRL's ppo.py: vmapped, it deadlocked XLA's CPU pool (`purejaxrl_side`).
- `fragc`: `prog = fragc.compile(PPO(config), fragc.population("single", N), iterations_per_dispatch=iterations)`,
  then `prog.run(prog.init(seed), iterations)`: one init program and one dispatch.

Both compile first (not timed); then the sides alternate, `--repeats` rounds per N, and the ratio
purejaxrl s / fragc s (> 1: fragc is faster) is taken per round, then the median.

- `purejaxrl_straight` (`--purejaxrl-straight`): PureJaxRL's program lowered as fragc lowers its own, with fragc's
  CPU lowerings (src/fragc/runtime/cpu_lowering.py: threefry straight, key-value sorts packed): what of fragc's lead is those
  lowering choices.
- `fragc_rolled` (`--fragc-rolled`): fragc's population with JAX's own CPU lowerings (threefry a 5-trip loop a
  draw, the minibatch shuffle's sort two buffers), the other half of that measure.
- `fragc_no_trunc` (`--no-trunc`): fragc's PPO without truncation bootstrapping (bench/ppo_single.py's
  `PPONoTruncation`), as a population: the purejaxrl side's maths on fragc.

    python bench/population.py [--sizes 8,32,64,256] [--iterations 8] [--repeats 5] [--plain-vmap] [--no-trunc]
        [--purejaxrl-straight] [--fragc-rolled]
        [--out bench/results]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import purejaxrl_ppo  # noqa: E402
from ppo_single import PPONoTruncation  # noqa: E402

import fragc  # noqa: E402
from fragc.algos import ppo  # noqa: E402
from fragc.runtime import cpu_lowering  # noqa: E402
from fragc.runtime.cpu_lowering import cpu_lowerings  # noqa: E402


def timed(make_state, train, hlo=None):
    """-> run(seed) -> (seconds training, seconds making the state): `make_state(seed)`, then `train(state)` ->
    (state, metrics), the metrics fetched and the state waited for: each side timed the same way. `run.hlo()` is
    the training program's optimised HLO (`hlo`), for bench/experiments/cpu_thunks.py."""
    def run(seed: int) -> tuple[float, float]:
        start = time.perf_counter()
        state = jax.block_until_ready(make_state(seed))
        made = time.perf_counter()
        state, metrics = train(state)
        jax.device_get(metrics)
        jax.block_until_ready(state)
        return time.perf_counter() - made, made - start

    run.hlo = hlo
    return run


def purejaxrl_side(config: ppo.Config, n: int, iterations: int, straight: bool = False):
    """PureJaxRL's `jax.jit(jax.vmap(train))`, its members' init mapped (`lax.map`) before it; -> a function of a
    seed. PureJaxRL's own `jax.jit(jax.vmap(make_train(config)))(keys)` vmaps init too, whose orthogonal
    initializer's batched QR (jaxlib's LAPACK kernels) deadlocked XLA's CPU thread pool here at N = 8 (no CPU
    time for minutes, as src/fragc/runtime/program.py `_init_fn` tells of fragc's vmapped init before it mapped its own)."""
    train = purejaxrl_ppo.make_train(config)
    init = jax.jit(lambda keys: jax.lax.map(train.init, keys))
    keys = jax.random.split(jax.random.key(0), n)
    vmapped = jax.jit(jax.vmap(lambda state: jax.lax.scan(train.update_step, state, None, iterations)),
                      donate_argnums=0)
    with cpu_lowerings() if straight else contextlib.nullcontext():
        vmapped = vmapped.lower(init(keys)).compile()

    return timed(lambda seed: init(jax.random.split(jax.random.key(seed), n)), vmapped, vmapped.as_text)


def fragc_side(config: ppo.Config, n: int, iterations: int, algorithm: type = ppo.PPO):
    """fragc's PPO (or `algorithm`) as a population of `n`, one dispatch of `iterations`; -> a function of a
    seed."""
    prog = fragc.compile(algorithm(config), fragc.population("single", n), iterations_per_dispatch=iterations)
    prog.run(prog.init(0), iterations)  # compiles what a run compiles on first use

    return timed(prog.init, lambda state: prog.run(state, iterations),
                 lambda: prog.hlo(prog.executables[0], optimized=True))


def rolled_side(config: ppo.Config, n: int, iterations: int):
    """`fragc_side` with fragc's CPU lowerings turned off: JAX's own (threefry a loop of 5 trips a draw, the
    shuffle's sort of two buffers)."""
    with cpu_lowering.choosing(threefry=False, sort=False):
        return fragc_side(config, n, iterations)


def plain_vmap_side(config: ppo.Config, n: int, iterations: int):
    """fragc's own PPO outside fragc: `jax.jit(jax.vmap(lambda s: lax.scan(algo.iteration, s, None, iterations)))`
    (a fragment called outside a trace is its plain function), from the population's init; -> a function of a
    seed. Against `fragc` it isolates fragc's lowering and runtime, against `purejaxrl` the algorithm."""
    algo = ppo.PPO(config)
    prog = fragc.compile(algo, fragc.population("single", n), iterations_per_dispatch=iterations)
    vmapped = jax.jit(jax.vmap(lambda state: jax.lax.scan(lambda s, _: algo.iteration(s), state, None, iterations)),
                      donate_argnums=0)
    vmapped = vmapped.lower(prog.init(0)).compile()

    return timed(prog.init, vmapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,32,64,256")
    parser.add_argument("--iterations", type=int, default=8, help="PPO iterations a call, both sides")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plain-vmap", action="store_true",
                        help="also time fragc's PPO as jit(vmap(scan(iteration))) outside fragc (plain_vmap_side)")
    parser.add_argument("--no-trunc", action="store_true",
                        help="also time fragc's PPO without truncation bootstrapping (ppo_single.PPONoTruncation: "
                             "PureJaxRL's GAE, the maths of the purejaxrl side) as a population")
    parser.add_argument("--purejaxrl-straight", action="store_true",
                        help="also time PureJaxRL's program lowered with fragc's CPU lowerings, as fragc lowers its own")
    parser.add_argument("--fragc-rolled", action="store_true",
                        help="also time fragc's population with JAX's own CPU lowerings (threefry rolled, sorts unpacked)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    config = ppo.Config()
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        sides = {"fragc": fragc_side(config, n, args.iterations),
                 "purejaxrl": purejaxrl_side(config, n, args.iterations)}
        if args.plain_vmap:
            sides["plain_vmap"] = plain_vmap_side(config, n, args.iterations)
        if args.purejaxrl_straight:
            sides["purejaxrl_straight"] = purejaxrl_side(config, n, args.iterations, straight=True)
        if args.fragc_rolled:
            sides["fragc_rolled"] = rolled_side(config, n, args.iterations)
        if args.no_trunc:
            sides["fragc_no_trunc"] = fragc_side(config, n, args.iterations, PPONoTruncation)
        for run in sides.values():  # warm up
            run(1)
        times: dict[str, list[float]] = {s: [] for s in sides}
        init_times: dict[str, list[float]] = {s: [] for s in sides}
        loads = []
        for r in range(args.repeats):
            order = list(sides)[r % len(sides):] + list(sides)[:r % len(sides)]
            for side in order:
                t, made = sides[side](r + 2)
                times[side].append(t)
                init_times[side].append(made)
            loads.append(os.getloadavg()[0])
        ratios = [p / f for p, f in zip(times["purejaxrl"], times["fragc"])]
        others = {f"{s}/fragc": statistics.median(a / f for a, f in zip(times[s], times["fragc"]))
                  for s in sides if s not in ("fragc", "purejaxrl")}
        if "fragc_no_trunc" in sides:  # the same maths on both sides
            others["purejaxrl/fragc_no_trunc"] = statistics.median(
                p / f for p, f in zip(times["purejaxrl"], times["fragc_no_trunc"]))
        steps = n * args.iterations * config.steps_per_iteration
        row = {"members": n, "iterations": args.iterations, "seconds": times, "init_s": init_times,
               "ratios": ratios, "ratio_median": statistics.median(ratios), "other_ratio_medians": others,
               "env_steps_per_s": {s: steps / statistics.median(v) for s, v in times.items()},
               "loads": loads}
        rows.append(row)
        print(f"N={n:4}: purejaxrl/fragc median {row['ratio_median']:.3f} (min {min(ratios):.3f}, max "
              f"{max(ratios):.3f}); env-steps/s fragc {row['env_steps_per_s']['fragc']:,.0f}, purejaxrl "
              f"{row['env_steps_per_s']['purejaxrl']:,.0f}; init s fragc {statistics.median(init_times['fragc']):.3f}, "
              f"purejaxrl {statistics.median(init_times['purejaxrl']):.3f}; load {min(loads):.1f}-{max(loads):.1f}"
              + "".join(f"; {k} median {v:.3f}" for k, v in others.items()), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "population.json"), "w") as f:
        json.dump({"iterations": args.iterations, "repeats": args.repeats, "rows": rows,
                   "backend": jax.default_backend()}, f, indent=2, default=np.asarray)


if __name__ == "__main__":
    main()
