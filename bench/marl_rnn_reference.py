"""fragc's recurrent IPPO and MAPPO (`ippo_rnn`, `mappo_rnn`) against JaxMARL's own `ippo_rnn_mpe.py` and
`mappo_rnn_mpe.py` on MPE_simple_spread_v3: a learning check, the same budget and seeds on each side.

The references are JaxMARL's files themselves, built at a pinned revision by `python bench/references/build.py`
into bench/references/build/jaxmarl/ (no patches). Without them this bench says so and stops: it never
substitutes a rewrite.

For each algorithm and seed, three sides train, alternating (J F T J F T ...):
- `jaxmarl`: the script's own `make_train(config)`, jitted, on `jax.random.PRNGKey(seed)`. `config` is its yaml
  (`ippo_rnn_mpe.yaml`, `mappo_homogenous_rnn_mpe.yaml`) as its hydra `main` passes it (`OmegaConf.to_container`:
  the keys are already the upper-case ones `make_train` reads), with TOTAL_TIMESTEPS from `--total-steps`, one
  seed per run. The scripts return only their runner state: the returns are what their per-update
  `io_callback` hands `wandb.log` (its "returns", averaged as JaxMARL logs it: ippo_rnn_mpe.py the mean of agent
  0's episodes that ended in the rollout, mappo_rnn_mpe.py the mean over actors of the last episode at the
  rollout's last step). `wandb.init(mode="disabled")` (the yamls' WANDB_MODE) comes first, and this bench records
  each call of `wandb.log` on its way. JaxMARL's MPELogWrapper logs rewards times the agent count (3 on simple
  spread, "as per on-policy codebase"): its returns are divided by the agent count here, to fragc's scale.
- `fragc`: `fragc.compile(ippo_rnn.IPPORNN(ippo_rnn.Config(total_steps=...)), "single")` (mappo_rnn.MAPPORNN for
  MAPPO), what `fragc run ippo_rnn` builds, run for config.iterations from `prog.init(seed)`; the returns are the
  history's per-iteration `episode_return` (the agents' mean of each one's last episode). fragc's config
  defaults are JaxMARL's yaml: `fragc_config` checks them field by field against the yaml actually read, and
  raises naming every difference.
- `fragc_jaxmarl_truncation`: fragc with JaxMARL's truncation rule (`bootstrap_truncation=False`: its learner
  hands ppo_rnn.update `traj.replace(terminated=traj.done)`), so every episode end is terminal and nothing is
  bootstrapped. MPE's episodes all end at its 25-step time limit, where fragc's own rule
  bootstraps from the value of the state reached.

Known differences with the same hyperparameters: JaxMARL's MAPPO keeps the actor and the critic in two
optimizers, each clipping its own gradient norm (fragc: one network, one optimizer, one clip); JaxMARL's
minibatches are a shuffle of its actors' sequences (environment x agent), fragc's whole environments' sequences
with all their agents; JaxMARL anneals the learning rate once per update, fragc's optax schedule every minibatch
step; the random streams differ (JaxMARL splits one key per step, fragc carries a key per environment). The
yamls' ACTIVATION ("tanh") is not read by these scripts (their networks are relu), nor by fragc's.

Each run reports its final return (the mean over the last tenth of updates) and wall time; the first run of each
side comes after that side's compilation (timed apart). The result names the processor, the load and the
reference's revision; JSON goes to `--out`.

    python bench/marl_rnn_reference.py                                     # 2e6 steps x seeds 0 1 2
    python bench/marl_rnn_reference.py --total-steps 5e5 --seeds 3         # docs/marl.md's figures
    python bench/marl_rnn_reference.py --total-steps 2e5 --seeds 1         # a quick check
    python bench/marl_rnn_reference.py --total-steps 2e5 --speed 5         # speed: A B A B in one process
"""

from __future__ import annotations

import dataclasses
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import references_built as references  # noqa: E402
import side_by_side  # noqa: E402

from fragc.runtime import cpu_lowering  # noqa: E402,F401  (before any jit: its jit-cache state, src/fragc/runtime/cpu_lowering.py)

