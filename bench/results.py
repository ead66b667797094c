"""Full-length learning runs of every algorithm over several seeds, for docs/results.md.

    python bench/results.py [--seeds 0-9] [--only ppo,a2c] [--out bench/results]
    python bench/results.py --seeds 0 --only ppo_breakout_minatar,ppo_spaceinvaders_minatar,...

Per run: the final return (mean over environments of each one's last
completed episode, at the end of training). Per algorithm: every seed's
final return, how many reach the algorithm's threshold, the interquartile
mean (IQM) over seeds and its 95% percentile-bootstrap confidence interval
(the rliable convention: Agarwal et al. 2021, 2,000 resamples of the seeds).

The MinAtar runs are PPO with PureJaxRL's MinAtar configuration (1e7 steps
each), a bench with no threshold, run only when named with `--only`.

Algorithms whose policy is `single` run all seeds at once as one
`population(single, seeds)` program (member i starts from seed i, the same
run as `--seed i` alone); the others run seed by seed.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

RUNS = [  # (name, algorithm, policy, devices, threshold on the final return, config overrides)
    ("ppo", "ppo", "single", 1, 475.0, {}),
    ("a2c", "a2c", "single", 1, 400.0, {}),
    ("dqn", "dqn", "single", 1, 400.0, {}),
    ("impala", "impala", "actor_learner_async", 2, 400.0, {}),  # one actor device, one learner device
    ("ppo_continuous", "ppo_continuous", "single", 1, -200.0, {}),
]
MINATAR = {  # PureJaxRL's MinAtar PPO configuration (examples/brax_minatar.ipynb)
    "num_envs": 64, "num_steps": 128, "total_steps": 10_000_000, "lr": 5e-3, "update_epochs": 4,
    "num_minibatches": 8, "activation": "relu",
}
RUNS += [(f"ppo_{game.lower()}_minatar", "ppo", "single", 1, None, {"env": f"{game}-MinAtar", **MINATAR})
         for game in ("Breakout", "SpaceInvaders", "Asterix", "Freeway")]
"""MinAtar rows have no threshold (a bench, not a check): run them with `--only ppo_breakout_minatar,...`."""
DEFAULT = ("ppo", "a2c", "dqn", "impala", "ppo_continuous")


def seed_list(text: str) -> list[int]:
    """'0-9' or '0,3,5' -> the seeds."""
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def iqm(x: np.ndarray) -> float:
    """Mean of the middle 50% (rliable's interquartile mean: trim 25% each side)."""
    x = np.sort(np.asarray(x, np.float64))
    n = len(x)
    cut = int(np.floor(0.25 * n))
    return float(x[cut: n - cut].mean()) if n - 2 * cut > 0 else float(x.mean())


def bootstrap_ci(x: np.ndarray, stat=iqm, resamples: int = 2000, level: float = 0.95, seed: int = 0) -> tuple:
    """Percentile bootstrap confidence interval of `stat` over runs."""
    rng = np.random.default_rng(seed)
    x = np.asarray(x, np.float64)
    stats = [stat(x[rng.integers(0, len(x), len(x))]) for _ in range(resamples)]
    return float(np.quantile(stats, (1 - level) / 2)), float(np.quantile(stats, (1 + level) / 2))


def final_returns(name: str, policy: str, devices: int, overrides: dict, seeds: list[int]) -> list[float]:
    import fragc
    from fragc import algos

    algo = algos.make(name, **overrides)
    iterations = algo.config.iterations
    if policy == "single" and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        prog = fragc.compile(algo, fragc.population("single", len(seeds)), devices=1, iterations_per_dispatch=32)
        _, history = prog.run(prog.init(seeds[0]), iterations)
        return [float(r) for r in history["episode_return"][:, -1]]  # [seeds, iterations]
    out = []
    prog = fragc.compile(algo, policy, devices=devices, iterations_per_dispatch=32)
    for seed in seeds:
        _, history = prog.run(prog.init(seed), iterations)
        out.append(float(history["episode_return"][-1]))
    return out


def algos_steps(name: str, overrides: dict) -> int:
    """Environment steps of one run (compile included in the rate: a wall-clock figure, not a throughput bench)."""
    from fragc import algos

    config = algos.load(name)[1](**overrides)
    return config.iterations * config.steps_per_iteration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0", help="'0-9' or '0,1,2'")
    parser.add_argument("--only", default="", help="comma-separated run names (default: the five algorithms)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    seeds = seed_list(args.seeds)
    only = set(filter(None, args.only.split(",")))
    rows = []
    for name, algo, policy, devices, threshold, overrides in RUNS:
        if name not in (only or DEFAULT):
            continue
        start = time.perf_counter()
        returns = final_returns(algo, policy, devices, overrides, seeds)
        wall = time.perf_counter() - start
        lo, hi = bootstrap_ci(returns)
        reached = None if threshold is None else int(sum(r >= threshold for r in returns))
        row = {"run": name, "algo": algo, "policy": policy, "config": overrides, "seeds": seeds,
               "threshold": threshold, "final_returns": [round(r, 1) for r in returns], "at_threshold": reached,
               "iqm": round(iqm(returns), 1), "iqm_ci95": [round(lo, 1), round(hi, 1)], "wall_s": round(wall, 1),
               "env_steps_per_s": round(len(seeds) * algos_steps(algo, overrides) / wall)}
        rows.append(row)
        check = "" if threshold is None else f"{reached}/{len(seeds)} >= {threshold:g}  "
        print(f"{name:22} {policy:20} {check}IQM {row['iqm']:.1f} [{lo:.1f}, {hi:.1f}]  {wall:.0f} s  "
              f"returns {row['final_returns']}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
