"""The options several commands share: the parsers, option types (a usage error is one line), the algorithm and
its config's fields, the placement, the search's options and the process options. No JAX here: `fragc --help`
and `fragc launch` read this module."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import os
import re
import types
from typing import Any, Mapping

from fragc import algos
from fragc.ir.errors import FragcError
from fragc.launch import ENV_COORDINATOR, ENV_JOIN_TIMEOUT_S, ENV_NUM_PROCESSES, ENV_PROCESS_ID
from fragc.runtime.seeds import MAX_SEED, check_seed


NUMBER_LIKE = re.compile(r"^-\.?\d")
"""What argparse takes for a value, not an option, though it starts with `-`: `-1`, `-1e-3`, `-.5`, and a sweep's
`-1,1e-4` (argparse's own pattern takes only `-1` and `-0.5`). No fragc option starts with a digit."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`fragc run: error: ...`) and exit code 2, a negative number in any
    notation is a value (`NUMBER_LIKE`), and the help shows each option's type and default (`HelpFormatter`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"formatter_class": HelpFormatter, **kwargs})
        self._negative_number_matcher = NUMBER_LIKE  # argparse's hook for what reads as a negative number

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Unparsed(Exception):
    """A command line that `EarlyParser` could not read (the full parse says why)."""


class EarlyParser(Parser):
    """For a first look at the command line: a usage error raises `Unparsed` and prints nothing.
    No abbreviations: without the algorithm's options, `--env` would read as `--env-groups`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "allow_abbrev": False})

    def error(self, message: str) -> None:  # type: ignore[override]
        raise Unparsed(message)


# ------------------------------------------------------------------ option types


def whole_number(text: str, least: int) -> int:
    try:
        value = int(float(text))  # accepts 5e5
    except (OverflowError, ValueError):  # inf, nan, abc
        expected = "a positive whole number" if least == 1 else f"a whole number from {least}"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {'positive' if least == 1 else f'{least} or more'}, got {text}")
    return value


def count(text: str) -> int:
    """A positive whole number."""
    return whole_number(text, 1)


def groups(text: str) -> int:
    """A whole number from 0."""
    return whole_number(text, 0)


def seed(text: str) -> int:
    try:
        return check_seed(int(text))
    except (ValueError, FragcError):
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {MAX_SEED}, got {text}") from None


def integer(text: str) -> int:
    """An int field's value: 5e5 is 500000, 2.5 is refused."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)  # accepts 5e5
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected an integer, got {text}")
    return int(value)


def boolean(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text}")


def literal(text: str) -> Any:
    """A field of another type: a Python literal (a tuple, a dict, None)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"expected a Python literal, got {text}") from None


def _positive(text: str, unit: str) -> float:
    """A positive, finite number of `unit` from the command line, or argparse's one-line error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of {unit}, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of {unit}, got {text!r}")
    return value


def seconds(text: str) -> float:
    return _positive(text, "seconds")


def mebibytes(text: str) -> float:
    return _positive(text, "MiB")


# ------------------------------------------------------------------ the help


TYPE_NAMES = {boolean: "BOOL", integer: "INT", count: "INT", groups: "INT", seed: "INT", int: "INT", float: "FLOAT",
              seconds: "FLOAT", mebibytes: "FLOAT", str: "STR", literal: "LITERAL"}
"""How `--help` names what an option takes, by its type (an option with a metavar of its own keeps it)."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help with each option's type (`--devices INT`) and default (`(default 16)`, where the help does
    not say it already), and a bool option's `--no-` form beside it (`--anneal-lr [BOOL], --no-anneal-lr`)."""

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        return TYPE_NAMES.get(action.type, action.dest.upper()) if action.type is not None else action.dest.upper()

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        default = action.default
        if (action.nargs == 0 or not action.option_strings or default is None or default is argparse.SUPPRESS
                or "default" in help.lower()):
            return help
        return f"{help} (default {escaped(shown(default))})".strip()

    def _format_action_invocation(self, action: argparse.Action) -> str:
        invocation = super()._format_action_invocation(action)
        negation = getattr(action, "negation", None)
        return f"{invocation}, {negation}" if negation else invocation


# ------------------------------------------------------------------ the algorithm and its config


def algo_argument(parser: argparse.ArgumentParser) -> None:
    """The ALGO argument; the options of that algorithm's config come last (`config_options`)."""
    parser.add_argument("algo", metavar="ALGO", help="a built-in algorithm (fragc algos), or your own class as "
                        "path/to/file.py:Class or package.module:Class; its config's fields are options, "
                        f"listed by {parser.prog} ALGO --help")


def config_file_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="read options from a TOML or YAML file: the algorithm's config fields and fragc run's "
                             "options, by name (lr, ent_coef, seed, policy, ...; fragc ir and bench take the config "
                             "and the placement); options on the command line override it")