NAME = "jaxmarl"
SIDES = ("jaxmarl", "fragc", "fragc_jaxmarl_truncation")
ALGOS = {  # fragc's algorithm -> (JaxMARL's script, its yaml)
    "ippo_rnn": ("ippo_rnn_mpe", "ippo_rnn_mpe.yaml"),
    "mappo_rnn": ("mappo_rnn_mpe", "mappo_homogenous_rnn_mpe.yaml"),
}
DEFAULT_TOTAL_STEPS = 2e6
FINAL_FRACTION = 10
"""The final return is the mean over the last 1/FINAL_FRACTION of the updates."""


# ---------------------------------------------------------------- configurations


def reference_config(algo: str, total_steps: float) -> dict:
    """The config JaxMARL's hydra `main` passes to `make_train`: `OmegaConf.to_container` of the script's yaml, with
    TOTAL_TIMESTEPS = `total_steps` (one seed a run: NUM_SEEDS, where the yaml has it, is not make_train's)."""
    from omegaconf import OmegaConf

    path = os.path.join(references.folder(NAME), "config", ALGOS[algo][1])
    config = OmegaConf.to_container(OmegaConf.load(path))
    config["TOTAL_TIMESTEPS"] = total_steps
    config.pop("NUM_SEEDS", None)
    return config


iterations = references.jaxmarl_updates  # JaxMARL's NUM_UPDATES


def fragc_algo(algo: str) -> tuple[Any, type]:
    """(fragc's config class, its algorithm class)."""
    from fragc.algos import ippo_rnn, mappo_rnn

    return {"ippo_rnn": (ippo_rnn.Config, ippo_rnn.IPPORNN), "mappo_rnn": (mappo_rnn.Config, mappo_rnn.MAPPORNN)}[algo]


def fragc_config(algo: str, config: dict):
    """fragc's config for JaxMARL's: fragc's defaults (meant to be JaxMARL's yaml), checked field by field against
    the yaml read here; only total_steps is set. Raises naming every field that differs."""
    config_class, _ = fragc_algo(algo)
    mine = config_class(total_steps=int(config["TOTAL_TIMESTEPS"]))
    # what JaxMARL's scripts fix in code rather than in the yaml: the clipped value loss, a constant ratio clip
    fixed = {"clip_value": True, "anneal_clip": False}
    wrong = references.jaxmarl_differences(mine, config, {**references.JAXMARL_PPO_FIELDS,
                                                          "hidden": ("FC_DIM_SIZE", int)}, fixed)
    if mine.hidden != int(config["GRU_HIDDEN_DIM"]):
        wrong.append(f"hidden: fragc {mine.hidden!r}, JaxMARL GRU_HIDDEN_DIM={config['GRU_HIDDEN_DIM']!r}")
    if config["SCALE_CLIP_EPS"]:
        wrong.append("SCALE_CLIP_EPS: JaxMARL divides CLIP_EPS by the agent count, fragc does not")
    if wrong:
        raise SystemExit(f"fragc's {algo} Config disagrees with JaxMARL's {ALGOS[algo][1]}:\n  " + "\n  ".join(wrong))
    return mine


# ---------------------------------------------------------------- the sides

Side = tuple[Callable[[], None], Callable[[int], list[float]]]
"""(compile(), run(seed) -> the mean episode return of each update, on fragc's scale)."""


class WandbLog:
    """Records what JaxMARL's io_callback hands `wandb.log` (after `wandb.init(mode="disabled")`), and passes it on."""

    def __init__(self) -> None:
        import wandb

        wandb.init(mode="disabled")
        self.rows: list[dict] = []
        self.forward = wandb.log
        wandb.log = self

    def __call__(self, row: dict, *args, **kwargs) -> None:
        self.rows.append({"env_step": int(row["env_step"]), "returns": float(row["returns"])})
        self.forward(row, *args, **kwargs)

    def take(self) -> list[dict]:
        rows, self.rows = sorted(self.rows, key=lambda r: r["env_step"]), []
        return rows


