"""Config files: `fragc run ALGO --config FILE` (TOML, or YAML with PyYAML), `--print-config`, and the
record of a run written beside its checkpoints and metrics.

A config file is flat: each key is a long option of `fragc run ALGO` without its dashes (`lr`,
`ent_coef` or `ent-coef`, `seed`, `policy`, `checkpoint_dir`), its value typed as TOML or YAML types
it. `fragc ir` and `fragc bench` read the same file and take what concerns them: the algorithm's config
and the placement (`policy`, `devices`, `env_groups`, `env_workers`). Options given on the command line
override the file. A table `[fragc]` (`fragc:` in YAML) is the record of where the file came from
(written by `fragc run`, see `record`); reading it checks that it names the same algorithm.

This module reads, checks and writes files; which keys exist and what they mean is the command line's
(src/fragc/cli/config_file.py), which passes each key's `Key`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import json
import math
import os
import re
import shlex
import subprocess
import tomllib
from importlib import metadata
from typing import Any, Callable

from fragc import __version__
from fragc.ir.errors import FragcError

FORMATS = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}
RECORD_TABLE = "fragc"
"""The table of a written config that records the run's provenance (algorithm, fragc version, git revision)."""


def format_of(path: str) -> str:
    """"toml" or "yaml", from the file's suffix."""
    fmt = FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise FragcError(f"--config {path}: expected a .toml, .yaml or .yml file")
    return fmt


