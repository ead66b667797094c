"""Full-length learning runs of every algorithm over several seeds, for docs/results.md.

    python bench/results.py [--seeds 0-9] [--only ppo,a2c] [--out bench/results] [--steps N]
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


class Progress:
    """`Program.run` callback: prints each seed's latest return every `every` environment steps, and keeps them
    (`rows`: one per report; a run of several seeds one after another reports each seed in turn)."""

    def __init__(self, label: str, steps_per_iteration: int, every: int = 1_000_000):
        self.label, self.steps_per_iteration, self.every = label, steps_per_iteration, every
        self.rows: list[dict] = []
        self.next_report = every

    def __call__(self, done: int, metrics: dict) -> None:
        steps = done * self.steps_per_iteration
        if self.rows and steps < self.rows[-1]["steps"]:  # the next seed's run has started
            self.next_report = self.every
        if steps >= self.next_report:
            returns = [round(float(r), 1) for r in np.atleast_1d(np.asarray(metrics["episode_return"])[..., -1])]
            self.rows.append({"steps": steps, "returns": returns})
            self.next_report = (steps // self.every + 1) * self.every
            print(f"  {self.label} after {steps:,} steps: returns {returns}", flush=True)


def run_length(algo, max_steps: int | None) -> int:
    """Iterations to run: the configured run's, or only its first `max_steps` environment steps (the
    learning-rate schedule stays that of the whole configured run)."""
    iterations = algo.config.iterations
    return iterations if max_steps is None else min(iterations, max(1, max_steps // algo.steps_per_iteration))


def final_returns(algo, policy: str, devices: int, seeds: list[int], iterations: int,
                  progress: Progress) -> list[float]:
    import fragc

    if policy == "single" and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        prog = fragc.compile(algo, fragc.population("single", len(seeds)), devices=1, iterations_per_dispatch=32)
        _, history = prog.run(prog.init(seeds[0]), iterations, callback=progress)
        return [float(r) for r in history["episode_return"][:, -1]]  # [seeds, iterations]
    out = []
    prog = fragc.compile(algo, policy, devices=devices, iterations_per_dispatch=32)
    for seed in seeds:
        _, history = prog.run(prog.init(seed), iterations, callback=progress)
        out.append(float(history["episode_return"][-1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0", help="'0-9' or '0,1,2'")
    parser.add_argument("--only", default="", help="comma-separated run names (default: the five algorithms)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--steps", type=int, default=None,
                        help="stop each run after its first STEPS environment steps (a partial run: the learning-rate "
                             "schedule stays the configured run's); default: the whole run")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    from fragc import algos

    seeds = seed_list(args.seeds)
    only = set(filter(None, args.only.split(",")))
    rows = []
    for name, algo, policy, devices, threshold, overrides in RUNS:
        if name not in (only or DEFAULT):
            continue
        algorithm = algos.make(algo, **overrides)
        iterations = run_length(algorithm, args.steps)
        steps = iterations * algorithm.steps_per_iteration
        configured_steps = algorithm.config.iterations * algorithm.steps_per_iteration
        progress = Progress(name, algorithm.steps_per_iteration)
        start = time.perf_counter()
        returns = final_returns(algorithm, policy, devices, seeds, iterations, progress)
        wall = time.perf_counter() - start
        lo, hi = bootstrap_ci(returns)
        reached = None if threshold is None else int(sum(r >= threshold for r in returns))
        row = {"run": name, "algo": algo, "policy": policy, "config": overrides, "seeds": seeds,
               "threshold": threshold, "final_returns": [round(r, 1) for r in returns], "at_threshold": reached,
               "iqm": round(iqm(returns), 1), "iqm_ci95": [round(lo, 1), round(hi, 1)], "wall_s": round(wall, 1),
               "env_steps": steps, "configured_env_steps": configured_steps,
               "env_steps_per_s": round(len(seeds) * steps / wall),  # compile included: wall clock, not a bench
               "returns_by_steps": progress.rows}
        rows.append(row)
        check = "" if threshold is None else f"{reached}/{len(seeds)} >= {threshold:g}  "
        partial = "" if steps == configured_steps else f"PARTIAL: {steps:,} of {configured_steps:,} steps  "
        print(f"{name:22} {policy:20} {partial}{check}IQM {row['iqm']:.1f} [{lo:.1f}, {hi:.1f}]  {wall:.0f} s  "
              f"returns {row['final_returns']}", flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:  # after each run: a stopped job keeps them
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
