"""fragc.algos: RL algorithms written against fragc's public API, one file each, and how the CLI finds an algorithm:
a built-in name, or a user's class given as `path/to/file.py:Class` or `package.module:Class`.

An algorithm class takes its config, a dataclass, as the one argument of its constructor. The config class is the
algorithm's `Config` attribute if it has one, else the annotation of the first parameter of `__init__`
(`def __init__(self, config: MyConfig)`); a class whose constructor takes no argument has no config.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
import typing
from typing import Any

from fragc.ir.errors import FragcError

ALGOS = {
    "ppo": ("fragc.algos.ppo:PPO", "PPO, discrete actions (PureJaxRL's CartPole configuration)"),
    "a2c": ("fragc.algos.a2c:A2C", "synchronous advantage actor-critic, discrete actions"),
    "ppo_continuous": ("fragc.algos.ppo_continuous:PPOContinuous",
                       "PPO with a Gaussian policy for continuous actions (Pendulum-v1)"),
    "dqn": ("fragc.algos.dqn:DQN", "DQN with a target network and an on-device replay-buffer fragment"),
    "sac": ("fragc.algos.sac:SAC", "soft actor-critic: twin Q networks, automatic entropy temperature, a replay buffer "
                                   "(Pendulum-v1)"),
    "pqn": ("fragc.algos.pqn:PQN", "PQN: Q(lambda) with a LayerNorm Q network, no replay buffer, no target network"),
    "ppo_rnn": ("fragc.algos.ppo_rnn:PPORNN", "recurrent PPO: a GRU policy, hidden state reset at episode ends"),
    "impala": ("fragc.algos.impala:IMPALA", "actor-critic with V-trace off-policy correction"),
    "ippo": ("fragc.algos.ippo:IPPO", "independent PPO on JaxMARL's multi-agent environments (jaxmarl:MPE_*, SMAX_*), "
                                      "shared or per-agent parameters"),
    "mappo": ("fragc.algos.mappo:MAPPO", "multi-agent PPO: IPPO with a centralised critic over the world state"),
    "ippo_rnn": ("fragc.algos.ippo_rnn:IPPORNN", "recurrent IPPO (a GRU per agent), JaxMARL's ippo_rnn baselines"),
    "mappo_rnn": ("fragc.algos.mappo_rnn:MAPPORNN", "recurrent MAPPO: a GRU actor and a GRU critic over the world "
                                                  "state, JaxMARL's mappo_rnn baselines"),
    "alphazero": ("fragc.algos.alphazero:AlphaZero", "Gumbel AlphaZero on pgx's two-player games (pgx:connect_four): "
                                                     "mctx's search in self-play, pgx's examples/alphazero"),
    "muzero": ("fragc.algos.muzero:MuZero", "Gumbel MuZero on discrete-action environments (Breakout-MinAtar): a "
                                            "learned model, mctx's search in every actor step"),
}


def load(spec: str) -> tuple[type, type | None]:
    """(algorithm class, config class or None) for a built-in name, `path/to/file.py:Class`
    or `package.module:Class`."""
    if spec in ALGOS:
        algo_cls = _import_class(ALGOS[spec][0])
    elif ":" in spec:
        algo_cls = _import_class(spec)
    else:
        close = difflib.get_close_matches(spec, ALGOS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise FragcError(f"unknown algorithm '{spec}'{hint}; known: {', '.join(ALGOS)}, or your own as "
                         "path/to/file.py:Class or package.module:Class")
    return algo_cls, config_class(algo_cls, spec)


ATARI_DEFAULTS = {
    "ppo": {"num_envs": 8, "clip_eps": 0.1, "network": "nature_cnn", "total_steps": 10_000_000},
}
"""Where a built-in's defaults (CartPole's) give way on an EnvPool Atari game (`--env envpool:Breakout-v5`): CleanRL's
`ppo_atari_envpool.py` values, for each field the config does not give."""


def env_defaults(spec: str, env: Any) -> dict[str, Any]:
    """The defaults `spec` takes on environment `env` beside its config's own (`ATARI_DEFAULTS`)."""
    if spec not in ATARI_DEFAULTS or not isinstance(env, str) or not env.startswith("envpool:"):
        return {}
    from fragc.algos.host_envs import is_envpool_atari

    try:
        atari = is_envpool_atari(env.split(":", 1)[1])
    except Exception:  # noqa: BLE001 - an unknown id or EnvPool missing: making the environment says so
        return {}
    return dict(ATARI_DEFAULTS[spec]) if atari else {}