def read(path: str) -> dict[str, Any]:
    """The file's top-level table, as TOML or YAML reads it."""
    fmt = format_of(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise FragcError(f"cannot read the config file '{path}': {err.strerror}") from None
    if fmt == "toml":
        try:
            table = tomllib.loads(data.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise FragcError(f"{path} is not valid TOML: {_one_line(err)}") from None
    else:
        yaml = _yaml()
        try:
            table = yaml.safe_load(data)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise FragcError(f"{path} is not valid YAML: {getattr(err, 'problem', None) or _one_line(err)}"
                             f"{where}") from None
        table = {} if table is None else table
    if not isinstance(table, dict):
        raise FragcError(f"{path}: expected a table of keys and values, got a {type(table).__name__}")
    return table


def _yaml() -> Any:
    """PyYAML, an optional extra: imported when a YAML file is read or written, refused in one line if missing."""
    try:
        import yaml
    except ImportError:
        raise FragcError("YAML config files need PyYAML: pip install pyyaml (or write the file as .toml)") from None
    return yaml


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return " ".join(text.split()) if text else type(err).__name__


# ------------------------------------------------------------------ keys and values


@dataclasses.dataclass(frozen=True)
class Key:
    """One key a config file may hold: the option it stands for and how its value is checked."""

    name: str
    """The key as printed: the option without its dashes, `_` between words (`ent_coef`)."""
    dest: str
    """The option's destination in the parsed command line."""
    kind: str
    """"bool", "int", "float", "str" or "any" (a Python literal on the command line)."""
    check: Callable[[str], Any] | None = None
    """The option's own parser (its range check), applied to the value's text; None: none."""
    tuples: bool = False
    """Lists become tuples (a field typed as a tuple: TOML and YAML have lists only)."""


def normalized(key: str) -> str:
    return key.replace("-", "_")


def unknown_key(path: str, key: str, known: list[str], what: str) -> FragcError:
    close = difflib.get_close_matches(normalized(key), known, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return FragcError(f"{path}: unknown key '{key}'{hint}; the keys are {what}")


YAML_1_1_STRING_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
"""A number in exponent notation without a dot (`1e-3`, `5e5`): YAML 1.2 and TOML read it as a number,
PyYAML (YAML 1.1) as a string."""


def value_of(path: str, key: str, spec: Key, value: Any) -> Any:
    """`value` checked against the key's type (and the option's range), as the command line would have it. A
    number key's YAML value that PyYAML read as a string only for want of a dot (`lr: 1e-3`) is the number."""
    kind = spec.kind
    if (kind in ("int", "float") and isinstance(value, str) and YAML_1_1_STRING_NUMBER.fullmatch(value)
            and format_of(path) == "yaml"):
        value = float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise _wrong(path, key, "true or false", value)
        return value
    if kind == "int":
        if isinstance(value, float) and value.is_integer():  # 5e5
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise _wrong(path, key, "a whole number", value)
    elif kind == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise _wrong(path, key, "a number", value)
        value = float(value)
    elif kind == "str":
        if not isinstance(value, str):
            raise _wrong(path, key, "a string", value)
    elif spec.tuples:
        value = _tuples(value)
    if spec.check is not None and kind in ("int", "float"):
        try:
            spec.check(repr(value))
        except (argparse.ArgumentTypeError, ValueError) as err:
            raise FragcError(f"{path}: {key}: {err}") from None
    return value


def _wrong(path: str, key: str, expected: str, value: Any) -> FragcError:
    shown = json.dumps(value) if isinstance(value, (str, bool)) or value is None else repr(value)
    return FragcError(f"{path}: {key} must be {expected}, got {shown} ({_type_name(value)})")


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table", type(None): "null"}.get(type(value), type(value).__name__)


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def check_record(path: str, record: Any, algo: str) -> None:
    """A written config's record table must name the algorithm the command line names (its class; the file's
    path may be written otherwise)."""
    if not isinstance(record, dict):
        raise FragcError(f"{path}: '{RECORD_TABLE}' must be a table (the record of the run that wrote the file)")
    theirs = record.get("algo")
    if isinstance(theirs, str) and _algo_name(theirs) != _algo_name(algo):
        raise FragcError(f"{path} was written for the algorithm {theirs}, not {algo} (remove its [{RECORD_TABLE}] "
                         "table to use it anyway)")


def _algo_name(spec: str) -> str:
    return spec.rpartition(":")[2]


# ------------------------------------------------------------------ writing


def dumps(fmt: str, sections: list[tuple[str, dict[str, Any]]], record: dict[str, Any] | None = None) -> str:
    """A config file: each section a comment line and its keys (None values left out: the default is the same
    run), then the record table if any."""
    chunks = []
    for comment, values in sections:
        values = {k: v for k, v in values.items() if v is not None}
        lines = [f"# {line}" for line in comment.splitlines()]
        if values:
            lines.append(_toml_keys(values) if fmt == "toml" else _yaml_keys(values))
        chunks.append("\n".join(lines))
    if record:
        if fmt == "toml":
            body = _toml_keys({k: v for k, v in record.items() if v is not None})
            chunks.append(f"[{RECORD_TABLE}]  # where this run came from; not options\n{body}")
        else:
            chunks.append("# where this run came from; not options\n" + _yaml_keys({RECORD_TABLE: record}))
    return "\n\n".join(chunks) + "\n"


def _toml_keys(values: dict[str, Any]) -> str:
    return "\n".join(f"{_toml_key(k)} = {_toml_value(k, v)}" for k, v in values.items())


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(key, v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(str(k))} = {_toml_value(key, v)}" for k, v in value.items()) + " }"
    raise FragcError(f"{key}: {value!r} cannot be written as TOML (write the config as .yaml)")


def _yaml_keys(values: dict[str, Any]) -> str:
    yaml = _yaml()
    return yaml.safe_dump(_lists(values), sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip("\n")


def _lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


def write(path: str, text: str, beside: str | None = None) -> None:
    """Write `text` to `path` whole (a temporary file renamed), or refuse in one line (naming the metrics file
    `beside` which it goes, whose folder it shares)."""
    partial = f"{path}.{os.getpid()}.tmp"
    try:
        with open(partial, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(partial, path)
    except OSError as err:
        what = f"metrics to '{beside}' (nor the run's config beside them, '{path}')" if beside else \
            f"the run's config to '{path}'"
        raise FragcError(f"cannot write {what}: {err.strerror}") from None


def beside_metrics(metrics: str, fmt: str) -> str | None:
    """Where the record beside a metrics file goes: `metrics.jsonl` -> `metrics.run.toml`; None for a metrics
    path that is not a plain file (/dev/stdout, a pipe)."""
    if os.path.exists(metrics) and not os.path.isfile(metrics):
        return None
    stem, ext = os.path.splitext(metrics)
    return f"{stem if ext else metrics}.run.{fmt}"


# ------------------------------------------------------------------ provenance


def record(algo_spec: str, algo_cls: type, command: list[str] | None) -> dict[str, Any]:
    """Where a run came from: the algorithm as given, fragc's version, the command line, and the git revision
    of the algorithm's source file (None outside a git checkout, or without git) with `git_dirty` when the
    file differs from that revision."""
    source = _source_file(algo_cls)
    revision, dirty = git_revision(source) if source else (None, None)
    return {"algo": algo_spec, "fragc_version": fragc_version(),
            "command": None if command is None else " ".join(["fragc", *map(_quoted, command)]),
            "source": source, "git_revision": revision, "git_dirty": dirty}


def fragc_version() -> str:
    try:
        return metadata.version("fragc")
    except metadata.PackageNotFoundError:
        return __version__


def _source_file(cls: type) -> str | None:
    try:
        path = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None
    return os.path.abspath(path) if path else None


def git_revision(path: str) -> tuple[str | None, bool | None]:
    """(HEAD's revision, whether `path` differs from it) of the git checkout holding `path`; (None, None)
    outside one, or where git is missing or fails."""
    folder = os.path.dirname(path)
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}  # never take the index lock

    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", folder, *argv], capture_output=True, text=True, timeout=10, env=env)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if not head or not head.strip():
        return None, None
    status = git("status", "--porcelain", "--", os.path.basename(path))
    return head.strip(), None if status is None else bool(status.strip())


def _quoted(arg: str) -> str:
    return shlex.quote(arg)