def config_options(parser: argparse.ArgumentParser, algo: str, values: Any = None,
                   description: str = "the algorithm's default where not given") -> None:
    """The fields of `algo`'s config as `--field-name` options, their docstrings, types and defaults as help;
    `values(kind)`, if given, makes the parser of an option's text from the field's own (`fragc sweep`: a
    comma-separated list). A bool field is also `--field-name` alone (true) and `--no-field-name` (false).

    Added after the command's own options: a field named like one of them (`iterations` beside
    `fragc bench --iterations`) becomes `--config-field-name`, and its help says why."""
    config_cls = algos.load(algo)[1]
    if config_cls is None:
        return
    docs: dict[str, str] = {}
    for cls in reversed(config_cls.__mro__):  # a field's most derived docstring wins
        docs.update(field_docs(cls))
    group = parser.add_argument_group(f"options of {algo}",
                                      f"fields of {config_cls.__module__}.{config_cls.__qualname__}; {description}")
    own = set(parser._option_string_actions)  # argparse's table of the option strings taken so far
    fields = sorted(dataclasses.fields(config_cls), key=lambda f: field_rank(config_cls, f.name))
    for field in fields:
        if not field.init:
            continue
        if field.name == "iterations" and parser.prog == "fragc run":
            continue  # fragc run's own --iterations (the run length) sets this field (algorithm.make_algo)
        kind, what = option_type(field)
        flag = "--" + field.name.replace("_", "-")
        if flag in own:
            what += f" (config field {field.name}: {flag} is {parser.prog}'s own option)"
            flag = "--config-" + flag[2:]
        default = default_of(field)
        if field.name in algos.ATARI_DEFAULTS.get(algo, {}):  # a built-in's default on an EnvPool Atari game
            default = f"{default[:-1]}; on an envpool: Atari game {shown(algos.ATARI_DEFAULTS[algo][field.name])})"
        help = escaped(" ".join(filter(None, [docs.get(field.name, "") + what, default])))
        parse = values(kind) if values else kind
        options = dict(dest=f"cfg_{field.name}", type=parse, default=None, metavar=TYPE_NAMES.get(kind, "VALUE"),
                       help=help.strip())
        if kind is boolean:
            boolean_option(group, parser, flag, parse, **options)
        else:
            group.add_argument(flag, **options)


def boolean_option(group: Any, parser: argparse.ArgumentParser, flag: str, parse: Any, **options: Any) -> None:
    """`--flag` alone (true), `--flag VALUE` (parsed by `parse`: true/false, or a sweep's list) and `--no-flag`
    (false; left out where another option has that name). `--no-flag` has no line of its own in the help:
    `HelpFormatter` shows it beside `--flag`."""
    action = group.add_argument(flag, nargs="?", const=parse("true"), **options)
    negated = "--no-" + flag[2:]
    if negated not in parser._option_string_actions:
        negation = group.add_argument(negated, dest=options["dest"], action="store_const", const=parse("false"),
                                      default=None, help=argparse.SUPPRESS)
        action.negation, negation.negates = negated, flag  # type: ignore[attr-defined]


def default_of(field: dataclasses.Field) -> str:
    """`(default 0.00025)`, as the command line spells the value (`true`, not True); nothing for a field
    without a default or whose default is None."""
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return ""
    return "" if value is None else f"(default {shown(value)})"


def shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def escaped(text: str) -> str:
    """A help text with its `%` doubled: argparse formats help strings with %."""
    return text.replace("%", "%%")


def option_type(field: dataclasses.Field) -> tuple[Any, str]:
    """How an option's text becomes the field's value, and what to add to its help."""
    name = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    simple = {"bool": boolean, "int": integer, "float": float, "str": str}
    if name in simple:
        return simple[name], ""
    if name.replace(" ", "") in ("str|None", "Optional[str]", "None|str"):
        return str, ""
    return literal, f" (a Python literal, type {name})"


def field_rank(config_cls: type, name: str) -> int:
    """Where a config's field comes in its options: a user's own fields first (declared outside fragc: a subclass of a
    built-in's config), then the algorithm's, then the evaluation fields every built-in takes; the dataclass's order
    within each."""
    owner = next(c for c in config_cls.__mro__ if name in vars(c).get("__annotations__", {}))
    if not owner.__module__.startswith("fragc."):
        return 0
    return 2 if owner.__module__ == "fragc.algos.evaluation" else 1


@functools.lru_cache(maxsize=64)
def field_docs(cls: type) -> Mapping[str, str]:
    """The string literal under each field of a dataclass, as CleanRL writes its Args (kept per class, read-only:
    finding a class's source parses its whole module, on every parser built in one process otherwise)."""
    try:
        body = ast.parse(inspect.getsource(cls)).body[0].body
    except (OSError, TypeError, IndexError, SyntaxError):
        return types.MappingProxyType({})
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return types.MappingProxyType(docs)