def jaxmarl_side(algo: str, config: dict, log: WandbLog) -> Side:
    import jax

    module = references.load(NAME, ALGOS[algo][0])
    train = jax.jit(module.make_train(dict(config)))  # make_train writes NUM_ACTORS, NUM_UPDATES... into its dict
    agents = module.jaxmarl.make(config["ENV_NAME"], **config.get("ENV_KWARGS", {})).num_agents
    updates = iterations(config)
    holder = {}

    def compile_() -> None:
        holder["train"] = train.lower(jax.random.PRNGKey(0)).compile()

    def run(seed: int) -> list[float]:
        log.take()
        jax.block_until_ready(holder["train"](jax.random.PRNGKey(seed)))
        rows = log.take()
        if len(rows) != updates:
            raise SystemExit(f"{ALGOS[algo][0]}: wandb.log was called {len(rows)} times, for {updates} updates")
        return [r["returns"] / agents for r in rows]  # MPELogWrapper's rewards times the agent count

    return compile_, run


def fragc_side(algo: str, config: dict, truncation: bool) -> Side:
    import jax

    import fragc

    _, algo_class = fragc_algo(algo)
    mine = dataclasses.replace(fragc_config(algo, config), bootstrap_truncation=not truncation)
    holder = {}

    def compile_() -> None:  # compiled on first use: one iteration
        holder["prog"] = prog = fragc.compile(algo_class(mine), "single")
        jax.block_until_ready(prog.run(prog.init(0), 1)[0])

    def run(seed: int) -> list[float]:
        prog = holder["prog"]
        state, history = prog.run(prog.init(seed), mine.iterations)
        jax.block_until_ready(state)
        return [float(x) for x in history["episode_return"]]

    return compile_, run


def make_side(side: str, algo: str, config: dict, log: WandbLog) -> Side:
    if side == "jaxmarl":
        return jaxmarl_side(algo, config, log)
    return fragc_side(algo, config, truncation=side == "fragc_jaxmarl_truncation")


# ---------------------------------------------------------------- running and reporting


