"""A population of N PPO seeds against PureJaxRL's own way of running seeds: `jax.jit(jax.vmap(make_train(config)))`
of its `ppo.py`, at its CartPole-v1 configuration (976 iterations a member), side by side in one process.

- `purejaxrl`: `jax.jit(jax.vmap(make_train(CONFIG)))(jax.random.split(key, N))`, as PureJaxRL's README runs seeds:
  PureJaxRL's file itself, built by `python bench/references/build.py`.
- `fragc`: `fragc.compile(PPO(config), fragc.population("single", N))`, then `prog.run(prog.init(seed), 976)`.

Timed alternately (side_by_side.steady): wall and process CPU time, medians; ratio = PureJaxRL's time / fragc's.

On jax 0.10.2 with more than one core, PureJaxRL's vmapped `train` sometimes never returns from its first call (XLA's
CPU thread pool wedges: seen at N = 2 and 8 with 97 iterations; `--xla_cpu_multi_thread_eigen=false` does not help;
pinned to one core it always ran). The bench waits
`--hang-after` seconds for that call, then says so and stops. `--cores 1` pins this process to one core before JAX
starts (both sides, so the comparison stays like for like).

    python bench/population_reference.py --cores 1 --sizes 8 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def pin(cores: int | None) -> None:
    """Pin this process to its first `cores` allowed cores (before JAX starts: XLA sizes its pool by them)."""
    if cores:
        allowed = sorted(os.sched_getaffinity(0))
        if cores > len(allowed):
            raise SystemExit(f"--cores {cores}: this process may use {len(allowed)} cores")
        os.sched_setaffinity(0, allowed[:cores])


def watchdog(seconds: float, what: str) -> threading.Timer:
    """Stop the process with one line if `what` has not returned in `seconds` (cancel the timer when it has)."""
    def stop() -> None:
        print(f"{what} did not return in {seconds:.0f} s: XLA's CPU thread pool wedged (PureJaxRL's jit(vmap(train)) "
              f"on more than one core); rerun with --cores 1", flush=True)
        os._exit(3)

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    return timer


def sides(n: int, hang_after: float) -> dict:
    import jax

    import fragc
    import ppo_reference
    import references_built as references
    import side_by_side
    from fragc.algos import ppo

    train = jax.jit(jax.vmap(references.load("purejaxrl", "ppo").make_train(dict(ppo_reference.CONFIG))))
    _, run_reference = side_by_side.jitted_side(train, lambda seed: jax.random.split(jax.random.PRNGKey(seed), n))

    def compile_reference() -> None:
        timer = watchdog(hang_after, f"PureJaxRL's jax.jit(jax.vmap(make_train)) of {n} seeds")
        run_reference(0)
        timer.cancel()

    config = ppo_reference.fragc_config(ppo_reference.CONFIG)
    fragc_side = side_by_side.fragc_side(lambda: fragc.compile(ppo.PPO(config), fragc.population("single", n)),
                                         ppo_reference.ITERATIONS)
    return {"purejaxrl": (compile_reference, run_reference), "fragc": fragc_side}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8", help="population sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cores", type=int, default=None, help="pin to this many cores before JAX starts")
    parser.add_argument("--hang-after", type=float, default=300.0,
                        help="seconds to wait for PureJaxRL's first (compiling) call")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    pin(args.cores)
    import references_built as references
    import side_by_side
    from fragc.runtime import cpu_lowering  # noqa: F401  (before any jit: its jit-cache state)

    revision = references.require("purejaxrl")
    processor = references.processor()
    for n in (int(s) for s in args.sizes.split(",")):
        raw = side_by_side.steady(sides(n, args.hang_after), args.repeats)
        side_by_side.summary(
            raw, "steady", "purejaxrl", "PureJaxRL",
            f"PureJaxRL ppo.py @ {revision['commit'][:12]} jit(vmap(make_train)) against fragc.population('single', "
            f"{n}), 976 iterations a member, {processor}", args.out, f"population_reference_n{n}_cores{args.cores}",
            size=n, cores=args.cores, processor=processor, reference=revision, iterations=976)


if __name__ == "__main__":
    main()
