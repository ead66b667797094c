"""Trials per hour of `fragc tune` (issue 46, item 4): Optuna's trials run in batches as one population program,
against the same trials run one by one, each a `fragc.train` single run of its own compiled program (what a tuner
that calls `fragc run` per trial does).

    python bench/tune.py [--trials 16] [--batch 8] [--iterations 40] [--out bench/results]

PPO on CartPole-v1 (its default config, with `--iterations` iterations a trial), its default search space, a
random sampler (seed 0), no pruning, one seed a trial. The population side runs `fragc.tune.tune`; the one-by-one
side compiles and trains each of the same trials' configurations, in the same order. Both sides are timed from
start to end, compiles included (the one-by-one side compiles once per trial: a trial's values are constants of
its program), and without compiles (the program's compile and its init's: `fragc.compile` and the first
`init`). Each trial's score on both sides is in the JSON: a vectorised member equals
its single run to the last bits, which RL's training can grow into another trajectory (docs/tuning.md).

Results go to `--out` (default bench/results) as tune.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import fragc
from fragc.algos import ppo
from fragc.tune import TrialPopulation, default_space, open_study, trial_score, tune


def population_side(args, space) -> tuple[dict, list]:
    start = time.perf_counter()
    pop = TrialPopulation(ppo.PPO(ppo.Config()), space, slots=args.batch, seeds=[0], devices=None,
                          iterations_per_dispatch=args.k)
    pop.start({})  # its members' init, compiled (as the other side's init is)
    compiled = time.perf_counter() - start
    study = open_study(None, "random", "none", seed=0)
    tune(pop, study, space, args.trials, args.iterations)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "compile_s": compiled, "members": pop.count}, study.trials


def one_by_one_side(args, trials) -> tuple[dict, list[float]]:
    wall, compiles, scores = time.perf_counter(), 0.0, []
    for trial in trials:
        start = time.perf_counter()
        prog = fragc.compile(ppo.PPO(ppo.Config(**trial.params)), "single", iterations_per_dispatch=args.k)
        state = prog.init(0)  # its first call compiles the init
        compiles += time.perf_counter() - start
        history = fragc.train(prog, state, args.iterations).history["episode_return"]
        scores.append(trial_score(np.asarray(history, np.float64).reshape(1, args.iterations, -1).mean(axis=2)))
    return {"wall_s": time.perf_counter() - wall, "compile_s": compiles}, scores


def per_hour(trials: int, seconds: float) -> float:
    return trials * 3600.0 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--k", type=int, default=8, help="iterations per dispatch")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    space = default_space("ppo", ppo.PPO(ppo.Config()))
    together, trials = population_side(args, space)
    alone, scores = one_by_one_side(args, trials)
    rows = {}
    for name, side in (("population", together), ("one by one", alone)):
        rows[name] = {**side, "trials_per_hour": per_hour(args.trials, side["wall_s"]),
                      "trials_per_hour_without_compiles": per_hour(args.trials, side["wall_s"] - side["compile_s"])}
        print(f"{name:>11}: {args.trials} trials in {side['wall_s']:.1f} s ({side['compile_s']:.1f} s compiling): "
              f"{rows[name]['trials_per_hour']:,.0f} trials/hour, "
              f"{rows[name]['trials_per_hour_without_compiles']:,.0f} without compiles")
    ratio = rows["population"]["trials_per_hour"] / rows["one by one"]["trials_per_hour"]
    print(f"ratio: {ratio:.2f}x the trials per hour ({args.batch} trials a batch, {args.iterations} iterations each)")
    result = {"trials": args.trials, "batch": args.batch, "iterations": args.iterations, "k": args.k,
              "sides": rows, "ratio": ratio,
              "scores": [{"trial": t.number, "config": t.params, "population": t.value, "one_by_one": s}
                         for t, s in zip(trials, scores)]}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tune.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
