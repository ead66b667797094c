"""`fragc run ALGO`: parse, compile, train (`fragc.train`), print progress and the final line."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from typing import Any

import jax
import numpy as np

from fragc.algos import ray_envs
from fragc.ir.errors import FragcError
from fragc.options import search_seeds
from fragc.runtime.actions import steps_per_iteration
from fragc.runtime.checkpoint import Checkpointer
from fragc.runtime.reporting import check_metrics_file, enable_compilation_cache, params_fingerprint
from fragc.runtime.stopping import Stopped
from fragc.sinks import tracking
from fragc.sinks.video import CaptureVideo, check_capture
from fragc.training import algo_meta, train

from . import config_file
from .algorithm import compile_algo, env_name, fit_fleet_envs, make_algo, program_devices
from .options import (algorithm_options_first, config_options, count, placement_options, process_options,
                      search_options, seconds, seed)


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    """ALGO and --config; then, in --help, the algorithm's hyperparameters first and the run's own options in
    groups after them (added after the run's own, so that a field named like one of them is told apart)."""
    placement = parser.add_argument_group("where it runs")
    placement_options(parser, placement)
    placement.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                           help="with --env-fleet: the Ray cluster to join (default RAY_ADDRESS, else a local Ray is "
                           "started)")
    placement.add_argument("--iterations-per-dispatch", type=count, default=None,
                           help="iterations scanned per dispatch (default 16, or the algorithm's own: alphazero's 1 "
                                "on the CPU; searched under --policy auto)")
    search_options(placement)
    length = parser.add_argument_group("run length and seed")
    length.add_argument("--seed", type=seed, default=0, help="PRNG seed, 0 to 2**32 - 1 (default 0)")
    length.add_argument("--iterations", type=count, default=None, metavar="N",
                        help="train N iterations: sets the config's `iterations` field where it has one, else its "
                             "total_steps to N iterations' env steps; for an algorithm without either (or without a "
                             "config), the run length itself")
    output = parser.add_argument_group("output")
    output.add_argument("--print-config", action="store_true",
                        help="print the resolved configuration (these options and the algorithm's config) as a "
                             "--config file, in the format of --config (default TOML), and exit without training")
    output_options(output, track_timeout=True)
    output.add_argument("--json", action="store_true", help="print a JSON summary on stdout (progress goes to stderr)")
    output.add_argument("--capture-video", action="store_true",
                        help="record a greedy evaluation episode every --video-every evaluations (needs "
                             "--eval-every; videos go to TRACK_DIR/videos; pip install 'fragc[video]')")
    output.add_argument("--video-every", type=count, default=5, metavar="K",
                        help="evaluations between videos with --capture-video (default 5)")
    output.add_argument("--no-cache", action="store_true",
                        help="do not use the persistent compilation cache (default: on, in FRAGC_CACHE_DIR or "
                             "~/.cache/fragc)")
    checkpoints = parser.add_argument_group("checkpoints")
    checkpoints.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                             help="save the whole training state here")
    checkpoints.add_argument("--checkpoint-every", type=count, default=64, metavar="K",
                             help="iterations between checkpoints (default 64; rounded up to whole dispatches)")
    checkpoints.add_argument("--resume", action="store_true",
                             help="continue from the latest good checkpoint in --checkpoint-dir")
    checkpoints.add_argument("--stop-after", type=count, default=None, metavar="K",
                             help="run at most K iterations now (checkpointed), to be continued with --resume")
    process_options(parser.add_argument_group("several processes (jax.distributed)"))
    if algo is not None:
        config_options(parser, algo)
        if "--total-steps" not in parser._option_string_actions:  # a config without total_steps, or none
            length.add_argument("--total-steps", type=count, default=None, metavar="N",
                                help="train N env steps: N // steps_per_iteration iterations (where the algorithm "
                                     "has steps_per_iteration)")
        algorithm_options_first(parser)


