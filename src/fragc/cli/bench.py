"""`fragc bench ALGO`: every policy named compiled for the same configuration and timed alternately (A B C,
A B C, ...), so that drift on a noisy machine hits each alike; `--policies auto`: the search's table instead.
The table, bench.json and bench.png are src/fragc/runtime/bench.py's."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

from fragc import algos
from fragc.api import compile_with
from fragc.compiler import default_device_count
from fragc.devices import devices as simulated_devices, per_process_devices
from fragc.ir.errors import FragcError
from fragc.options import CompileOptions
from fragc.passes.policy import resolve
from fragc.runtime.actions import steps_per_iteration
from fragc.runtime.bench import format_table, throughput, write_outputs
from fragc.runtime.reporting import config_dict

from .algorithm import env_name, make_algo, search_options
from .options import algo_argument, config_file_option, config_options, count, is_multiprocess, process_options
from .options import search_options as add_search_options


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    algo_argument(parser)
    config_file_option(parser)
    parser.add_argument("--policies", default="single,anakin,gspmd,actor_learner,actor_learner_async",
                        help="comma-separated policies, e.g. single,population(single,4) (default: every built-in)")
    parser.add_argument("--devices", type=count, default=8, help="devices for the distributed policies (default 8)")
    parser.add_argument("--iterations", type=count, default=16, help="iterations per timed repeat (default 16)")
    parser.add_argument("--repeats", type=count, default=3, help="alternating repeats (default 3)")
    parser.add_argument("--out", default="bench-out", help="folder for bench.json and bench.png (default bench-out)")
    add_search_options(parser, explain=False)
    process_options(parser)
    if algo is not None:
        config_options(parser, algo)


def main(args: argparse.Namespace) -> int:
    policies = policy_list(args.policies)
    if not policies:
        raise FragcError("--policies names no policy")
    if "auto" in policies:
        if policies != ["auto"]:
            raise FragcError("--policies auto runs the placement search on its own: name no other policy with it")
        return search_table(args)
    if is_multiprocess(args):
        chosen = per_process_devices(args.devices) if args.devices else None
        count_ = len(chosen) if chosen else jax.device_count()
    else:
        simulated_devices(args.devices)  # simulate CPU devices before JAX starts
        chosen = count_ = args.devices
    for p in policies:
        resolve(p, count_)  # unknown names fail here, before any compilation
    fit_env_count(args, policies, count_)
    algo = make_algo(args)
    lead = jax.process_index() == 0
    log = (lambda line: print(line, file=sys.stderr)) if lead else (lambda line: None)
    rows = run_bench(lambda: make_algo(args), policies, chosen, args.iterations, args.repeats, log=log)
    if not lead:
        return 0
    config = {"algo": args.algo, "env": env_name(algo), "devices": count_, "processes": jax.process_count(),
              "iterations": args.iterations, "repeats": args.repeats, "backend": jax.default_backend(),
              "config": config_dict(algo)}
    print(format_table(rows))
    json_path, png_path = write_outputs(rows, config, args.out)
    print(f"wrote {json_path} and {png_path}")
    return 0


def policy_list(text: str) -> list[str]:
    """`--policies`: policies separated by the commas outside parentheses (`single,population(single,4)` is two)."""
    policies, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            policies.append(text[start:i].strip())
            start = i + 1
    return [p for p in policies if p]


def run_bench(make_algo: Callable[[], Any], policies: list[str], devices: Any, iterations: int, repeats: int,
              log: Callable[[str], None] = print) -> dict:
    """Per policy: compile time, devices, bytes moved per iteration, and throughput per timed repeat
    (`runtime.bench.throughput`): env steps per second where the algorithm says its steps per iteration, else
    iterations per second; the final return where it has an `episode_return` metric."""
    programs, rows = {}, {}
    for name in policies:
        algo = make_algo()
        t0 = time.perf_counter()
        prog = compile_with(algo, CompileOptions(name, None if default_device_count(name) == 1 else devices))
        compile_s = time.perf_counter() - t0
        cost = prog.cost()["total"]
        state, _ = prog.run(prog.init(0), iterations)  # warm-up: first dispatches, transfers, caches
        runs = len(prog.policy.population) or 1
        programs[name] = [prog, state, runs * steps_per_iteration(algo) * iterations]
        rows[name] = {"compile_s": compile_s, "devices": len(prog.devices),
                      "collective_bytes_per_iteration": cost["collective_bytes"],
                      "transfer_bytes_per_iteration": cost["transfer_bytes"], "iterations_per_s": [],
                      "env_steps_per_s": [] if programs[name][2] else None, "final_return": None}
        log(f"compiled {name} in {compile_s:.1f} s")
    for r in range(repeats):
        for name, entry in programs.items():
            prog, state, steps = entry
            start = time.perf_counter()
            state, history = prog.run(state, iterations)
            jax.block_until_ready(state)
            seconds = time.perf_counter() - start
            rows[name]["iterations_per_s"].append(iterations / seconds)
            if steps:
                rows[name]["env_steps_per_s"].append(steps / seconds)
            if "episode_return" in history:
                rows[name]["final_return"] = float(np.mean(np.asarray(history["episode_return"])[..., -1]))
            entry[1] = state
        log(f"repeat {r + 1}/{repeats} done")
    for row in rows.values():
        row.update(throughput(row))
    return rows


def search_table(args: argparse.Namespace) -> int:
    """`fragc bench ALGO --policies auto`: the search's table, and its report as JSON in --out."""
    simulated_devices(args.devices)
    args.policy = "auto"
    fit_env_count(args, ["anakin"], args.devices)
    algo = make_algo(args)
    prog = compile_with(algo, CompileOptions("auto", args.devices, search=search_options(args)))
    print(prog.auto.table())
    try:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "auto.json")
        with open(path, "w") as f:
            json.dump(prog.auto.to_json(), f, indent=1, default=str)
    except OSError as err:
        raise FragcError(f"cannot write the search's report to '{args.out}': {err.strerror}") from err
    print(f"wrote {path}")
    return 0


def fit_env_count(args: argparse.Namespace, policies: list[str], count_: int) -> None:
    """Every policy must divide the environments; unless --num-envs was given, round the
    algorithm's default up to a multiple of the device count, and say so."""
    config_cls = algos.load(args.algo)[1]
    fields = {f.name: f for f in dataclasses.fields(config_cls)} if config_cls else {}
    if getattr(args, "cfg_num_envs", None) is not None or not isinstance(getattr(fields.get("num_envs"), "default",
                                                                                 None), int):
        return
    default = fields["num_envs"].default
    wanted = math.lcm(default, count_, 2 if count_ > 1 else 1)
    if wanted != default and any(p not in ("single", "gspmd") for p in policies):
        args.cfg_num_envs = wanted
        if jax.process_index() == 0:
            print(f"bench: num_envs {default} -> {wanted} so that every policy's replica count divides it "
                  "(pass --num-envs to choose)", file=sys.stderr)
