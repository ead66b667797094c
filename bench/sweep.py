"""Sweeps in one program (issue 24, item 5): what vectorising a PPO CartPole sweep buys, and PBT against the
best fixed configuration of the same grid.

    JAX_NUM_CPU_DEVICES=8 python bench/sweep.py throughput [--repeats 5] [--iterations 32] [--members 64]
    python bench/sweep.py pbt [--seeds 10] [--iterations 200]

`throughput`: a grid of lr (4 values) x ent_coef (2 values) x 8 seeds = 64 members of PPO's CartPole config,
timed alternately (A B C A B C ...) after compiling, each side running the same iterations:
- `one run`: one member's configuration alone (`fragc run ppo`'s program);
- `64 members, 1 device`: `population(single, 8 seeds, lr=..., ent_coef=...)` on one device;
- `64 members, 8 devices`: the same program with its members spread over 8 devices.
Reported: aggregate env steps per second, the gain over 64 sequential single runs (64 x one run's time, as
a for-loop over configurations and seeds would take, compiles not counted) and over one run, and the state's
bytes per member with XLA's temporary bytes per member (`memory_analysis`).

`pbt`: PPO on CartPole with a learning-rate grid whose fixed values are mostly poor for a 1e5-step budget
(1e-4, 3e-4, 1e-3, 3e-3, without annealing): the grid x `--seeds` seeds as fixed configurations, and the same
population with PBT every 10 iterations (lineage from each PBT seed). The final return of every member;
per side the IQM over seeds (fixed: the best configuration's seeds; PBT: all members, each PBT seed's
population once) with rliable's 95% CI.

Results go to `--out` (default bench/results) as sweep_throughput.json / sweep_pbt.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import numpy as np

import fragc
from fragc.algos import ppo

LRS, ENTS = (1e-4, 3e-4, 1e-3, 3e-3), (0.0, 0.01)


def state_bytes(state) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(state) if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))


def throughput(args) -> dict:
    seeds = args.members // (len(LRS) * len(ENTS))
    base = ppo.PPO(ppo.Config(lr=LRS[1], ent_coef=ENTS[1]))
    steps = base.config.steps_per_iteration
    sides = {"one run": fragc.compile(base, "single", iterations_per_dispatch=args.k)}
    grid = fragc.population("single", seeds, lr=list(LRS), ent_coef=list(ENTS))
    sides[f"{args.members} members, 1 device"] = fragc.compile(ppo.PPO(ppo.Config()), grid, devices=1,
                                                               iterations_per_dispatch=args.k)
    if len(jax.devices()) >= 8:
        sides[f"{args.members} members, 8 devices"] = fragc.compile(ppo.PPO(ppo.Config()), grid, devices=8,
                                                                    iterations_per_dispatch=args.k)
    states = {name: prog.init(0) for name, prog in sides.items()}
    for name, prog in sides.items():  # warm up: the first dispatch of each
        states[name] = prog.run(states[name], args.k)[0]
    times = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, prog in sides.items():
            t = time.perf_counter()
            states[name], history = prog.run(states[name], args.iterations)
            jax.block_until_ready(states[name])
            times[name].append(time.perf_counter() - t)
    one = statistics.median(times["one run"])
    rows = []
    for name, prog in sides.items():
        members = len(prog.population) or 1
        t = statistics.median(times[name])
        temp = prog.memory()[prog.executables[0]].get("temp", 0)
        devices = len(jax.tree.leaves(states[name])[0].sharding.device_set)
        rows.append({"side": name, "members": members, "devices": devices, "median_s": t,
                     "env_steps_per_s": members * steps * args.iterations / t,
                     "vs_sequential": (members * one) / t, "vs_one_run": (members * steps * args.iterations / t) /
                     (steps * args.iterations / one), "state_bytes_per_member": state_bytes(states[name]) / members,
                     "temp_bytes_per_member": temp / (members / devices),  # XLA's temp bytes are per device
                     "times": times[name]})
    return {"iterations": args.iterations, "repeats": args.repeats, "k": args.k, "steps_per_iteration": steps,
            "device": jax.devices()[0].device_kind, "rows": rows}


def pbt(args) -> dict:
    from fragc.sinks import stats

    config = ppo.Config(anneal_lr=False, total_steps=args.iterations * 512)
    grid = {"lr": list(LRS)}
    fixed = fragc.compile(ppo.PPO(config), fragc.population("single", args.seeds, **grid), iterations_per_dispatch=10)
    t = time.perf_counter()
    _, history = fixed.run(fixed.init(0), args.iterations)
    fixed_s = time.perf_counter() - t
    final = history["episode_return"][:, -1].reshape(len(LRS) * args.seeds, -1).mean(1)
    per_config = {f"lr={lr:g}": final[i * args.seeds:(i + 1) * args.seeds] for i, lr in enumerate(LRS)}
    estimates = stats.interval_estimates(per_config)
    best = stats.best_configuration(estimates)
    pbt_finals, lrs, pbt_s = [], [], 0.0
    for seed in range(args.seeds):  # one population per PBT seed: members = grid x 1 seed
        prog = fragc.compile(ppo.PPO(config), fragc.population("single", [seed], pbt=fragc.PBT(10, seed=seed), **grid),
                             iterations_per_dispatch=10)
        t = time.perf_counter()
        state, h = prog.run(prog.init(0), args.iterations)
        pbt_s += time.perf_counter() - t
        pbt_finals += h["episode_return"][:, -1].reshape(len(LRS), -1).mean(1).tolist()
        lrs += np.asarray(state.hyper["lr"]).tolist()
    pbt_est = stats.interval_estimates({"pbt": np.asarray(pbt_finals)})["pbt"]
    return {"iterations": args.iterations, "env_steps": args.iterations * 512, "seeds": args.seeds,
            "fixed": {k: {"iqm": v[0], "ci95": v[1:], "final": per_config[k].tolist()} for k, v in estimates.items()},
            "best_fixed": best, "fixed_wall_s": fixed_s,
            "pbt": {"iqm": pbt_est[0], "ci95": pbt_est[1:], "final": pbt_finals, "final_lr": lrs},
            "pbt_wall_s": pbt_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("throughput", "pbt"))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--iterations", type=int, default=None)
    p.add_argument("--members", type=int, default=64)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    if args.iterations is None:
        args.iterations = 32 if args.what == "throughput" else 200
    result = throughput(args) if args.what == "throughput" else pbt(args)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"sweep_{args.what}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    if args.what == "throughput":
        print(f"{'side':26} {'median s':>9} {'env steps/s':>12} {'vs 64 sequential':>17} {'vs one run':>10} "
              f"{'state B/member':>15} {'temp B/member':>14}")
        for r in result["rows"]:
            print(f"{r['side']:26} {r['median_s']:9.3f} {r['env_steps_per_s']:12,.0f} {r['vs_sequential']:17.2f} "
                  f"{r['vs_one_run']:10.2f} {r['state_bytes_per_member']:15,.0f} {r['temp_bytes_per_member']:14,.0f}")
    else:
        for k, v in result["fixed"].items():
            print(f"fixed {k:10} IQM {v['iqm']:7.1f}  95% CI [{v['ci95'][0]:.1f}, {v['ci95'][1]:.1f}]"
                  + ("  (best)" if k == result["best_fixed"] else ""))
        v = result["pbt"]
        print(f"pbt   {'every 10':10} IQM {v['iqm']:7.1f}  95% CI [{v['ci95'][0]:.1f}, {v['ci95'][1]:.1f}]")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
