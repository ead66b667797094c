"""`fragc tune ALGO`: an Optuna search whose trials run in batches, each batch one population program.

    fragc tune ppo --trials 32 --batch 8 [--lr log:1e-5..1e-2 --gamma 0.9..0.999] [--sampler tpe|random]
                   [--pruner median|halving|none] [--study-dir DIR]

A config option given `LOW..HIGH` or `log:LOW..HIGH` is searched; given one value it sets the config, as under
`fragc run`. Without any range, the algorithm's default space (src/fragc/tune.py). What runs is src/fragc/tune.py's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from typing import Any

from fragc import algos
from fragc.devices import devices
from fragc.ir.errors import FragcError
from fragc.runtime.reporting import config_dict, enable_compilation_cache
from fragc.sinks.tracking import check_writable
from fragc.tune import (JOURNAL, TrialPopulation, TuneResult, best, check_space, default_space, finished,
                        open_study, optuna_module, params_text, parse_range, summary, trials_table, tune)

from .options import algo_argument, config_options, count, seed
from .run import own_parser
from .sweep import make_folder, run_iterations, seed_list


@dataclasses.dataclass(frozen=True)
class RangeText:
    """A config option's `LOW..HIGH` or `log:LOW..HIGH`, parsed once the field's type is known."""

    text: str


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    """`fragc tune`'s options; with `algo` known, its config fields, each a value or a range to search."""
    algo_argument(parser)
    parser.add_argument("--trials", type=count, default=32, metavar="N",
                        help="trials in the study in all, those stored included: a rerun runs the missing ones, and "
                             "nothing where the study has N already (default 32)")
    parser.add_argument("--batch", type=count, default=8, metavar="B",
                        help="trials run at once, as one population program (default 8)")
    parser.add_argument("--seeds", type=seed_list, default=[0], metavar="SEEDS",
                        help="seeds of every trial, 0-2 or 0,3,5: its score is the mean over them (default 0)")
    parser.add_argument("--sampler", choices=("tpe", "random"), default="tpe", help="Optuna's sampler (default tpe)")
    parser.add_argument("--pruner", choices=("median", "halving", "none"), default="none",
                        help="stop trials at dispatch boundaries: median, successive halving, or none (default)")
    parser.add_argument("--seed", type=seed, default=0, help="the sampler's seed (default 0)")
    parser.add_argument("--study-dir", default=None, metavar="DIR",
                        help="where the study is stored; a rerun with the same folder continues it (default "
                             "studies/ALGO)")
    parser.add_argument("--metric", default="episode_return", help="the metric to maximise (default episode_return)")
    parser.add_argument("--devices", type=count, default=None,
                        help="devices to spread the members over (default 1; simulated on CPU if needed)")
    parser.add_argument("--exact", action="store_true",
                        help="run each device's members one after another, each trial bit for bit its single run "
                             "(default: vectorised, faster, equal to the last bits)")
    parser.add_argument("--iterations", type=count, default=None, metavar="N",
                        help="iterations of every trial (default: the config's total_steps)")
    parser.add_argument("--iterations-per-dispatch", type=count, default=16, metavar="K",
                        help="iterations per dispatch: trials report and are pruned every K iterations (default 16)")
    parser.add_argument("--quiet", action="store_true", help="print only the table of trials and the best one")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    if algo is not None:
        config_options(parser, algo, values=_value_or_range,
                       description="one value sets the field; LOW..HIGH or log:LOW..HIGH searches it")


