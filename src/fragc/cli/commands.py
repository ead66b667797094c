"""`fragc COMMAND ...`: read the command line, run the command, report a user's mistake in one line.

Each command is a module of this package (`COMMANDS`) with `add_options(parser, algo)` and `main(args)`. A
command's module is imported only when that command runs or prints its help (`command_module`): most of them
import JAX, and `fragc --help` and `fragc launch` start without it (about 2 s of each launched process). So do
`startup.py` (what acts before JAX's backend starts: simulated devices, joining a multi-process run) and the
parser of `fragc run`, whose options are a config file's keys under every command.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import gc
import importlib
import sys
from types import ModuleType
from typing import Sequence

from fragc.ir.errors import FragcError
from fragc.runtime.stopping import stop_signals_interrupt

from . import config_file
from .errors import guarded, interrupted, one_line_warnings, usage_error
from .options import EarlyParser, Parser, Unparsed, is_multiprocess


@dataclasses.dataclass(frozen=True)
class Command:
    module: str
    """Its module in this package."""
    help: str
    """Its line in `fragc --help`."""


COMMANDS = {
    "run": Command("run", "train an algorithm and print progress and the final mean return"),
    "ir": Command("ir", "print the traced module, or the module after a pass"),
    "bench": Command("bench", "compare distribution policies on one algorithm configuration"),
    "sweep": Command("sweep", "train a grid of hyperparameters x seeds as one program; report IQM and 95%% CIs"),
    "tune": Command("tune", "search hyperparameters with Optuna, each batch of trials one population program"),
    "policies": Command("lists", "list the built-in distribution policies, one line each"),
    "algos": Command("lists", "list the algorithms, one line each"),
    "envs": Command("lists", "list the environment backends and every backend's ids (fragc envs TEXT filters them)"),
    "launch": Command("launch", "run a command as N local processes of one multi-process run"),
    "plot": Command("plot", "draw the learning curve of a --metrics file to PNG"),
    "video": Command("video", "render the policy of a checkpoint folder to .mp4 or .gif"),
    "export": Command("export", "write a checkpoint's policy as flax msgpack and a config, for fragc.load_policy"),
}
"""Every command: its module and its help line (argparse formats help strings with %: `%%` is a percent sign)."""


def command_module(name: str) -> ModuleType:
    """The module of command `name` (or `startup`), imported now: the one deferred import of the command line
    (the module docstring says why)."""
    module = COMMANDS[name].module if name in COMMANDS else name
    return importlib.import_module(f"{__package__}.{module}")


def build_parser(command: str | None, algo: str | None = None, parser_class: type = Parser) -> argparse.ArgumentParser:
    """The command line: every command with its help line; `command`'s options too (its module imported), with
    the config options of `algo` where it takes an algorithm."""
    parser = parser_class(prog="fragc", description="Compile and run RL training loops as fragmented dataflow graphs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=parser_class)
    for name, spec in COMMANDS.items():
        made = sub.add_parser(name, help=spec.help)
        if name == command:
            command_module(name).add_options(made, algo)
            parser.chosen = made  # type: ignore[attr-defined]
    return parser


def run_parser(algo: str | None) -> argparse.ArgumentParser:
    """`fragc run ALGO`'s own parser: its long options are what a config file may hold under every command."""
    return command_module("run").own_parser(algo)