def output_options(parser: argparse.ArgumentParser, quiet: str = "print only the final line",
                   track_dir: str = "the --metrics file's folder, else --checkpoint-dir, else runs",
                   track_timeout: bool = False) -> None:
    """What a run prints and where it logs: `fragc run`'s, and `fragc sweep`'s too (`quiet` and `track_dir`: what
    --quiet keeps and where the sinks write by default, in words for --help). `track_timeout`: --track-timeout
    too, for a command that passes it on (`tracking.sink_names`' or `trackers`' timeout); one that does not leaves
    it out rather than take it and ignore it (its sinks are probed with the default `tracking.PROBE_TIMEOUT`)."""
    parser.add_argument("--quiet", action="store_true", help=quiet)
    parser.add_argument("--metrics", default=None, metavar="FILE", help="write one JSON line per reporting interval")
    parser.add_argument("--track", default=None, metavar="SINKS",
                        help="log every metric against env steps to tensorboard, wandb and/or mlflow "
                             "(comma-separated; pip install 'fragc[track]'; docs/tracking.md)")
    parser.add_argument("--track-dir", default=None, metavar="DIR",
                        help=f"where the sinks write (default: {track_dir})")
    if not track_timeout:
        return
    parser.add_argument("--track-timeout", type=seconds, default=tracking.PROBE_TIMEOUT, metavar="SECONDS",
                        help="refuse the run, before it trains, when --track's server (an http(s) "
                             "MLFLOW_TRACKING_URI, W&B online) does not answer within SECONDS "
                             f"(default {tracking.PROBE_TIMEOUT:g}; a file store or W&B offline is not probed)")


def main(args: argparse.Namespace) -> int:
    """Parse, train, print: the training itself is `fragc.train`."""
    if args.track_dir and not (args.track or args.capture_video):
        raise FragcError("--track-dir says where --track's sinks (and --capture-video's videos) write: give "
                         "--track SINKS too")
    if args.print_config:
        algo = make_algo(args)
        run_length(algo, args)  # a run it could not start is refused here too
        print(config_file.config_text(args, algo, own_parser(args.algo)), end="")
        return 0
    if args.explain and search_seeds(args.policy) is None:
        raise FragcError(f"--explain explains --policy auto's choice; this run has --policy {args.policy}")
    search_only = [f for f, on in (("--auto-budget", args.auto_budget is not None),
                                   ("--auto-top", args.auto_top is not None),
                                   ("--memory-limit", args.memory_limit is not None),
                                   ("--no-auto-cache", args.no_auto_cache)) if on]
    if search_only and search_seeds(args.policy) is None:
        raise FragcError(f"{search_only[0]} is an option of --policy auto's search; this run has --policy "
                         f"{args.policy}")
    if args.resume and not args.checkpoint_dir:
        raise FragcError("--resume needs --checkpoint-dir")
    if args.stop_after and not args.checkpoint_dir:
        raise FragcError("--stop-after needs --checkpoint-dir (to continue from with --resume)")
    if not args.no_cache:
        enable_compilation_cache()
    lead = jax.process_index() == 0  # progress and output come from process 0
    if args.metrics and lead:  # process 0 writes the metrics file: refused here, not after compiling
        check_metrics_file(args.metrics)
    if args.track:  # a sink that could not start, or write, refused before any folder is made
        tracking.sink_names(args.track, args.track_timeout)  # and a tracking server that does not answer
        tracking.check_writable(track_folder(args), "--track's runs")
    run_info = {"algo": args.algo, "seed": args.seed}
    devices = program_devices(args)
    if args.ray_address and not args.env_fleet:
        raise FragcError("--ray-address names the Ray cluster of --env-fleet's workers: give --env-fleet too")
    fit_fleet_envs(args)
    if args.env_fleet:  # Ray joined (or started) before any folder is made: a wrong address is refused here
        ray_envs.connect(args.ray_address)
    algo = make_algo(args)
    getattr(algo, "env", None)  # made now (the algorithms make theirs on first use): an unknown one is refused
    # before the compiling line
    iterations, notes = run_length(algo, args)  # a run that cannot start is refused before compiling
    videos = video_capture(args, algo)  # and videos it could not draw or write
    with open_checkpoints(args.checkpoint_dir) as checkpoints:  # an unwritable folder fails before compiling
        if lead:
            for note in notes:
                print(f"fragc: warning: {note}", file=sys.stderr)
        if args.resume:  # and so is another configuration's checkpoint
            checkpoints.check_run(algo_meta(algo, run_info))
        out = sys.stderr if args.json else sys.stdout
        if lead and not args.quiet:
            print(_compiling_line(args, algo), file=out, flush=True)
        prog = compile_algo(args, algo, devices, args.iterations_per_dispatch, iterations)
        report = getattr(prog, "auto", None)
        if report is not None and lead:
            print(report.table() if args.explain else report.summary(), file=sys.stderr if args.json else sys.stdout)
        if lead:
            config_file.write_run_records(args, algo, own_parser(args.algo))
        progress = None if args.quiet or not lead else out
        if progress is not None:
            print(_first_line(args, algo, prog, iterations), file=out)
        try:
            result = train(prog, prog.init(args.seed), iterations, checkpoint_dir=checkpoints,
                           checkpoint_every=args.checkpoint_every, resume=args.resume, metrics=args.metrics,
                           progress=progress, stop_after=args.stop_after, run_info=run_info, track=args.track,
                           track_dir=args.track_dir, actions=videos)
        except Stopped as stop:
            if lead:
                print(f"fragc: {stop}; its checkpoint continues with --resume", file=sys.stderr)
            return stop.exit_code
        fingerprint = params_fingerprint(result.state)  # on every process: it may gather across processes
        if lead:
            print(_summary(args, algo, prog, result, fingerprint) if args.json else _last_line(algo, prog, result))
        return 0