def final_return(returns: list[float]) -> float:
    """The mean over the last tenth of the updates."""
    tail = max(1, len(returns) // FINAL_FRACTION)
    return statistics.fmean(returns[-tail:])


def model_name() -> str:
    """lscpu's model name."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                "unknown")


def train_algo(algo: str, config: dict, seeds: list[int], log: WandbLog, chosen: tuple[str, ...] = SIDES) -> dict:
    """Every side compiled, then J F T per seed; -> side -> {"compile_s", "runs": [{seed, final_return, wall_s,
    load, returns}]}."""
    sides = {side: make_side(side, algo, config, log) for side in chosen}
    out: dict[str, dict] = {side: {"runs": []} for side in chosen}
    for side, (compile_, _) in sides.items():
        start = time.perf_counter()
        compile_()
        out[side]["compile_s"] = time.perf_counter() - start
        print(f"{algo} {side}: compiled in {out[side]['compile_s']:.1f} s", flush=True)
    for seed in seeds:
        for side, (_, run) in sides.items():
            start = time.perf_counter()
            returns = run(seed)
            wall = time.perf_counter() - start
            load = os.getloadavg()[0]
            final = final_return(returns)
            out[side]["runs"].append({"seed": seed, "final_return": final, "wall_s": wall, "load": load,
                                      "returns": returns})
            print(f"{algo} seed {seed} {side:25} final return {final:8.2f}  wall {wall:6.1f} s  load {load:.1f}",
                  flush=True)
    for side in chosen:
        finals = [r["final_return"] for r in out[side]["runs"]]
        out[side].update(mean=statistics.fmean(finals), min=min(finals), max=max(finals))
    return out


def speed(algo: str, config: dict, log: WandbLog, repeats: int, processor: str, revision: dict, out: str,
          total_steps: float) -> dict:
    """JaxMARL's script against fragc (its own truncation rule), steady: one process, A B A B; -> the summary."""
    sides = {"jaxmarl": jaxmarl_side(algo, config, log), "fragc": fragc_side(algo, config, truncation=False)}
    raw = side_by_side.steady(sides, repeats)
    title = (f"JaxMARL {ALGOS[algo][0]} @ {revision['commit'][:12]} against fragc's {algo}, {total_steps:g} steps "
             f"({iterations(config)} updates), steady, {processor}")
    return side_by_side.summary(raw, "steady", "jaxmarl", "JaxMARL", title, out,
                                f"marl_rnn_speed_{algo}_{steps_name(total_steps)}", processor=processor,
                                reference=revision, total_steps=total_steps)


def table(results: dict) -> str:
    lines = ["| algorithm | side | final return per seed | mean [min, max] | wall s per run |",
             "| --- | --- | --- | --- | --- |"]
    for algo, sides in results.items():
        for side, r in sides.items():
            seeds = ", ".join(f"{x['final_return']:.2f}" for x in r["runs"])
            walls = ", ".join(f"{x['wall_s']:.0f}" for x in r["runs"])
            lines.append(f"| {algo} | {side} | {seeds} | {r['mean']:.2f} [{r['min']:.2f}, {r['max']:.2f}] | "
                         f"{walls} |")
    return "\n".join(lines)


def steps_name(total_steps: float) -> str:
    """2e6 -> "2e6"."""
    mantissa, exponent = f"{total_steps:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total-steps", type=float, default=DEFAULT_TOTAL_STEPS,
                        help="TOTAL_TIMESTEPS of every run (default 2e6; the yamls' is 1e7)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 (default 3)")
    parser.add_argument("--algos", default=",".join(ALGOS), help="comma-separated: ippo_rnn,mappo_rnn")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--speed", type=int, default=0, metavar="REPEATS",
                        help="time JaxMARL's script against fragc instead (bench/side_by_side.py's steady mode: one "
                             "process, A B A B, REPEATS rounds of one seed's run each; fragc with its own truncation)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    sides = tuple(s.strip() for s in args.sides.split(",") if s.strip())
    if not sides or set(sides) - set(SIDES):
        raise SystemExit(f"--sides: choose from {', '.join(SIDES)}")
    revision = references.require(NAME)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = [a for a in algos if a not in ALGOS]
    if unknown:
        raise SystemExit(f"--algos: unknown {', '.join(unknown)} (choose from {', '.join(ALGOS)})")
    configs = {algo: reference_config(algo, args.total_steps) for algo in algos}
    for algo, config in configs.items():
        fragc_config(algo, config)  # the configs agree, or stop before anything trains
    seeds = list(range(args.seeds))
    log = WandbLog()
    processor = references.processor()  # the model name, the cores this process may use, JAX's version
    if model_name() not in processor:
        processor = f"{model_name()}; {processor}"
    if args.speed:
        for algo in algos:
            speed(algo, configs[algo], log, args.speed, processor, revision, args.out, args.total_steps)
        return
    loads_before = os.getloadavg()
    started = time.perf_counter()
    results = {algo: train_algo(algo, configs[algo], seeds, log, sides) for algo in algos}
    result = {"total_steps": args.total_steps, "seeds": seeds, "processor": processor,
              "load_before": loads_before, "load_after": os.getloadavg(),
              "elapsed_s": time.perf_counter() - started, "reference": revision,
              "configs": configs, "iterations": {a: iterations(c) for a, c in configs.items()},
              "final_return": f"mean of the last 1/{FINAL_FRACTION} of the updates' mean episode return, per agent "
                              "(JaxMARL's logged returns divided by the agent count)",
              "results": results}
    loads = [r["load"] for sides in results.values() for s in sides.values() for r in s["runs"]]
    print(f"\nJaxMARL @ {revision['commit'][:12]} against fragc, MPE_simple_spread_v3, {args.total_steps:g} steps "
          f"({', '.join(f'{a} {iterations(c)} updates' for a, c in configs.items())}), seeds {seeds}, "
          f"{processor}, load {min(loads):.1f}-{max(loads):.1f}")
    print(table(results))
    os.makedirs(args.out, exist_ok=True)
    picked = ("" if tuple(algos) == tuple(ALGOS) else "_" + "_".join(algos)) + ("" if sides == SIDES else "_" + "_".join(sides))
    path = os.path.join(args.out, f"marl_rnn_reference_{steps_name(args.total_steps)}_seeds{args.seeds}{picked}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