def command_of(argv: Sequence[str]) -> str | None:
    """The command a command line names (its first word), None if none."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        with stop_signals_interrupt(), one_line_warnings():
            return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt as stop:  # while starting: loading the algorithm imports JAX
        return interrupted(stop)
    except FragcError as err:  # while starting: e.g. a malformed FRAGC_* variable
        return usage_error(err)


def _main(argv: list[str]) -> int:
    command = command_of(argv)
    if command is None and argv and not argv[0].startswith("-"):
        raise unknown_command(argv[0])
    early = first_look(argv)
    if getattr(early, "config", None) and command in config_file.ALGO_COMMANDS:
        config_file.early_devices(early, given(argv, None, EarlyParser))
    if command != "launch" and is_multiprocess(early):
        return guarded(_one_of_several, early, argv)
    if getattr(early, "devices", None):
        command_module("startup").simulate_devices_early(early.devices)
    try:
        args = parse(argv, getattr(early, "algo", None))
    except FragcError as err:
        return usage_error(err)
    args.command_line = argv
    return guarded(command_module(args.command).main, args)


def _one_of_several(early: argparse.Namespace, argv: list[str]) -> int:
    """`run` or `bench` as one process of a multi-process run: join first (importing the algorithm may start
    JAX's backend), then parse, check that every process was given the same options, run, leave."""
    startup = command_module("startup")
    startup.join(early)
    args = parse(argv, early.algo)
    startup.check_same_options(args)
    args.command_line = argv
    return startup.run_and_leave(command_module(args.command).main, args)


def unknown_command(name: str) -> FragcError:
    close = difflib.get_close_matches(name, list(COMMANDS), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return FragcError(f"unknown command '{name}'{hint}; the commands are {', '.join(COMMANDS)} (see fragc --help)")


def first_look(argv: list[str]) -> argparse.Namespace:
    """The command line read without the algorithm's options (which depend on the algorithm): the algorithm to
    load, and what must act before JAX starts: `--devices` and the process options. Where a value does not
    parse (`--env-workers abc`), the algorithm alone, so that the full parse knows its options and names that
    value (without them `--env` reads as an abbreviation of `--env-groups`); empty if even that fails."""
    argv = [a for a in argv if a not in ("-h", "--help")]
    parser = build_parser(command_of(argv), None, EarlyParser)
    try:
        return parser.parse_known_args(argv)[0]
    except Unparsed:
        pass
    for action in getattr(parser, "chosen", parser)._actions:
        action.type = None  # every value read as text: only the algorithm is kept
    try:
        known = parser.parse_known_args(argv)[0]
    except Unparsed:
        return argparse.Namespace()
    return argparse.Namespace(algo=known.algo) if getattr(known, "algo", None) else argparse.Namespace()


def given(argv: list[str], algo: str | None, parser_class: type = Parser) -> set[str]:
    """The destinations of the options given on the command line (not left to their defaults)."""
    parser = build_parser(command_of(argv), algo, parser_class)
    for action in getattr(parser, "chosen", parser)._actions:
        if action.option_strings:
            action.default = argparse.SUPPRESS
    try:
        seen, _ = parser.parse_known_args([a for a in argv if a not in ("-h", "--help")])
    except Unparsed:
        return set()
    return set(vars(seen))


def parse(argv: list[str], algo: str | None) -> argparse.Namespace:
    """The whole command line, with the options of `algo` (whose module this imports), and those of its
    `--config` file that the command line does not give."""
    parser = build_parser(command_of(argv), algo)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise unknown_arguments(args, unknown, getattr(parser, "chosen", parser), argv)
    if getattr(args, "config", None):
        config_file.apply(args, given(argv, args.algo), run_parser(args.algo))
    return args


def unknown_arguments(args: argparse.Namespace, unknown: list[str], parser: argparse.ArgumentParser,
                      argv: list[str]) -> FragcError:
    """One line naming the arguments no option takes, each unknown option with the closest known one, a value
    given to a bool's `--no-` form with the form that takes one."""
    options = [u for u in unknown if u.startswith("-")]
    for value in unknown:
        before = argv[argv.index(value) - 1] if argv.index(value) > 0 else ""
        negates = getattr(parser._option_string_actions.get(before), "negates", None)  # options.boolean_option's
        if negates:
            return FragcError(f"{before} takes no value, got {value} ({negates} {value} sets one)")
    named = ", ".join(option + did_you_mean(option, parser) for option in options)
    if options and getattr(args, "algo", None):
        return FragcError(f"{args.algo} has no option {named} (see fragc {args.command} {args.algo} --help)")
    if options:
        return FragcError(f"fragc {args.command} has no option {named} (see fragc {args.command} --help)")
    return FragcError(f"unrecognized arguments: {' '.join(unknown)} (see fragc --help)")


def did_you_mean(option: str, parser: argparse.ArgumentParser) -> str:
    """` (did you mean --lr?)` for `--lrr`, by `difflib` over the parser's long options; nothing if none is close."""
    known = [o for o in parser._option_string_actions if o.startswith("--") and o != "--help"]
    close = difflib.get_close_matches(option.split("=", 1)[0], known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def console_main() -> int:
    """The `fragc` command: `main`, then a process that ends quickly. Python's shutdown collects the garbage
    among every object the run made (JAX's traces and caches): 0.8-1.0 s after a small `fragc run` here, against
    0.2 s with those objects frozen first, which the collector skips. Exit hooks (a tracker's last upload) still
    run; only cyclic garbage left at exit goes uncollected, as it may in any Python process."""
    code = main()
    gc.freeze()
    return code