def own_parser(algo: str) -> argparse.ArgumentParser:
    """`fragc run ALGO`'s parser, standalone: its options are a config file's keys."""
    parser = argparse.ArgumentParser(prog="fragc run")
    add_options(parser, algo)
    return parser


def open_checkpoints(directory: str | None) -> Any:
    """The run's checkpoints (closed when the run ends), or nothing to open without a folder."""
    return Checkpointer(directory) if directory else contextlib.nullcontext()


def run_length(algo: Any, args: argparse.Namespace) -> tuple[int, list[str]]:
    """How many iterations `fragc run` trains, and what to say about it (a --total-steps below one iteration):
    `--iterations`, else `--total-steps` over the steps of an iteration, else the config's `iterations` (a field,
    or a property such as total_steps // steps_per_iteration)."""
    steps = steps_per_iteration(algo)
    asked = getattr(args, "iterations", None)
    if asked is not None:
        return asked, []
    config = getattr(algo, "config", None)
    own_total = getattr(args, "total_steps", None)  # the option of an algorithm whose config has no total_steps
    if own_total is not None:
        if not steps:
            raise FragcError(f"{args.algo}: --total-steps needs the env steps of an iteration (steps_per_iteration on "
                             f"the algorithm or its config); pass --iterations N")
        iterations = max(1, own_total // steps)
    else:
        iterations = getattr(config, "iterations", None)
        if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
            raise FragcError(f"{args.algo}: fragc run needs the run length: pass --iterations N (or --total-steps N "
                             f"where the algorithm has steps_per_iteration), or give its config a positive int "
                             f"`iterations` (a field, or a property such as total_steps // steps_per_iteration)"
                             + (f"; got {iterations!r}" if config is not None else ""))
    total = own_total if own_total is not None else getattr(args, "cfg_total_steps", None)
    if total is None or not steps or iterations != max(1, total // steps):  # not given, or not what decides
        return iterations, []
    if total < steps:
        return iterations, [f"--total-steps {total} is less than one iteration ({steps} env steps): running 1 "
                            f"iteration ({steps} env steps)"]
    return iterations, []  # rounded down to whole iterations: the first and the last line say how many steps


def video_capture(args: argparse.Namespace, algo: Any) -> list:
    """`--capture-video`: a greedy episode recorded every `--video-every` evaluations (src/fragc/sinks/video.py)."""
    if not args.capture_video:
        return []
    eval_every = getattr(getattr(algo, "config", None), "eval_every", 0)
    if not eval_every:
        raise FragcError("--capture-video records every K evaluations: give --eval-every N (iterations between "
                         "evaluations) too")
    check_capture(algo, track_folder(args))  # before compiling
    return [CaptureVideo(eval_every * args.video_every, track_folder(args))]


def track_folder(args: argparse.Namespace) -> str:
    """Where the tracking sinks and videos go: --track-dir, else the --metrics file's folder, else --checkpoint-dir,
    else runs (as `fragc.train` chooses)."""
    return args.track_dir or (os.path.dirname(os.path.abspath(args.metrics)) if args.metrics
                              else args.checkpoint_dir or "runs")


def _compiling_line(args: argparse.Namespace, algo: Any) -> str:
    """Said before compiling, which is silent and can take a minute: what is compiled, and that it takes a while."""
    env = env_name(algo)
    what = (f"env {env}, " if env != "?" else "") + f"policy {args.policy}"
    cache = "" if args.no_cache else " (the compile cache makes a rerun faster)"
    return f"fragc run {args.algo}: compiling for {what}: tracing, passes and XLA can take a minute{cache}"


def _first_line(args: argparse.Namespace, algo: Any, prog: Any, iterations: int) -> str:
    env, steps = env_name(algo), steps_per_iteration(algo)
    what = [f"env {env}"] if env != "?" else []
    what += [f"policy {prog.policy.name}", f"{iterations} iterations" + (f" x {steps} env steps" if steps else ""),
             f"compiled in {prog.compile_seconds:.1f} s"]
    return f"fragc run {args.algo}: {', '.join(what)}"


def _summary(args: argparse.Namespace, algo: Any, prog: Any, result: Any, fingerprint: str) -> str:
    """`--json`: the run's summary."""
    steps, env, report = steps_per_iteration(algo), env_name(algo), getattr(prog, "auto", None)
    last = last_metrics(result.history, population=bool(prog.population))
    return json.dumps({"final_return": finite_or_none(result.final_return),
                       "env_steps": result.iterations * steps if steps else None,  # unknown: not claimed
                       "iterations": result.iterations, "wall_s": round(result.wall_s, 3),
                       "compile_s": round(prog.compile_seconds, 3), "policy": prog.policy.name,
                       "iterations_per_dispatch": prog.k,
                       "auto": report.chosen.label if report is not None else None,
                       "devices": len(prog.devices), "algo": args.algo, "env": None if env == "?" else env,
                       "seed": args.seed, "resumed_from": result.resumed_from, "processes": jax.process_count(),
                       "params_fingerprint": fingerprint,
                       "final_metrics": {k: finite_or_none(v) for k, v in last.items()}})


def _last_line(algo: Any, prog: Any, result: Any) -> str:
    """The final mean episode return, or the last value of each metric of an algorithm without one."""
    steps = steps_per_iteration(algo)
    after = f"{result.iterations * steps} env steps" if steps else f"{result.iterations} iterations"
    last = last_metrics(result.history, population=bool(prog.population))
    if "episode_return" in last or (not last and math.isfinite(result.final_return)):
        evaluated = f", greedy evaluation {last['eval_return']:.1f}" if "eval_return" in last else ""
        return f"final mean episode return {result.final_return:.1f}{evaluated} after {after} ({result.wall_s:.1f} s)"
    shown = ", ".join(f"{k} {v:.4g}" for k, v in last.items()) or "none (no iteration ran)"
    return f"final metrics: {shown} after {after} ({result.wall_s:.1f} s)"


def last_metrics(history: dict, population: bool = False) -> dict[str, float]:
    """Each metric's mean over its last iteration (over replicas, environments, population members: a
    population's rows are on axis 1)."""
    last = {}
    for name, rows in history.items():
        rows = np.asarray(rows)
        if rows.size and np.issubdtype(rows.dtype, np.number):
            last[name] = float(np.mean(rows[:, -1] if population else rows[-1]))
    return last


def finite_or_none(x: float) -> float | None:
    """JSON has no NaN: a return not measured yet (no episode ended) is null."""
    return x if math.isfinite(x) else None