def make(spec: str, **config: Any) -> Any:
    """The algorithm `spec` names, with its config's defaults overridden by `config` (and, for a built-in on an
    EnvPool Atari game, CleanRL's Atari values where `config` does not give them: `ATARI_DEFAULTS`)."""
    algo_cls, config_cls = load(spec)
    if config_cls is None:
        if config:
            raise FragcError(f"{spec} takes no config, got {', '.join(sorted(config))}")
        return algo_cls()
    config = {**env_defaults(spec, config.get("env")), **config}
    try:
        built = config_cls(**config)
    except (TypeError, ValueError, AssertionError) as err:  # a user's config checking its values
        raise FragcError(f"{spec}: {type(err).__name__}: {err}") from err
    return algo_cls(built)


def config_class(algo_cls: type, spec: str = "") -> type | None:
    """The config dataclass of an algorithm class (see the module docstring)."""
    attr = getattr(algo_cls, "Config", None)
    if isinstance(attr, type) and dataclasses.is_dataclass(attr):
        return attr
    try:
        params = list(inspect.signature(algo_cls).parameters.values())
    except (TypeError, ValueError):
        params = []
    if not params:
        return None
    try:
        hint = typing.get_type_hints(algo_cls.__init__).get(params[0].name)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve is no config class
        hint = None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    name = spec or algo_cls.__qualname__
    raise FragcError(f"{name}: cannot find its config dataclass: give {algo_cls.__name__} a `Config` attribute "
                     f"(Config = MyConfig) or annotate __init__'s parameter '{params[0].name}' with it")


def _import_class(spec: str) -> type:
    where, _, name = spec.rpartition(":")
    module = _import_file(where) if where.endswith(".py") or os.sep in where or "/" in where else _import_module(where)
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        found = [n for n, c in vars(module).items() if isinstance(c, type) and _is_algorithm(c)]
        there = f"; algorithm classes there: {', '.join(found)}" if found else ""
        raise FragcError(f"'{where}' has no class '{name}'{there}")
    if not _is_algorithm(cls):
        raise FragcError(f"{spec} is not an algorithm: it needs methods init(key) and iteration(state)")
    return cls


def _is_algorithm(cls: type) -> bool:
    return callable(getattr(cls, "init", None)) and callable(getattr(cls, "iteration", None))


def _import_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - the user's module failed to import: say where, in one line
        if isinstance(err, ModuleNotFoundError) and err.name and name.startswith(err.name):  # the module itself
            raise FragcError(f"no module named '{name}' (for a file, give its path ending in .py)") from err
        raise FragcError(f"cannot import '{name}': {_import_failure(err, None)}") from err


_FILES: dict[str, Any] = {}
"""Modules loaded from files, by absolute path: a file is executed once per process."""


def _import_file(path: str) -> Any:
    """A user's file as a module, imported as Python imports a script's module: its folder goes
    on sys.path (so its sibling modules import), and it is registered in sys.modules under its
    name (a unique one if that is taken), which dataclasses and pickling need."""
    full = os.path.abspath(path)
    if full in _FILES:
        return _FILES[full]
    if not os.path.isfile(full):
        raise FragcError(f"cannot find the file '{path}'")
    stem = os.path.splitext(os.path.basename(full))[0]
    name = stem if stem.isidentifier() and stem not in sys.modules else f"_fragc_user_{len(_FILES)}_{stem}"
    spec = importlib.util.spec_from_file_location(name, full)
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(full)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - the user's file failed to import: say where, in one line
        del sys.modules[name]
        raise FragcError(f"cannot import '{path}': {_import_failure(err, full)}") from err
    _FILES[full] = module
    return module


def _import_failure(err: BaseException, path: str | None) -> str:
    """`Error: message (file:line)`, at the innermost frame in `path` (or the innermost frame)."""
    frames = traceback.extract_tb(err.__traceback__)
    if isinstance(err, SyntaxError):
        where = f"{err.filename}:{err.lineno}"
    else:
        inside = [f for f in frames if path is None or os.path.abspath(f.filename) == path]
        where = f"{inside[-1].filename}:{inside[-1].lineno}" if inside else ""
    text = err.msg if isinstance(err, SyntaxError) else str(err)
    message = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(err).__name__}: {message}" + (f" ({where})" if where else "")
