"""fragc's built-in IPPO against JaxMARL's own `ippo_ff_mpe.py`, at JaxMARL's MPE_simple_spread_v3 configuration,
side by side.

The reference is JaxMARL's file itself, built at a pinned revision by `python bench/references/build.py` into
bench/references/build/jaxmarl/ (no patches). Without it this bench says so and stops: it never substitutes a
rewrite.

The configuration is JaxMARL's `config/ippo_ff_mpe.yaml`, as the script's hydra `main` passes it to `make_train`
(`OmegaConf.to_container` of the yaml: its keys are already the upper-case ones `make_train` reads), with one
seed trained instead of `main`'s NUM_SEEDS=10 under `jax.vmap`, and TOTAL_TIMESTEPS from `--total-steps` (default
1e6, the run the issue measured; the yaml's own is 1e7). So both sides train 16 environments x 128 steps x 3 agents
per iteration, 4 epochs of 4 minibatches, total_steps // 2048 iterations (488 at 1e6).
- `jaxmarl`: `jax.jit(make_train(config))(key)`, the outputs waited for. `make_train` logs through
  `jax.experimental.io_callback` -> `wandb.log` on every update; that callback is part of the reference as it
  runs (it is in the jitted program, a host round trip per update), so it stays, with `wandb.init(mode="disabled")`
  first (the yaml's own WANDB_MODE), as bench/references/README.md says.
- `fragc`: `prog.run(prog.init(seed), iterations)` of `fragc.compile(ippo.IPPO(ippo.Config(...)), "single")`, what
  `fragc run ippo` builds; its metrics fetched as a run fetches them. fragc's ippo.Config defaults are JaxMARL's
  yaml: `fragc_config` checks them field by field against the yaml actually read, and raises where they differ.

Where the two algorithms differ (the same hyperparameters, not the same arithmetic in every detail):
- Truncation: JaxMARL's GAE stops at every `done` (MPE's 25-step time limit included) without bootstrapping;
  fragc's PPO bootstraps a truncated step from V of the state it reached (one batched critic pass over the
  trajectory's next observations), and stops only at termination. On MPE every episode ends by truncation.
- Keys: JaxMARL splits one key per step for the actions and one per environment for the steps; fragc carries a
  key per environment. The random streams differ; the work does not.
- Logging: JaxMARL's per-update io_callback (above); fragc's metrics come back once, at the end of `run`.

Ratios are JaxMARL's time / fragc's: above 1, fragc is faster.
`--mode steady` (one process, A B A B), `--mode fresh` (new processes) and `--busy N` (N processes spinning
meanwhile) are bench/side_by_side.py's. Each result names the processor, the load averages and the reference's
revision; JSON goes to `--out`.

    python bench/ippo_reference.py --mode steady --repeats 7
    python bench/ippo_reference.py --mode steady --repeats 7 --busy 1
    python bench/ippo_reference.py --mode fresh --repeats 5
    python bench/ippo_reference.py --mode steady --repeats 1 --total-steps 1e5     # a quick check
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

NAME = "jaxmarl"
SIDES = (NAME, "fragc")
DEFAULT_TOTAL_STEPS = 1e6
"""The run the issue measured (the yaml's TOTAL_TIMESTEPS is 1e7: `--total-steps 1e7` for it)."""


def reference_config(total_steps: float) -> dict:
    """The config JaxMARL's hydra `main` passes to `make_train`: `OmegaConf.to_container` of ippo_ff_mpe.yaml,
    with TOTAL_TIMESTEPS = `total_steps` (one seed is trained: NUM_SEEDS is `main`'s vmap, not make_train's)."""
    from omegaconf import OmegaConf

    path = os.path.join(references.folder(NAME), "config", "ippo_ff_mpe.yaml")
    config = OmegaConf.to_container(OmegaConf.load(path))
    config["TOTAL_TIMESTEPS"] = total_steps
    config["NUM_SEEDS"] = 1
    return config


iterations = references.jaxmarl_updates  # JaxMARL's NUM_UPDATES


def fragc_config(config: dict):
    """fragc's IPPO config for JaxMARL's: fragc's defaults (meant to be JaxMARL's yaml), checked field by field
    against the yaml read here; only total_steps is set. Raises where any field differs."""
    from fragc.algos import ippo

    mine = ippo.Config(total_steps=int(config["TOTAL_TIMESTEPS"]))
    pairs = {**references.JAXMARL_PPO_FIELDS, "activation": ("ACTIVATION", str)}
    # what JaxMARL's script fixes in code rather than in its yaml: ActorCritic's two 64-unit layers per MLP, the
    # clipped value loss, one network for all agents, no environment arguments
    fixed = {"hidden": 64, "clip_value": True, "shared_params": True}
    wrong = references.jaxmarl_differences(mine, config, pairs, fixed)
    if wrong:
        raise SystemExit("fragc's ippo.Config disagrees with JaxMARL's ippo_ff_mpe.yaml:\n  " + "\n  ".join(wrong))
    return mine


def make_side(side: str, config: dict) -> side_by_side.Side:
    """The side's (compile(), run(seed))."""
    import jax

    if side == NAME:
        import wandb

        wandb.init(mode="disabled")  # make_train's io_callback calls wandb.log on every update
        train = jax.jit(references.load(NAME, "ippo_ff_mpe").make_train(dict(config)))
        return side_by_side.jitted_side(train, jax.random.PRNGKey)
    import fragc
    from fragc.algos import ippo

    return side_by_side.fragc_side(lambda: fragc.compile(ippo.IPPO(fragc_config(config)), "single"),
                                   iterations(config))


def child(side: str, config: dict) -> None:
    """In a fresh process: compile (and a first run), then one timed run."""
    compile_, run = make_side(side, config)
    side_by_side.timed_child(compile_, lambda: run(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("steady", "fresh"), default="steady")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on a core meanwhile")
    parser.add_argument("--total-steps", type=float, default=DEFAULT_TOTAL_STEPS,
                        help="TOTAL_TIMESTEPS of both sides (default 1e6; the yaml's is 1e7)")
    parser.add_argument("--cache", default=None, help="fresh mode: a compilation cache folder (default: cold)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    revision = references.require(NAME)
    config = reference_config(args.total_steps)
    fragc_config(config)  # the configs agree, or stop before anything is timed
    if args.child:
        child(args.child, config)
        return
    with side_by_side.spinning(args.busy):
        if args.mode == "steady":
            raw = side_by_side.steady({side: make_side(side, config) for side in SIDES}, args.repeats)
        else:
            raw = side_by_side.fresh(__file__, SIDES, args.repeats, args.cache,
                                     ["--total-steps", repr(args.total_steps)])
    processor = references.processor()
    side_by_side.summary(
        raw, args.mode, NAME, "JaxMARL",
        f"JaxMARL ippo_ff_mpe.py @ {revision['commit'][:12]} against fragc's IPPO, {config['ENV_NAME']}, "
        f"{iterations(config)} iterations, {args.mode}, {args.busy} busy, {processor}",
        args.out, f"ippo_reference_{args.mode}_busy{args.busy}", busy=args.busy, processor=processor,
        reference=revision, config=config, iterations=iterations(config))


if __name__ == "__main__":
    main()