def _value_or_range(kind: Any) -> Any:
    def parse(text: str) -> Any:
        return RangeText(text) if ".." in text else kind(text)

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def main(args: argparse.Namespace) -> int:
    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
    fixed = {k: v for k, v in given.items() if not isinstance(v, RangeText)}
    ranges = {k: v.text for k, v in given.items() if isinstance(v, RangeText)}
    out = args.study_dir or os.path.join("studies", os.path.basename(args.algo).replace(":", "_"))
    optuna_module()  # not installed: one line, before anything runs
    check_writable(out, "the study")  # before compiling, which can take a minute
    devices(args.devices)
    enable_compilation_cache()
    algo = algos.make(args.algo, **fixed)
    iterations = run_iterations(algo, args)
    space = _space(args.algo, algo, ranges)
    setup = {"algo": args.algo, "config": config_dict(algo), "space": [r.text() for r in space],
             "fields": [r.field for r in space], "iterations": iterations, "seeds": args.seeds, "metric": args.metric}
    stored = os.path.exists(os.path.join(out, JOURNAL))
    study = _open(args, out, setup) if stored else None  # another setup's, or damaged: refused before compiling
    log = sys.stderr if args.json else sys.stdout
    done = len(finished(study)) if study is not None else 0
    if done >= args.trials:  # --trials is the study's total: nothing to compile
        print(f"the study already has {done} trials (--trials is the total): nothing to run; pass --trials "
              f"{done + args.trials} to run {args.trials} more", file=log)
        return _report(args, out, study, fixed, iterations, TuneResult(study, 0, 0), log)
    slots = min(args.batch, args.trials - done)
    pop = TrialPopulation(algo, space, slots, args.seeds, args.devices, args.iterations_per_dispatch, args.exact,
                          metric=args.metric)  # a metric the algorithm does not report: refused before compiling
    make_folder(out, "the study's folder")
    study = study or _open(args, out, setup)
    if not args.quiet:
        print(f"fragc tune {args.algo}: {args.trials} trials in all ({done} stored, {args.trials - done} to run), "
              f"{slots} at once as one population of {pop.count} members ({len(args.seeds)} seed(s) each), "
              f"{iterations} iterations each; searching {', '.join(f'{r.field} {r.text()}' for r in space)}; "
              f"compiled in {pop.prog.compile_seconds:.1f} s", file=log)
    result = tune(pop, study, space, args.trials, iterations, args.metric, log=None if args.quiet else log)
    return _report(args, out, study, fixed, iterations, result, log)


def _report(args: argparse.Namespace, out: str, study: Any, fixed: dict, iterations: int, result: TuneResult,
            log: Any) -> int:
    """The table of trials, the best one and the command that reruns it, where the study is stored; the JSON
    summary on stdout with --json."""
    print(trials_table(study), file=log)
    top = best(study)
    rerun = None if top is None else rerun_command(args, fixed, top.params, iterations)
    if top is not None:
        print(f"best: trial {top.number}, score {top.value:.2f}: {params_text(top.params)}", file=log)
        more = f" (its score is the mean over --seeds {_seeds_text(args.seeds)}: one run each)" \
            if len(args.seeds) > 1 else ""
        print(f"rerun it: {rerun}{more}", file=log)
    print(f"the study is stored in {os.path.join(out, JOURNAL)}: a rerun with --study-dir {out} continues it",
          file=log)
    if args.json:
        print(json.dumps({**summary(study, result), "rerun": rerun}))
    return 0


def rerun_command(args: argparse.Namespace, fixed: dict, params: dict, iterations: int) -> str:
    """`fragc run ALGO` with the options tune was given one value, a trial's values and its first seed (and
    `--iterations` where tune was given it), in `fragc run`'s own option names."""
    flags = _run_flags(args.algo)
    words = ["fragc", "run", args.algo]
    for field, value in {**fixed, **params}.items():
        flag = flags.get(field, "--" + field.replace("_", "-"))
        text = str(value).lower() if isinstance(value, bool) else value if isinstance(value, str) else repr(value)
        words += [flag, text]
    if args.iterations is not None:
        words += ["--iterations", str(iterations)]
    words += ["--seed", str(args.seeds[0])]
    return shlex.join(words)


def _run_flags(algo: str) -> dict[str, str]:
    """Each config field's option under `fragc run` (`--config-NAME` where it is named like one of run's own)."""
    flags = {}
    for action in own_parser(algo)._actions:
        named = [o for o in action.option_strings if not o.startswith("--no-")]  # not a bool's negation
        if action.dest.startswith("cfg_") and named:
            flags[action.dest[4:]] = named[0]
    return flags


def _seeds_text(seeds: list[int]) -> str:
    return ",".join(str(s) for s in seeds)


def _space(name: str, algo: Any, ranges: dict[str, str]) -> list:
    """The searched fields: the ranges given, else the algorithm's default space; checked against its config."""
    config = algo.config
    for field in ranges:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FragcError(f"tune: {field} is {type(value).__name__}: only numbers can be searched (a "
                             f"{type(value).__name__} picks code, not a value); give it one value")
    space = [parse_range(f, text, integer=_is_int(getattr(config, f))) for f, text in ranges.items()] \
        if ranges else default_space(name, algo)
    check_space(algo, space)
    return space


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _open(args: argparse.Namespace, out: str, setup: dict) -> Any:
    return open_study(out, args.sampler, args.pruner, args.seed, setup)
