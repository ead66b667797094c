"""The algorithm a command line names, the devices it runs on, and its compiled program (`fragc run`, `bench`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from fragc import algos
from fragc.algos.envs import IMPLEMENTATIONS, split_env_name
from fragc.api import compile_with
from fragc.devices import devices as simulated_devices, per_process_devices
from fragc.ir.errors import FragcError
from fragc.ir.host import EnvFleet
from fragc.options import CompileOptions, SearchOptions
from fragc.runtime.actions import steps_per_iteration
from fragc.runtime.program import Program

from .options import config_fields, is_multiprocess


def make_algo(args: argparse.Namespace) -> Any:
    """The algorithm with the config options given. Under `fragc run`, `--iterations N` sets the config's
    `iterations` field where it has one, else its `total_steps` to N iterations' env steps (so that the config
    describes the run: PPO anneals its learning rate over `iterations`); `run.run_length` reads it back."""
    config = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
    iterations = getattr(args, "iterations", None) if args.command == "run" else None
    if iterations is None:
        return algos.make(args.algo, **config)
    if config.get("total_steps") is not None or getattr(args, "total_steps", None) is not None:
        raise FragcError("pass --iterations or --total-steps, not both")
    fields = config_fields(args.algo)
    if "iterations" in fields:
        return algos.make(args.algo, **config, iterations=iterations)
    algo = algos.make(args.algo, **config)
    steps = steps_per_iteration(algo)
    if "total_steps" in fields and steps:
        algo = algos.make(args.algo, **config, total_steps=iterations * steps)
    return algo


def fit_fleet_envs(args: argparse.Namespace) -> None:
    """`--env-fleet ray:NxE` without `--num-envs`: the algorithm's num_envs (a config field) is N*E, said on
    stderr; with `--num-envs`, refused in one line unless they agree (before Ray is joined). An environment that
    does not step on the host (gymnax, jaxmarl) is refused first: a fleet steps host environments only."""
    if not getattr(args, "env_fleet", None):
        return
    fleet = EnvFleet.parse(args.env_fleet)
    check_host_env(args, f"--env-fleet {args.env_fleet}")
    if not fleet.envs_per_worker:
        return
    if getattr(args, "cfg_num_envs", None) is not None:
        fleet.resolved(args.cfg_num_envs, 1)  # refused in one line unless N*E environments
        return
    if "num_envs" in config_fields(args.algo):
        args.cfg_num_envs = fleet.workers * fleet.envs_per_worker
        print(f"fragc: num_envs = {args.cfg_num_envs} ({fleet}: {fleet.workers} workers x {fleet.envs_per_worker} "
              "environments)", file=sys.stderr)


def check_host_env(args: argparse.Namespace, option: str) -> None:
    """Refuse `option` (remote environment workers) in one line, before anything starts, where the environment the
    run names (`--env`/`--env-name`, else its config's default) does not step on the host."""
    name = configured_env(args)
    if name is None:
        return  # an algorithm without an env field: the passes say whether anything steps on the host
    backend, _ = split_env_name(name)
    if getattr(IMPLEMENTATIONS.get(backend), "on_host", False):
        return
    raise FragcError(f"{option}: environment '{name}' ({backend}) steps on the device, in the compiled program; env "
                     f"fleets step host environments (gymnasium:ID, envpool:ID), e.g. --env gymnasium:CartPole-v1")


def configured_env(args: argparse.Namespace) -> str | None:
    """The environment name the command line gives (`--env`, `--env-name`), else the default of the algorithm
    config's `env` (or `env_name`) field; None where the config has neither."""
    for field in ("env", "env_name"):
        given = getattr(args, f"cfg_{field}", None)
        if isinstance(given, str) and given:
            return given
    config_cls = algos.load(args.algo)[1]
    fields = {f.name: f for f in dataclasses.fields(config_cls)} if config_cls else {}
    for field in ("env", "env_name"):
        if field in fields and isinstance(fields[field].default, str) and fields[field].default:
            return fields[field].default
    return None


def env_name(algo: Any) -> str:
    """The environment the algorithm's config names, "?" where it names none."""
    config = getattr(algo, "config", None)
    return str(getattr(config, "env", None) or getattr(config, "env_name", None) or "?")


def program_devices(args: argparse.Namespace) -> Any:
    """What `--devices N` gives `fragc.compile`: N, its CPU devices simulated before the algorithm's module can
    start JAX's backend; in a multi-process run, the first N of every process (None: every device there is)."""
    if is_multiprocess(args):
        return None if args.devices is None else per_process_devices(args.devices)
    simulated_devices(args.devices)
    return args.devices


def search_options(args: argparse.Namespace, run_iterations: int | None = None) -> SearchOptions:
    """The search's options from the command line (`--policy auto`; read only then), saying what it does on
    stderr."""
    limit = max(1, int(args.memory_limit * 2**20)) if args.memory_limit is not None else "device"
    given = {name: value for name, value in (("budget", args.auto_budget), ("top", args.auto_top))
             if value is not None}  # the others: SearchOptions' defaults
    return SearchOptions(**given, cache=not args.no_auto_cache, memory_limit=limit, run_iterations=run_iterations,
                         log=lambda line: print(line, file=sys.stderr))


def compile_algo(args: argparse.Namespace, algo: Any, devices: Any, iterations_per_dispatch: int | None = None,
                 run_iterations: int | None = None) -> Program:
    """`fragc.compile` of `algo` with the command line's placement (and search) options."""
    return compile_with(algo, CompileOptions(args.policy, devices, iterations_per_dispatch=iterations_per_dispatch,
                                             env_groups=args.env_groups, env_workers=args.env_workers,
                                             env_fleet=args.env_fleet,
                                             search=search_options(args, run_iterations)))
