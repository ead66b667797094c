"""Kernel launches per training iteration: fragc's built-in PPO against PureJaxRL's own `ppo.py`, from optimised HLO.

    python bench/launches.py [--num-envs 4 2048] [--reference-dir bench/references/build/purejaxrl]
                             [--lowering straight rolled] [--out bench/results]

Both sides run PureJaxRL's CartPole-v1 configuration (`CONFIG` below; fragc: `ppo.Config(num_envs=N)`, whose
defaults are that configuration), and both are counted by src/fragc/runtime/cost.py's `hlo_launches`: the kernels a GPU would
launch for the program this backend compiled (fusions and unfused operations, loop bodies times their trip
counts; its docstring says the method and its limits). Where this runs on a CPU, the count is a proxy for a GPU's.

- fragc: `fragc.compile(ppo.PPO(ppo.Config(num_envs=N)), "single").cost()["total"]["launches"]`, the dispatch
  loop's body (one iteration) plus the dispatch's own work over its k iterations.
- purejaxrl: `jax.jit(make_train(config)).lower(key).compile()` of PureJaxRL's unmodified `ppo.py` (built by
  `python bench/references/build.py` into the reference folder; never a rewrite: without it only fragc's row is
  printed), counted whole and divided by NUM_UPDATES (`whole/NUM_UPDATES`: the outer scan over NUM_UPDATES has
  a known trip count, so this is an iteration plus the set-up -- network init, environment reset -- spread over
  the run). `loop body` is the update loop's body alone, from a second compile with TOTAL_TIMESTEPS doubled:
  (count(2T) - count(T)) / (its NUM_UPDATES - NUM_UPDATES). The two agree where NUM_UPDATES is large (976 at 4
  environments); at 2048 environments NUM_UPDATES is 1 and the whole program is the set-up plus one iteration.

`--lowering`: how `jax.random`'s threefry is lowered, the same on both sides. `straight` (default), as JAX lowers it
for a GPU: 20 rounds one after another, fused (fragc's CPU rule, src/fragc/runtime/cpu_lowering.py, taken for both programs
through `cpu_lowerings()`). `rolled`: JAX's own CPU lowering, a loop of 5 trips a draw, each trip several
launches: a CPU artifact that a GPU does not have, which dominates PureJaxRL's CPU count (many draws a step). Both
lowerings sort as JAX does. On a GPU both are the GPU's own lowering (fragc's rules are the CPU's), and the count
reads the GPU's optimised HLO: the check of the CPU's proxy. Prints a table (side, lowering, launches per
iteration, exact: no loop of unknown trip count) and the ratios fragc / purejaxrl; writes launches.json.

On the CPU (jax 0.10.2, XLA's default flags), launches per iteration, fragc / PureJaxRL (whole/NUM_UPDATES):
straight, 4 envs 9,327 / 10,199 (0.915); 2048 envs 9,453 / 10,301 (0.918; its loop body 10,037: 0.942).
rolled, 4 envs 55,435 / 78,197 (0.709); 2048 envs 56,257 / 80,477 (0.699).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from typing import Any

import jax

import fragc
from fragc.algos import ppo
from fragc.runtime.cost import hlo_launches
from fragc.runtime.cpu_lowering import choosing, cpu_lowerings

CONFIG = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 5e5, "UPDATE_EPOCHS": 4,
          "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5,
          "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1", "ANNEAL_LR": True, "DEBUG": False}
"""PureJaxRL's PPO configuration for CartPole-v1 (its ppo.py's `__main__`, without the debug prints)."""
DEFAULT_REFERENCE = "bench/references/build/purejaxrl"
LOWERINGS = {"straight": True, "rolled": False}  # --lowering -> fragc's straight threefry rule on


def fragc_row(num_envs: int, lowering: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    with choosing(threefry=LOWERINGS[lowering], sort=False):
        prog = fragc.compile(ppo.PPO(ppo.Config(num_envs=num_envs)), "single")
    total = prog.cost()["total"]
    return {"side": "fragc", "lowering": lowering, "num_envs": num_envs, "launches_per_iteration": total["launches"],
            "exact": total["launches_exact"], "iterations_per_dispatch": prog.k,
            "seconds": time.perf_counter() - t0}


def load_reference(folder: str) -> Any | None:
    """PureJaxRL's `ppo` module from the built reference folder, or None where it is not built."""
    if not os.path.isfile(os.path.join(folder, "ppo.py")):
        return None
    sys.path.insert(0, os.path.abspath(folder))  # ppo.py imports its own `wrappers`
    return importlib.import_module("ppo")