def config_fields(spec: str) -> list[str]:
    """The names of the init fields of `spec`'s config (none without one)."""
    config_cls = algos.load(spec)[1]
    return [f.name for f in dataclasses.fields(config_cls) if f.init] if config_cls else []


# ------------------------------------------------------------------ placement, search, processes


def placement_options(parser: argparse.ArgumentParser, group: Any = None) -> None:
    """ALGO, --config and where it runs (in `group`, an argument group of `parser`, where given): `fragc run` and
    `fragc ir`."""
    algo_argument(parser)
    config_file_option(parser)
    parser = group if group is not None else parser
    parser.add_argument("--policy", default="single", help="distribution policy (default single)")
    parser.add_argument("--devices", type=count, default=None, help="devices to use; simulated on CPU if needed")
    parser.add_argument("--env-groups", type=groups, default=None, metavar="G",
                        help="host environments: split each replica's environments into G groups whose inference "
                        "overlaps the host stepping of the others (default 1; 0: step them in the compiled program)")
    parser.add_argument("--env-workers", type=groups, default=None, metavar="W",
                        help="host environments: workers of each environment pool (EnvPool's threads; default 0: "
                        "the backend's own choice)")
    parser.add_argument("--env-fleet", default=None, metavar="ray:N[xE]",
                        help="host environments: step them on N remote environment workers (Ray actors) of E "
                        "environments each, the environment groups as whole workers; ',cpus=C' and "
                        "',resource=NAME' ask Ray for those per worker (docs/distributed.md; pip install "
                        "'fragc[ray]'). With xE and no --num-envs, num_envs is N*E")


def search_options(parser: argparse.ArgumentParser, explain: bool = True) -> None:
    """The options of the placement search (`--policy auto`, docs/auto.md)."""
    if explain:
        parser.add_argument("--explain", action="store_true",
                            help="with --policy auto: print the search's whole table (candidate, predicted and "
                                 "measured time per iteration, why pruned)")
    parser.add_argument("--auto-budget", type=seconds, default=None, metavar="SECONDS",  # None: SearchOptions'
                        help="with --policy auto: seconds the search may take (default 60)")
    parser.add_argument("--auto-top", type=count, default=None, metavar="N",
                        help="with --policy auto: time the N best predicted candidates (default 3)")
    parser.add_argument("--memory-limit", type=mebibytes, default=None, metavar="MIB",
                        help="with --policy auto: MiB per device a candidate may use (default: the device's own "
                             "limit where it reports one, none on CPU)")
    parser.add_argument("--no-auto-cache", action="store_true",
                        help="with --policy auto: search again, ignoring the decision cached on disk")


def algorithm_options_first(parser: argparse.ArgumentParser) -> None:
    """List the algorithm's options (`config_options`' group) first in --help, before the command's own groups:
    what a user tunes before where and how it runs. (argparse prints groups in its list's order.)"""
    groups = parser._action_groups
    mine = [g for g in groups if (g.title or "").startswith("options of ")]
    for group in mine:
        groups.remove(group)
        groups.insert(1, group)  # after the positional arguments


def process_options(parser: argparse.ArgumentParser) -> None:
    """Joining a multi-process run; `fragc launch` sets the defaults through the environment."""
    parser.add_argument("--coordinator", default=os.environ.get(ENV_COORDINATOR), metavar="HOST:PORT",
                        help="address of process 0 in a multi-process run (jax.distributed); with --num-processes "
                             "and --process-id, --devices counts this process's devices")
    parser.add_argument("--num-processes", type=count, default=env_int(ENV_NUM_PROCESSES), metavar="N",
                        help="processes in the run (default: what jax.distributed detects when --coordinator is "
                             "'auto', else 1)")
    parser.add_argument("--process-id", type=int, default=env_int(ENV_PROCESS_ID), metavar="I",
                        help="this process's index, 0 to N-1")
    parser.add_argument("--join-timeout", type=count, default=env_int(ENV_JOIN_TIMEOUT_S) or 60, metavar="S",
                        help="seconds to wait for every process to join before stopping with one line naming who "
                             f"did not (default 60, or ${ENV_JOIN_TIMEOUT_S})")


def env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    if not value.strip().isdigit():
        raise FragcError(f"{name}={value!r} in the environment: expected a whole number from 0")
    return int(value)


def is_multiprocess(args: argparse.Namespace) -> bool:
    """Whether any of the process options was given (then all are needed: cli/startup.py)."""
    return bool(getattr(args, "coordinator", None)) or (getattr(args, "num_processes", None) or 1) > 1 or (
        getattr(args, "process_id", None) is not None)


def flag(dest: str) -> str:
    """The option of an argparse destination (`cfg_lr` is `--lr`)."""
    return "--" + (dest[4:] if dest.startswith("cfg_") else dest).replace("_", "-")
