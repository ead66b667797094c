"""`--config FILE`, `fragc run --print-config` and the run records, on the command line's side: which keys a file
may hold (the long options of `fragc run ALGO`), where each goes under each command, and the resolved
configuration as a file. Reading, checking and writing files is src/fragc/config_files.py's."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from fragc import algos, config_files
from fragc.ir.errors import FragcError
from fragc.runtime.actions import steps_per_iteration

from .options import boolean, config_fields, count, groups, integer, mebibytes, seconds, seed

ALGO_COMMANDS = ("run", "ir", "bench")
"""The commands that read a config file."""

COMMAND_LINE_ONLY = ("resume", "stop_after", "quiet", "json", "no_cache", "config", "print_config", "coordinator",
                     "num_processes", "process_id", "help")
"""Options of `fragc run` a config file does not hold: they say what this invocation does, not which run it is."""

PLACEMENT = ("policy", "devices", "env_groups", "env_workers", "env_fleet")
"""The run options that `fragc ir` and `fragc bench` take from a config file too (where they have them)."""

RUN_LENGTH = ("iterations", "total_steps", "cfg_total_steps")
"""The options that set the run length: one of them on the command line overrides the file's."""

RUN_OPTIONS_SHOWN = ("policy", "devices", "env_groups", "env_workers", "seed", "iterations_per_dispatch",
                     "iterations", "total_steps", "checkpoint_dir", "checkpoint_every", "metrics")
"""The run options a printed config holds, in this order (after them, the algorithm's config)."""

KINDS = {boolean: "bool", integer: "int", count: "int", groups: "int", seed: "int", int: "int", float: "float",
         seconds: "float", mebibytes: "float", str: "str", None: "str"}
"""What a config file's value must be, by the option's type."""


def file_keys(run_parser: argparse.ArgumentParser, algo: str | None) -> dict[str, config_files.Key]:
    """The keys a config file may hold: each long option of `fragc run ALGO` as a `config_files.Key`."""
    types = {}
    if algo is not None:
        config_cls = algos.load(algo)[1]
        types = {f"cfg_{f.name}": str(f.type) for f in dataclasses.fields(config_cls)} if config_cls else {}
        if "cfg_iterations" in types:
            types["iterations"] = types["cfg_iterations"]
    keys = {}
    for action in run_parser._actions:  # argparse's list of the parser's options
        long = [o for o in action.option_strings if o.startswith("--")]
        if not long or action.dest in COMMAND_LINE_ONLY:
            continue
        name = config_files.normalized(long[0][2:])
        kind = KINDS.get(action.type, "any")
        if kind == "str" and action.nargs == 0:  # a flag (store_true): none are keys
            continue
        keys[name] = config_files.Key(name, action.dest, kind, action.type if kind in ("int", "float") else None,
                                      tuples="tuple" in types.get(action.dest, "").lower())
    return keys


def apply(args: argparse.Namespace, given: set[str], run_parser: argparse.ArgumentParser) -> None:
    """The options of `--config FILE` the command line does not give (`given`), set on `args`. Keys are the
    options of `fragc run ALGO` (the file is a run's); `ir` and `bench` take the config fields and the placement."""
    path = args.config
    table = config_files.read(path)
    if config_files.RECORD_TABLE in table:
        config_files.check_record(path, table.pop(config_files.RECORD_TABLE), args.algo)
    keys = file_keys(run_parser, args.algo)
    length_given = any(dest in given for dest in RUN_LENGTH)
    seen: dict[str, str] = {}
    for key, value in table.items():
        name = config_files.normalized(key)
        spec = keys.get(name)
        if spec is None:
            if name in COMMAND_LINE_ONLY:
                raise FragcError(f"{path}: '{key}' is an option of the command line only "
                                 f"(--{name.replace('_', '-')}), not a config file's")
            raise config_files.unknown_key(path, key, list(keys), f"the fields of {args.algo}'s config and fragc "
                                           f"run's options (fragc run {args.algo} --help)")
        if name in seen:
            raise FragcError(f"{path}: '{seen[name]}' and '{key}' are the same key")
        seen[name] = key
        value = config_files.value_of(path, key, spec, value)
        dest = dest_in(args, spec.dest)
        if dest is None or dest in given or (length_given and spec.dest in RUN_LENGTH):
            continue
        setattr(args, dest, value)


