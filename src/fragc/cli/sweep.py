"""`fragc sweep ALGO`: a grid of hyperparameters x seeds as one program, with a statistical report.

    fragc sweep ppo --lr 1e-4,3e-4,1e-3 --ent-coef 0,0.01 --seeds 0-9 [--devices N] [--pbt-every K]

A config option given several values (comma-separated) is an axis of the grid; given one, it sets the config as
under `fragc run`. What runs and what it writes is src/fragc/sweep.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import jax

from fragc import algos
from fragc.api import compile_with
from fragc.devices import devices
from fragc.ir.errors import FragcError
from fragc.ir.sweep import PBT
from fragc.options import CompileOptions
from fragc.passes.policy import population
from fragc.runtime.actions import steps_per_iteration
from fragc.runtime.reporting import check_metrics_file, enable_compilation_cache
from fragc.runtime.stopping import Stopped
from fragc.sinks import tracking
from fragc.sinks.progress import progress_action
from fragc.sweep import MemberMetrics, Members, best_member, report
from fragc.training import algo_meta, train

from .options import algo_argument, config_options, count, seed
from .run import open_checkpoints, output_options


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    """`fragc sweep`'s options; with `algo` known, its config fields, each taking one value or a list."""
    algo_argument(parser)
    parser.add_argument("--seeds", type=seed_list, default=list(range(10)), metavar="SEEDS",
                        help="seeds of every configuration: 0-9 or 0,3,5 (default 0-9)")
    parser.add_argument("--policy", default="single",
                        help="the members' policy (default single; one device group only)")
    parser.add_argument("--devices", type=count, default=None,
                        help="devices to spread the members over (default 1; simulated on CPU if needed)")
    parser.add_argument("--exact", action="store_true",
                        help="run each device's members one after another, each bit for bit its single run "
                             "(default: vectorised, faster, equal to the last bits)")
    parser.add_argument("--iterations", type=count, default=None, metavar="N",
                        help="train N iterations (default: the config's total_steps)")
    parser.add_argument("--iterations-per-dispatch", type=count, default=16, help="iterations scanned per dispatch")
    parser.add_argument("--pbt-every", type=count, default=None, metavar="K",
                        help="population-based training: every K iterations the worst quarter copies the best "
                             "quarter and perturbs its hyperparameters (src/fragc/runtime/pbt.py)")
    parser.add_argument("--pbt-metric", default=None, metavar="METRIC",  # None: PBT's (refused without --pbt-every)
                        help="the metric PBT ranks members by (default episode_return)")
    parser.add_argument("--pbt-seed", type=seed, default=None, help="seed of PBT's draws (default 0)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="report how many seeds reach this final return")
    parser.add_argument("--out", default=None, metavar="DIR", help="where the sweep writes (default sweeps/ALGO)")
    parser.add_argument("--checkpoint-every", type=count, default=64, metavar="K",
                        help="iterations between checkpoints (default 64)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    parser.add_argument("--stop-after", type=count, default=None, metavar="K",
                        help="run at most K iterations now (checkpointed), to be continued with --resume")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    output_options(parser, quiet="print only the report: no header or progress lines",
                   track_dir="the --metrics file's folder, else --out", track_timeout=True)
    parser.add_argument("--no-plot", action="store_true", help="do not draw curves.png")
    if algo is not None:
        config_options(parser, algo, values=_values,
                       description="one value sets the field; several (a,b,c) sweep it")


def _values(kind: Any) -> Any:
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"expected a value or a comma-separated list, got {text!r}")
        return [kind(t) for t in items]

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def seed_list(text: str) -> list[int]:
    """'0-9' or '0,3,5' -> the seeds, each in 0 .. 2**32 - 1, no seed twice."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            bounds = [lo, hi]
        else:
            bounds = seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are 0-9 or 0,3,5, got {text!r}") from None
    if min(bounds) < 0 or max(bounds) > 2**32 - 1:  # before a range is made: 0-4294967296 would not fit in memory
        raise argparse.ArgumentTypeError(f"seeds must be in 0 .. 2**32 - 1: got {text!r}")
    if "-" in text:
        seeds = list(range(lo, hi + 1))
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be distinct, at least one: got {text!r}")
    return seeds


def main(args: argparse.Namespace) -> int:
    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
    fixed = {k: v[0] for k, v in given.items() if len(v) == 1}
    grid = {k: v for k, v in given.items() if len(v) > 1}
    if not grid and len(args.seeds) < 2:
        raise FragcError("a sweep needs several seeds or a config option with several values (--lr 1e-4,3e-4)")
    out = args.out or os.path.join("sweeps", os.path.basename(args.algo).replace(":", "_"))
    if args.policy.replace(" ", "") == "auto":
        raise FragcError("fragc sweep: --policy auto searches one program's placement, not a sweep's; pass a base "
                         "policy such as single (the default), whose population spreads the members over the devices")
    run_info = {"algo": args.algo, "seeds": args.seeds, "grid": grid, "pbt_every": args.pbt_every}
    tracking.check_writable(out, "the sweep's output")  # before compiling, which can take a minute
    track_dir = _track_dir(args, out, run_info)
    devices(args.devices)
    enable_compilation_cache()
    algo = algos.make(args.algo, **fixed)
    iterations = run_iterations(algo, args)
    steps = steps_per_iteration(algo)
    pbt = pbt_settings(args)
    policy = population(args.policy, args.seeds, exact=args.exact, pbt=pbt, **grid)
    options = CompileOptions(policy, args.devices, iterations_per_dispatch=args.iterations_per_dispatch)
    if not args.quiet:
        print(f"fragc sweep {args.algo}: compiling the population's program: tracing, passes and XLA can take a "
              "minute", file=sys.stderr if args.json else sys.stdout, flush=True)
    prog = None if args.resume else compile_with(algo, options)  # every refusal before anything is written
    make_folder(out)
    with open_checkpoints(os.path.join(out, "checkpoints")) as checkpoints:
        if args.resume:  # another algorithm, config or seeds refused before compiling
            checkpoints.check_run(algo_meta(algo, run_info))
            prog = compile_with(algo, options)
        members = Members(args.seeds, grid, steps, pbt=pbt is not None)
        log = sys.stderr if args.json else sys.stdout
        progress = None if args.quiet else log
        state = prog.init(0)
        if progress:
            print(f"fragc sweep {args.algo}: {members.configs} configuration(s) x {len(args.seeds)} seed(s) = "
                  f"{members.count} members on {len(jax.tree.leaves(state)[0].sharding.device_set)} device(s), "
                  f"{iterations} iterations" + (f" x {steps} env steps" if steps else "")
                  + f", compiled in {prog.compile_seconds:.1f} s", file=progress)
        writer = MemberMetrics(os.path.join(out, "members.jsonl"), members)
        try:
            train(prog, state, iterations, checkpoint_dir=checkpoints, checkpoint_every=args.checkpoint_every,
                  resume=args.resume, progress=progress, stop_after=args.stop_after, run_info=run_info,
                  metrics=args.metrics, track=args.track, track_dir=track_dir,
                  actions=[writer, *([progress_action(iterations, progress, best_member)] if progress else [])])
        except Stopped as stop:
            print(f"fragc: {stop}; its checkpoint continues with --resume", file=sys.stderr)
            return stop.exit_code
    if args.stop_after and writer.last < iterations:
        print(f"stopped after iteration {writer.last} of {iterations}: continue with --resume", file=log)
        return 0
    summary = report(os.path.join(out, "members.jsonl"), members, args.threshold, out, plot=not args.no_plot,
                     log=log)
    if args.json:
        print(json.dumps(summary))
    return 0


def pbt_settings(args: argparse.Namespace) -> PBT | None:
    """PBT's settings from `--pbt-every`, `--pbt-metric` and `--pbt-seed` (PBT's own defaults for those not
    given); the last two are refused without `--pbt-every`: they would change nothing."""
    given = {name: value for name, value in (("metric", args.pbt_metric), ("seed", args.pbt_seed))
             if value is not None}
    if not args.pbt_every:
        if given:
            raise FragcError(f"--pbt-{next(iter(given))} is an option of population-based training: give "
                             "--pbt-every K too")
        return None
    return PBT(args.pbt_every, **given)


def make_folder(path: str, what: str = "the sweep's output folder") -> None:
    """The output folder, or one line saying why it cannot be made (a read-only place, a file there)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise FragcError(f"cannot write {what} '{path}': {err.strerror or err}") from None
    if not os.access(path, os.W_OK):
        raise FragcError(f"cannot write {what} '{path}': it is not writable")


