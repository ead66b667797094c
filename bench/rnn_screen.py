"""A screen of ppo_rnn configurations on masked CartPole, and the ten-seed run of the one it picks (issue 23).

    python bench/rnn_screen.py --out DIR [--sweep-timeout S]

The base is bench/results.py's `ppo_rnn_masked_cartpole_zoo_norm_critic_gru` (RL Baselines3 Zoo's RecurrentPPO
values for CartPoleNoVel-v1 and its 1e5-step budget, with observation normalization, an unclipped value and the
critic's own GRU): 7/10 seeds at 475. Each screen is one `fragc sweep` (a grid x seeds as one program) on seeds
20-29, disjoint from the ten (0-9) and from the earlier screens (10-14):

- `base`: learning rate {1e-3, 5e-4, 3e-4} x PPO clip {0.2, 0.1} x gamma {0.98, 0.99} (12 configurations);
- `epochs10`: 10 epochs per rollout in place of 20, learning rate {1e-3, 5e-4} x clip {0.2, 0.1};
- `envs16`: 16 environments in 2 minibatches (the zoo's 256-transition minibatch, twice the rollout), the same
  learning rates and clips.
- `big5e5`, added after the first three had run (their pick scored 3/10 on seeds 0-9): PureJaxRL's 5e5-step
  budget with a larger rollout, 32 environments in 2 minibatches of 16 sequences, 10 epochs, learning rate
  {1e-3, 5e-4, 2.5e-4} x gamma {0.98, 0.99}. Run alone (`--only big5e5`), the same rule picks among its six.

The rule, fixed with this file before any screen ran: the configuration with the most seeds whose final return
reaches 475, ties broken by the higher IQM, is run once more on seeds 0-9 (`final`). A screen that fails or runs
past `--sweep-timeout` is left out of the choice. A sweep's members.jsonl has a line per member and iteration, so
every final return here is the last iteration's, bench/results.py's statistic, with the last 16 iterations' mean
beside it. Each sweep's members.jsonl (and summary.json, where rliable imports)
stays under DIR; DIR/screen.json holds every configuration's seeds at 475 and IQM, the pick and the ten-seed
result. What the screens gave on an H200: docs/results.md, "Screens on a GPU".

IQM here is the 25%-trimmed mean (rliable's `aggregate_iqm`), computed with numpy so that the screen does not
need rliable where it runs; a sweep's own summary (rliable, with CIs) is kept when rliable is there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

BASE = ["--mask-velocity", "true", "--num-envs", "8", "--num-steps", "32", "--total-steps", "100000",
        "--update-epochs", "20", "--num-minibatches", "1", "--gamma", "0.98", "--gae-lambda", "0.8",
        "--ent-coef", "0", "--normalize-obs", "true", "--clip-value", "false", "--critic-gru", "true"]
"""bench/results.py's ZOO_CRITIC_GRU as `fragc sweep ppo_rnn` options (the lr is set by each screen)."""
SCREEN_SEEDS, TEN_SEEDS, THRESHOLD = "20-29", "0-9", 475.0
SCREENS = {
    "base": ["--lr", "1e-3,5e-4,3e-4", "--clip-eps", "0.2,0.1", "--gamma", "0.98,0.99"],
    "epochs10": ["--update-epochs", "10", "--lr", "1e-3,5e-4", "--clip-eps", "0.2,0.1"],
    "envs16": ["--num-envs", "16", "--num-minibatches", "2", "--lr", "1e-3,5e-4", "--clip-eps", "0.2,0.1"],
    "big5e5": ["--num-envs", "32", "--num-minibatches", "2", "--update-epochs", "10", "--total-steps", "500000",
               "--lr", "1e-3,5e-4,2.5e-4", "--gamma", "0.98,0.99"],
}


