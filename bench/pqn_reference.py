"""fragc's built-in PQN against purejaxql's own `pqn_gymnax.py`, at purejaxql's CartPole-v1 configuration, side by
side.

The reference is purejaxql's file itself, built at a pinned revision by `python bench/references/build.py` into
bench/references/build/purejaxql/ (one patch: gymnax 1.0's 6-tuple step folded back to `done = terminated |
truncated` in its `vmap_step`). Without it this bench says so and stops: it never substitutes a rewrite.

The configuration is the one the script's hydra `main` passes on for `python pqn_gymnax.py +alg=pqn_cartpole`:
config/config.yaml with config/alg/pqn_cartpole.yaml composed under `alg`, `OmegaConf.to_container`, then
`single_run`'s `{**config, **config["alg"]}`. TOTAL_TIMESTEPS (and TOTAL_TIMESTEPS_DECAY with it, equal in the yaml:
fragc decays its schedules over its run, it has no separate decay length) comes from `--total-steps`, default the
yaml's 5e5. So both sides train 244 iterations of 32 environments x 64 steps, 4 epochs of 16 minibatches, RAdam
at 1e-4 decayed linearly, epsilon 1 -> 0.2 over the first fifth of the iterations, two 256-unit LayerNorm layers.
- `purejaxql`: `jax.jit(jax.vmap(make_train(config)))(jax.random.split(key, NUM_SEEDS))` with the yaml's
  NUM_SEEDS = 1, as `single_run` runs it, the outputs waited for. The yaml's WANDB_MODE is "disabled", so
  make_train adds no wandb callback at all.
- `fragc`: `prog.run(prog.init(seed), iterations)` of `fragc.compile(pqn.PQN(pqn.Config(...)), "single")`, what
  `fragc run pqn` builds; its metrics fetched as a run fetches them. fragc's pqn.Config defaults are purejaxql's
  yaml: `fragc_config` checks them field by field against the config composed here, and raises where they differ.

TEST_DURING_TRAINING: the yaml turns it on (every int(NUM_UPDATES * TEST_INTERVAL) = 12 updates, and once before
training: 128 environments x a fixed 500-step scan, greedy). It is evaluation, not training: it changes no
parameter (it only takes a key split off the training key), as ppo_reference turns PureJaxRL's DEBUG off. By
default this bench turns it off on the reference side and runs fragc without evaluation (eval_every 0): both
sides time training alone. `--test-during-training` keeps it as the yaml sets it and turns fragc's nearest
equivalent on (eval_every 12, eval_episodes 128, greedy; also 21 evaluations over 244 iterations, at iterations
0, 12, 24, ... before the rollout, where purejaxql tests after updates 12, 24, ... and once before training).
The evaluation work then differs: fragc plays each environment's first episode in a `lax.while_loop` that stops
when all have ended (at most 500 steps), purejaxql always scans 500 steps with resets; so that mode's ratio
includes an evaluation that does less work on fragc's side while the policy is poor.

Where the two algorithms differ (the same hyperparameters, not the same arithmetic in every detail):
- Truncation: purejaxql (through the patched fold, as with gymnax 0.0.x) sees done = terminated | truncated and
  its Q(lambda) return takes the reward alone at any done, CartPole's 500-step time limit included; fragc's
  bootstraps a truncated step from max_a Q of the state it reached (the environment's final observation).
- Next-state values: purejaxql reuses the acting pass's Q values of the next step (and one extra pass for the
  last next observation); fragc runs one batched Q pass over the trajectory's next observations (the final
  ones, before any reset).
- Keys: purejaxql splits one key per step into per-environment keys for exploration and the environments' steps;
  fragc carries a key per environment and splits it each step. purejaxql shuffles each epoch's minibatches and
  targets with one key; so does fragc, from its learner's key. The random streams differ; the work does not.
- Network: purejaxql's QNetwork also runs a dummy BatchNorm on its input (NORM_INPUT False: its output unused,
  its batch statistics updated in training); fragc's has none. LayerNorm, relu and the Dense layers are the same.

Ratios are purejaxql's time / fragc's: above 1, fragc is faster.
`--mode steady` (one process, A B A B), `--mode fresh` (new processes) and `--busy N` (N processes spinning
meanwhile) are bench/side_by_side.py's. Each result names the processor, the load averages and the reference's
revision; JSON goes to `--out`.

    python bench/pqn_reference.py --mode steady --repeats 7
    python bench/pqn_reference.py --mode steady --repeats 7 --busy 1
    python bench/pqn_reference.py --mode fresh --repeats 5
    python bench/pqn_reference.py --mode steady --repeats 1 --total-steps 2e4     # a quick check
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

NAME = "purejaxql"
SIDES = (NAME, "fragc")
CONFIG_DIR = os.path.join(references.folder(NAME), "config")


def reference_config(total_steps: float | None, test_during_training: bool) -> dict:
    """The config purejaxql's `main` -> `single_run` passes to `make_train` for `+alg=pqn_cartpole`, with
    TOTAL_TIMESTEPS (and TOTAL_TIMESTEPS_DECAY) = `total_steps` where given, and TEST_DURING_TRAINING as asked."""
    from omegaconf import OmegaConf

    composed = OmegaConf.merge(OmegaConf.load(os.path.join(CONFIG_DIR, "config.yaml")),
                               {"alg": OmegaConf.load(os.path.join(CONFIG_DIR, "alg", "pqn_cartpole.yaml"))})
    config = OmegaConf.to_container(composed)
    config = {**config, **config["alg"]}  # single_run's first line
    if total_steps is not None:
        config["TOTAL_TIMESTEPS"] = config["TOTAL_TIMESTEPS_DECAY"] = total_steps
    if config["TOTAL_TIMESTEPS_DECAY"] != config["TOTAL_TIMESTEPS"]:
        raise SystemExit("purejaxql's TOTAL_TIMESTEPS_DECAY differs from its TOTAL_TIMESTEPS; fragc decays over its run")
    if not test_during_training:
        config["TEST_DURING_TRAINING"] = False  # evaluation, not training: see the docstring
    return config


def iterations(config: dict) -> int:
    """purejaxql's NUM_UPDATES."""
    return int(config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"])


def fragc_config(config: dict):
    """fragc's PQN config for purejaxql's: fragc's defaults (meant to be purejaxql's pqn_cartpole.yaml), checked
    field by field against the composed config; only total_steps (and, with the reference's test during training,
    evaluation) is set. Raises where any field differs."""
    from fragc.algos import pqn

    evaluation = {}
    if config.get("TEST_DURING_TRAINING", False):
        evaluation = {"eval_every": int(iterations(config) * config["TEST_INTERVAL"]),
                      "eval_episodes": int(config["TEST_NUM_ENVS"])}
        if not evaluation["eval_every"]:  # purejaxql's `n_updates % 0`: no schedule fragc can match
            raise SystemExit(f"--test-during-training: {iterations(config)} iterations are too few for "
                             f"TEST_INTERVAL {config['TEST_INTERVAL']} (an interval of 0 updates)")
    mine = pqn.Config(total_steps=int(config["TOTAL_TIMESTEPS"]), **evaluation)
    pairs = {"env": ("ENV_NAME", str), "num_envs": ("NUM_ENVS", int), "num_steps": ("NUM_STEPS", int),
             "total_steps": ("TOTAL_TIMESTEPS", int), "lr": ("LR", float), "lr_linear_decay": ("LR_LINEAR_DECAY", bool),
             "num_epochs": ("NUM_EPOCHS", int), "num_minibatches": ("NUM_MINIBATCHES", int),
             "gamma": ("GAMMA", float), "td_lambda": ("LAMBDA", float), "reward_scale": ("REW_SCALE", float),
             "eps_start": ("EPS_START", float), "eps_finish": ("EPS_FINISH", float), "eps_decay": ("EPS_DECAY", float),
             "max_grad_norm": ("MAX_GRAD_NORM", float), "hidden": ("HIDDEN_SIZE", int),
             "num_layers": ("NUM_LAYERS", int)}
    wrong = [f"{field}: fragc {getattr(mine, field)!r}, purejaxql {key}={convert(config[key])!r}"
             for field, (key, convert) in pairs.items() if getattr(mine, field) != convert(config[key])]
    # what has no fragc field: fragc's network is Dense -> LayerNorm -> relu on the raw observation, its greedy
    # evaluation takes argmax Q (EPS_TEST 0), and gymnax.make takes no arguments in purejaxql either
    fixed = {"NORM_TYPE": "layer_norm", "NORM_INPUT": False, "EPS_TEST": 0.0, "ENV_KWARGS": {}}
    wrong += [f"{key}: purejaxql {config.get(key)!r}, fragc's PQN has only {value!r}"
              for key, value in fixed.items() if config.get(key, value) != value]
    if mine.network not in ("auto", "mlp"):  # auto: the MLP on CartPole's vector observation
        wrong.append(f"network: fragc {mine.network!r}, purejaxql's QNetwork is an MLP")
    if mine.iterations != iterations(config):
        wrong.append(f"iterations: fragc {mine.iterations}, purejaxql NUM_UPDATES {iterations(config)}")
    if wrong:
        raise SystemExit("fragc's pqn.Config disagrees with purejaxql's pqn_cartpole config:\n  " + "\n  ".join(wrong))
    return mine


def make_side(side: str, config: dict) -> side_by_side.Side:
    """The side's (compile(), run(seed))."""
    import jax

    if side == NAME:
        train = jax.jit(jax.vmap(references.load(NAME, "pqn_gymnax").make_train(dict(config))))  # single_run's form
        return side_by_side.jitted_side(train, lambda seed: jax.random.split(jax.random.PRNGKey(seed),
                                                                             config["NUM_SEEDS"]))
    import fragc
    from fragc.algos import pqn

    return side_by_side.fragc_side(lambda: fragc.compile(pqn.PQN(fragc_config(config)), "single"), iterations(config))


def child(side: str, config: dict) -> None:
    """In a fresh process: compile (and a first run), then one timed run."""
    compile_, run = make_side(side, config)
    side_by_side.timed_child(compile_, lambda: run(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("steady", "fresh"), default="steady")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on a core meanwhile")
    parser.add_argument("--total-steps", type=float, default=None,
                        help="TOTAL_TIMESTEPS (and TOTAL_TIMESTEPS_DECAY) of both sides (default: the yaml's 5e5)")
    parser.add_argument("--test-during-training", action="store_true",
                        help="keep purejaxql's TEST_DURING_TRAINING on, and fragc's evaluation with it (docstring)")
    parser.add_argument("--cache", default=None, help="fresh mode: a compilation cache folder (default: cold)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    revision = references.require(NAME)
    config = reference_config(args.total_steps, args.test_during_training)
    fragc_config(config)  # the configs agree, or stop before anything is timed
    if args.child:
        child(args.child, config)
        return
    extra = ([] if args.total_steps is None else ["--total-steps", repr(args.total_steps)]) + (
        ["--test-during-training"] if args.test_during_training else [])
    with side_by_side.spinning(args.busy):
        if args.mode == "steady":
            raw = side_by_side.steady({side: make_side(side, config) for side in SIDES}, args.repeats)
        else:
            raw = side_by_side.fresh(__file__, SIDES, args.repeats, args.cache, extra)
    processor = references.processor()
    side_by_side.summary(
        raw, args.mode, NAME, "purejaxql",
        f"purejaxql pqn_gymnax.py @ {revision['commit'][:12]} against fragc's PQN, {config['ENV_NAME']}, "
        f"{iterations(config)} iterations, test during training {'on' if args.test_during_training else 'off'}, "
        f"{args.mode}, {args.busy} busy, {processor}",
        args.out, f"pqn_reference_{args.mode}_busy{args.busy}", busy=args.busy, processor=processor,
        reference=revision, config=config, test_during_training=args.test_during_training,
        iterations=iterations(config))


if __name__ == "__main__":
    main()