def _track_dir(args: argparse.Namespace, out: str, run_info: dict) -> str | None:
    """Where the tracking sinks write (the --metrics file's folder, else --out), once the sinks named and their
    clients are known to be there, and a metrics file's folder to be writable: refused before compiling."""
    if args.track_dir and not args.track:
        raise FragcError("--track-dir says where the tracking sinks write: give --track SINKS too")
    if args.metrics:
        folder = os.path.dirname(os.path.abspath(args.metrics))
        if folder != os.path.abspath(out):  # the sweep's own folder is made before training
            check_metrics_file(args.metrics)
    if not args.track:
        return None
    track_dir = args.track_dir or (os.path.dirname(os.path.abspath(args.metrics)) if args.metrics else out)
    # an unknown sink, a missing client or a server that does not answer: one line, before anything trains
    tracking.trackers(args.track, track_dir, None, run_info, timeout=args.track_timeout)
    return track_dir


def run_iterations(algo: Any, args: argparse.Namespace) -> int:
    """Each member's run length: --iterations, else the config's `iterations` (--total-steps sets it)."""
    if args.iterations is not None:
        return args.iterations
    iterations = getattr(getattr(algo, "config", None), "iterations", None)
    if not isinstance(iterations, int) or iterations < 1:
        raise FragcError(f"{args.algo}: a sweep needs its run length: pass --iterations N or --total-steps N")
    return iterations