def sweep(name: str, options: list[str], seeds: str, out: str, timeout: float, extra: list[str]) -> list[dict]:
    """Run one `fragc sweep ppo_rnn` (later options override BASE's); each configuration's final returns.
    `-P`: the installed fragc, not the checkout's fragc/ folder, which shadows it from the repository's root."""
    path = os.path.join(out, name)
    argv = [sys.executable, "-P", "-c", "import sys; from fragc.cli import main; sys.exit(main())", "sweep", "ppo_rnn",
            *BASE, *options, "--seeds", seeds, "--threshold", str(THRESHOLD), "--out", path, "--no-plot", *extra]
    start = time.perf_counter()
    try:
        rc = subprocess.run(argv, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"{name}: past {timeout} s, left out", flush=True)
        return []
    wall = time.perf_counter() - start
    configs = finals(os.path.join(path, "members.jsonl"))
    print(f"{name}: exit {rc}, {wall:.0f} s, {len(configs)} configuration(s)", flush=True)
    for c in configs:
        c.update(screen=name, options=options, wall_s=round(wall, 1))
    return configs


def finals(members_jsonl: str) -> list[dict]:
    """Per configuration (in member order): its seeds' final returns (the last iteration's), seeds at 475, IQM."""
    if not os.path.exists(members_jsonl):
        return []
    rows = [json.loads(line) for line in open(members_jsonl, encoding="utf-8") if line.strip()]
    iterations = sorted({r["iteration"] for r in rows})
    last = iterations[-1]
    tail = {r["member"]: [] for r in rows}  # the last 16 iterations' values, where each line is one iteration
    for r in rows:
        if r["iteration"] > last - 16:
            tail[r["member"]].append(r["episode_return"])
    by_config: dict[str, dict] = {}
    for r in sorted((r for r in rows if r["iteration"] == last), key=lambda r: r["member"]):
        c = by_config.setdefault(json.dumps(r["config"], sort_keys=True), {"config": r["config"], "seeds": [],
                                                                            "final": []})
        c["seeds"].append(r["seed"])
        c["final"].append(round(float(r["episode_return"]), 1))
        c.setdefault("last16_mean", []).append(round(float(np.mean(tail[r["member"]])), 1))
    for c in by_config.values():
        c["iterations"] = last
        c["at_threshold"] = int(np.sum(np.asarray(c["final"]) >= THRESHOLD))
        c["iqm"] = round(iqm(c["final"]), 1)
    return list(by_config.values())


def iqm(scores: list[float]) -> float:
    """The interquartile mean: the mean of the middle half (rliable's aggregate_iqm, scipy's trim_mean(x, 0.25))."""
    x = np.sort(np.asarray(scores, dtype=float))
    cut = int(0.25 * len(x))
    return float(np.mean(x[cut:len(x) - cut]))


def pick(configs: list[dict]) -> dict:
    """The rule: most seeds at the threshold, then the higher IQM (the first of equals)."""
    return max(configs, key=lambda c: (c["at_threshold"], c["iqm"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sweep-timeout", type=float, default=900.0, help="seconds per screen (default 900)")
    parser.add_argument("--only", default=",".join(SCREENS), help="screens to run (default all)")
    parser.add_argument("--iterations", type=int, default=None, help="iterations per sweep (a smoke test; default "
                        "the 1e5-step budget)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    result: dict = {"screen_seeds": SCREEN_SEEDS, "threshold": THRESHOLD, "screens": []}
    def save() -> None:  # after each sweep: a cut run keeps what it measured
        with open(os.path.join(args.out, "screen.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)

    extra = ["--iterations", str(args.iterations)] if args.iterations else []
    for name in args.only.split(","):
        result["screens"] += sweep(name, SCREENS[name], SCREEN_SEEDS, args.out, args.sweep_timeout, extra)
        save()
    if not result["screens"]:
        raise SystemExit("no screen finished")
    best = pick(result["screens"])
    options = [o for o in best["options"]] + [x for k, v in best["config"].items()
                                                for x in (f"--{k.replace('_', '-')}", repr(v))]
    result["pick"] = {"screen": best["screen"], "config": best["config"], "options": options}
    save()
    print(f"pick: {best['screen']} {best['config']} ({best['at_threshold']}/10 at {THRESHOLD}, IQM {best['iqm']})",
          flush=True)
    result["final"] = sweep("final", options + ["--iterations-per-dispatch", "1"], TEN_SEEDS, args.out,
                            args.sweep_timeout, extra)
    save()
    for c in result["final"]:
        print(f"seeds {TEN_SEEDS}: {c['at_threshold']}/10 at {THRESHOLD}, IQM {c['iqm']}, {c['final']}; the last 16 "
              f"iterations' means {c['last16_mean']}", flush=True)


if __name__ == "__main__":
    main()