def purejaxrl_count(module: Any, num_envs: int, total_timesteps: float, lowering: str) -> tuple[int, bool, int]:
    """(launches of the whole `train`, exact, NUM_UPDATES) of PureJaxRL's jitted `make_train(config)`."""
    config = dict(CONFIG, NUM_ENVS=num_envs, TOTAL_TIMESTEPS=total_timesteps)
    train = jax.jit(module.make_train(config))  # sets config["NUM_UPDATES"]
    key = jax.random.PRNGKey(30)
    if LOWERINGS[lowering]:
        with choosing(threefry=True, sort=False), cpu_lowerings():
            text = train.lower(key).compile().as_text()
    else:  # JAX's own lowering: `jax.jit(make_train(config))` as is
        text = train.lower(key).compile().as_text()
    count, exact = hlo_launches(text)
    return count, exact, int(config["NUM_UPDATES"])


def purejaxrl_row(module: Any, num_envs: int, lowering: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    whole, exact, updates = purejaxrl_count(module, num_envs, CONFIG["TOTAL_TIMESTEPS"], lowering)
    whole2, exact2, updates2 = purejaxrl_count(module, num_envs, 2 * CONFIG["TOTAL_TIMESTEPS"], lowering)
    return {"side": "purejaxrl", "lowering": lowering, "num_envs": num_envs,
            "launches_per_iteration": whole / updates, "exact": exact and exact2, "num_updates": updates,
            "whole_program": whole, "loop_body": (whole2 - whole) / (updates2 - updates),
            "seconds": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[4], help="NUM_ENVS of both sides, each counted")
    parser.add_argument("--reference-dir", default=DEFAULT_REFERENCE, help="PureJaxRL's built ppo.py and wrappers.py")
    parser.add_argument("--lowering", nargs="+", choices=sorted(LOWERINGS), default=["straight"],
                        help="threefry's lowering on both sides (module docstring)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    reference = load_reference(args.reference_dir)
    if reference is None:
        print("PureJaxRL's ppo.py is not built: python bench/references/build.py")
    revision = _revision(args.reference_dir) if reference is not None else None
    rows = []
    for n in args.num_envs:
        for lowering in args.lowering:
            rows.append(fragc_row(n, lowering))
            if reference is not None:
                rows.append(purejaxrl_row(reference, n, lowering))
    print(f"{'num_envs':>8}  {'side':<9}  {'lowering':<8}  {'launches/iteration':>18}  {'exact':<5}  "
          f"{'loop body':>9}  NUM_UPDATES")
    for r in rows:
        body = f"{r['loop_body']:9.0f}" if "loop_body" in r else " " * 9
        print(f"{r['num_envs']:>8}  {r['side']:<9}  {r['lowering']:<8}  {r['launches_per_iteration']:18.1f}  "
              f"{str(r['exact']):<5}  {body}  {r.get('num_updates', '')}")
    ratios = []
    for n in args.num_envs:
        for lowering in args.lowering:
            f, p = (next((r for r in rows if (r["side"], r["num_envs"], r["lowering"]) == (s, n, lowering)), None)
                    for s in ("fragc", "purejaxrl"))
            if f is not None and p is not None:
                ratio = {"num_envs": n, "lowering": lowering,
                         "fragc_over_purejaxrl": f["launches_per_iteration"] / p["launches_per_iteration"],
                         "fragc_over_purejaxrl_loop_body": f["launches_per_iteration"] / p["loop_body"]}
                ratios.append(ratio)
                print(f"fragc / purejaxrl at {n} envs ({lowering}): {ratio['fragc_over_purejaxrl']:.3f} "
                      f"(against its loop body: {ratio['fragc_over_purejaxrl_loop_body']:.3f})")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "launches.json")
    with open(path, "w") as f:
        json.dump({"backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
                   "purejaxrl_revision": revision, "config": CONFIG, "rows": rows, "ratios": ratios}, f, indent=1)
    print(f"wrote {path}")


def _revision(folder: str) -> str | None:
    try:
        with open(os.path.join(folder, "REFERENCE.json")) as f:
            return json.load(f).get("commit")
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    main()
