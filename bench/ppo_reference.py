"""fragc's built-in PPO against PureJaxRL's own `ppo.py`, at PureJaxRL's CartPole-v1 configuration, side by side.

The reference is PureJaxRL's file itself, built at a pinned revision by `python bench/references/build.py` into
bench/references/build/purejaxrl/ (its patches are listed there). Without it this bench says so and stops: it never
substitutes a rewrite.

Both sides train the same run: 976 iterations of 4 environments x 128 steps, 4 epochs of 4 minibatches.
- `purejaxrl`: `jax.jit(make_train(config))(key)`, as its `__main__` runs it (DEBUG off: its per-iteration print
  callback is logging, not training), the outputs waited for.
- `fragc`: `prog.run(prog.init(seed), 976)` of `fragc.compile(ppo.PPO(ppo.Config()), "single")`, its metrics
  fetched as a run fetches them.

Modes (ratios are PureJaxRL's time / fragc's: above 1 fragc is faster):
- `--mode steady`: one process, both compiled first, then timed alternately (A B A B ...): wall and process CPU
  time, medians and per-round ratios.
- `--mode fresh`: each run in a new process, alternating sides, as a user's process runs it: compile
  (PureJaxRL: `jax.jit(train).lower(key).compile()`; fragc: `fragc.compile` and `prog.init`), then one run. Reports the training time and the whole process's wall time,
  with JAX's compilation cache in `--cache` (both sides), or none (cold).

`--busy N` starts N processes that spin on a core for the whole measurement: "one other busy process on the
machine" is `--busy 1`. Each result names the processor, the load averages and the reference's revision; JSON goes
to `--out`.

    python bench/ppo_reference.py --mode steady --repeats 7
    python bench/ppo_reference.py --mode steady --repeats 7 --busy 1
    python bench/ppo_reference.py --mode fresh --repeats 5
    python bench/ppo_reference.py --mode steady --repeats 7 --k 976    # fragc's whole run in one dispatch
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import references_built as references  # noqa: E402
import side_by_side  # noqa: E402

from fragc.runtime import cpu_lowering  # noqa: E402,F401  (before any jit: its jit-cache state, src/fragc/runtime/cpu_lowering.py)

CONFIG = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 5e5, "UPDATE_EPOCHS": 4,
          "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01,
          "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1",
          "ANNEAL_LR": True, "DEBUG": False}
"""PureJaxRL's `__main__` configuration of ppo.py (DEBUG off)."""
ITERATIONS = int(CONFIG["TOTAL_TIMESTEPS"] // CONFIG["NUM_STEPS"] // CONFIG["NUM_ENVS"])  # 976
SIDES = ("purejaxrl", "fragc")


def fragc_config(config: dict):
    """fragc's PPO config for PureJaxRL's: the same fields (fragc's defaults are PureJaxRL's, checked here)."""
    from fragc.algos import ppo

    mine = ppo.Config(num_envs=config["NUM_ENVS"], num_steps=config["NUM_STEPS"],
                      total_steps=int(config["TOTAL_TIMESTEPS"]), lr=config["LR"], anneal_lr=config["ANNEAL_LR"],
                      update_epochs=config["UPDATE_EPOCHS"], num_minibatches=config["NUM_MINIBATCHES"],
                      gamma=config["GAMMA"], gae_lambda=config["GAE_LAMBDA"], clip_eps=config["CLIP_EPS"],
                      ent_coef=config["ENT_COEF"], vf_coef=config["VF_COEF"], max_grad_norm=config["MAX_GRAD_NORM"],
                      activation=config["ACTIVATION"], env=config["ENV_NAME"])
    assert mine.iterations == ITERATIONS, (mine.iterations, ITERATIONS)
    return mine


def make_side(side: str, k: int = 16) -> side_by_side.Side:
    """The side's (compile(), run(seed)); fragc's with `k` iterations a dispatch."""
    import jax

    if side == "purejaxrl":
        train = jax.jit(references.load("purejaxrl", "ppo").make_train(dict(CONFIG)))
        return side_by_side.jitted_side(train, jax.random.PRNGKey)
    import fragc
    from fragc.algos import ppo

    return side_by_side.fragc_side(
        lambda: fragc.compile(ppo.PPO(fragc_config(CONFIG)), "single", iterations_per_dispatch=k), ITERATIONS)


def child(side: str, k: int) -> None:
    """In a fresh process, what a user's process does: compile (PureJaxRL: `jax.jit(train).lower(key).compile()`;
    fragc: `fragc.compile` and `prog.init`), then one run timed."""
    import jax

    holder = {}
    if side == "purejaxrl":
        key = jax.random.PRNGKey(1)

        def compile_() -> None:
            holder["train"] = jax.jit(references.load("purejaxrl", "ppo").make_train(dict(CONFIG))).lower(key).compile()

        def run() -> None:
            jax.block_until_ready(holder["train"](key))
    else:
        import fragc
        from fragc.algos import ppo

        def compile_() -> None:
            holder["prog"] = prog = fragc.compile(ppo.PPO(fragc_config(CONFIG)), "single", iterations_per_dispatch=k)
            holder["state"] = jax.block_until_ready(prog.init(1))  # (PureJaxRL's program makes its state inside)

        def run() -> None:
            jax.block_until_ready(holder["prog"].run(holder["state"], ITERATIONS)[0])

    side_by_side.timed_child(compile_, run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("steady", "fresh"), default="steady")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on a core meanwhile")
    parser.add_argument("--cache", default=None, help="fresh mode: a compilation cache folder (default: cold)")
    parser.add_argument("--k", type=int, default=16, help=f"fragc's iterations a dispatch (16, its default; "
                        f"{ITERATIONS}: the whole run in one dispatch, as PureJaxRL's one program)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.k)
        return
    revision = references.require("purejaxrl")
    with side_by_side.spinning(args.busy):
        if args.mode == "steady":
            raw = side_by_side.steady({side: make_side(side, args.k) for side in SIDES}, args.repeats)
        else:
            raw = side_by_side.fresh(__file__, SIDES, args.repeats, args.cache, ["--k", str(args.k)])
    processor = references.processor()
    side_by_side.summary(
        raw, args.mode, "purejaxrl", "PureJaxRL",
        f"PureJaxRL ppo.py @ {revision['commit'][:12]} against fragc's PPO (k={args.k}), {args.mode}, {args.busy} busy, "
        f"{processor}", args.out, f"ppo_reference_{args.mode}_busy{args.busy}_k{args.k}",
        busy=args.busy, k=args.k, processor=processor, reference=revision, config=CONFIG, iterations=ITERATIONS)


if __name__ == "__main__":
    main()