def dest_in(args: argparse.Namespace, dest: str) -> str | None:
    """Where a `fragc run` option's value goes in `args` of another command (None: it has no such option)."""
    if args.command == "run":
        return dest
    if dest == "iterations":  # fragc run's --iterations of a config with an iterations field is that field
        dest = "cfg_iterations"
    if dest.startswith("cfg_") or dest in PLACEMENT:
        return dest if hasattr(args, dest) else None
    return None


def early_devices(early: argparse.Namespace, given: set[str]) -> None:
    """`devices` from the config file, for what acts before JAX starts (simulated devices, joining a
    multi-process run); the whole file is read again once the algorithm's options are known."""
    path = early.config
    table = config_files.read(path)
    found = [(k, v) for k, v in table.items() if config_files.normalized(k) == "devices"]
    if found and "devices" not in given:
        key, value = found[0]
        early.devices = config_files.value_of(path, key, config_files.Key("devices", "devices", "int", count), value)


def config_format(args: argparse.Namespace) -> str:
    """The format the run's records are written in: its --config file's, else TOML."""
    return config_files.format_of(args.config) if getattr(args, "config", None) else "toml"


def config_text(args: argparse.Namespace, algo: Any, run_parser: argparse.ArgumentParser,
                record: dict | None = None) -> str:
    """The resolved configuration as a config file: `fragc run ALGO --config FILE` runs it again."""
    fields = config_fields(args.algo)
    config = getattr(algo, "config", None)
    run = {name: getattr(args, name, None) for name in RUN_OPTIONS_SHOWN}
    if "iterations" in fields or ("total_steps" in fields and steps_per_iteration(algo)):
        run["iterations"] = None  # --iterations went into the config
    keys = {spec.dest: spec.name for spec in file_keys(run_parser, args.algo).values()}
    sections = [(f"fragc run {args.algo}: the resolved configuration; fragc run {args.algo} --config FILE runs it "
                 "again\n(options given on the command line override the file's)", run)]
    if fields and config is not None:
        values, unwritable = {}, []
        for name in fields:
            value = getattr(config, name, None)
            key = "iterations" if name == "iterations" else keys.get(f"cfg_{name}", name)
            if plain(value):
                values[key] = value
            else:
                unwritable.append(name)
        cls = type(config)
        comment = f"{args.algo}'s config ({cls.__module__}.{cls.__qualname__})"
        if unwritable:
            comment += f"\nnot written (not a plain value; the default is used): {', '.join(unwritable)}"
        sections.append((comment, values))
    return config_files.dumps(config_format(args), sections, record)


def plain(value: Any) -> bool:
    """Whether a config file can hold `value` as it is."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v) for k, v in value.items())
    return False


def write_run_records(args: argparse.Namespace, algo: Any, run_parser: argparse.ArgumentParser) -> None:
    """The resolved config with where it came from (fragc's version, the command, the git revision of the
    algorithm's file): `run.toml` in the checkpoint folder, `NAME.run.toml` beside a metrics file `NAME.jsonl`
    (`.yaml` for a YAML --config); either runs again with --config."""
    fmt = config_format(args)
    paths = []  # (where, the metrics file it is beside)
    if args.checkpoint_dir:
        paths.append((os.path.join(args.checkpoint_dir, f"run.{fmt}"), None))
    if args.metrics and (beside := config_files.beside_metrics(args.metrics, fmt)):
        paths.append((beside, args.metrics))
    if not paths:
        return
    text = config_text(args, algo, run_parser, config_files.record(args.algo, type(algo),
                                                                   getattr(args, "command_line", None)))
    for path, metrics in paths:
        config_files.write(path, text, beside=metrics)
