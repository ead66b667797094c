"""The `fragc` command line: `fragc run ALGO ...`, `fragc ir ALGO ...`."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import os
import sys
import types
import warnings
from typing import Any, Iterator, Mapping, Sequence

from fragc.ir.errors import FragcError
from fragc.runtime.actions import steps_per_iteration  # no JAX: `fragc launch` and `--help` start without it


def _config_options(parser: argparse.ArgumentParser, algo: str, values: Any = None,
                    description: str = "the algorithm's default where not given") -> None:
    """The fields of `algo`'s config as `--field-name` options, their docstrings as help; `values(kind)`, if
    given, makes the parser of an option's text from the field's own (`fragc sweep`: a comma-separated list).

    Added after the command's own options: a field named like one of them (`iterations` beside
    `fragc bench --iterations`) becomes `--config-field-name`, and its help says why."""
    from fragc.algos import load

    config_cls = load(algo)[1]
    if config_cls is None:
        return
    docs: dict[str, str] = {}
    for cls in reversed(config_cls.__mro__):  # a field's most derived docstring wins
        docs.update(_field_docs(cls))
    group = parser.add_argument_group(f"options of {algo}",
                                      f"fields of {config_cls.__module__}.{config_cls.__qualname__}; {description}")
    own = set(parser._option_string_actions)  # argparse's table of the option strings taken so far
    for field in dataclasses.fields(config_cls):
        if not field.init:
            continue
        if field.name == "iterations" and parser.prog == "fragc run":
            continue  # fragc run's own --iterations (the run length) sets this field (_make_algo)
        kind, what = _option_type(field)
        flag = "--" + field.name.replace("_", "-")
        if flag in own:
            what += f" (config field {field.name}: {flag} is {parser.prog}'s own option)"
            flag = "--config-" + flag[2:]
        group.add_argument(flag, dest=f"cfg_{field.name}", type=values(kind) if values else kind, default=None,
                           metavar=field.name.upper(), help=(docs.get(field.name, "") + what).strip())


def _option_type(field: dataclasses.Field) -> tuple[Any, str]:
    """How an option's text becomes the field's value, and what to add to its help."""
    name = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    simple = {"bool": _bool, "int": _integer, "float": float, "str": str}
    if name in simple:
        return simple[name], ""
    if name.replace(" ", "") in ("str|None", "Optional[str]", "None|str"):
        return str, ""
    return _literal, f" (a Python literal, type {name})"


def _integer(text: str) -> int:
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


def _literal(text: str) -> Any:
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"expected a Python literal, got {text}") from None


@functools.lru_cache(maxsize=64)
def _field_docs(cls: type) -> Mapping[str, str]:
    """The string literal under each field of a dataclass, as CleanRL writes its Args (kept per class, read-only:
    finding a class's source parses its whole module, on every parser built in one process otherwise)."""
    import ast
    import inspect

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


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(float(text))  # accepts 5e5
    except (OverflowError, ValueError):  # inf, nan, abc
        expected = "a positive whole number" if least == 1 else f"a whole number from {least}"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {'positive' if least == 1 else f'{least} or more'}, got {text}")
    return value


def _count(text: str) -> int:
    return _whole_number(text, 1)


def _groups(text: str) -> int:
    return _whole_number(text, 0)


def _seed(text: str) -> int:
    from fragc.runtime.seeds import MAX_SEED, check_seed

    try:
        return check_seed(int(text))
    except (ValueError, FragcError):
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {MAX_SEED}, got {text}") from None


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text}")


def _process_options(parser: argparse.ArgumentParser) -> None:
    """Joining a multi-process run; `fragc launch` sets the defaults through the environment."""
    from fragc.distributed import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

    env = os.environ
    parser.add_argument("--coordinator", default=env.get(ENV_COORDINATOR), metavar="HOST:PORT",
                        help="address of process 0 in a multi-process run (jax.distributed); with --num-processes "
                             "and --process-id, --devices counts this process's devices")
    parser.add_argument("--num-processes", type=_count, default=_env_int(ENV_NUM_PROCESSES), metavar="N",
                        help="processes in the run (default: what jax.distributed detects when --coordinator is "
                             "'auto', else 1)")
    parser.add_argument("--process-id", type=int, default=_env_int(ENV_PROCESS_ID), metavar="I",
                        help="this process's index, 0 to N-1")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    if not value.strip().isdigit():
        raise FragcError(f"{name}={value!r} in the environment: expected a whole number from 0")
    return int(value)


def _multiprocess(args: argparse.Namespace) -> bool:
    """Whether any of the process options was given (then all are needed, see `_join`)."""
    return bool(getattr(args, "coordinator", None)) or (getattr(args, "num_processes", None) or 1) > 1 or (
        getattr(args, "process_id", None) is not None)


def _join(args: argparse.Namespace) -> None:
    """Join the multi-process run: before JAX starts, so before an algorithm's module is imported."""
    from fragc import distributed

    auto = args.coordinator == "auto"
    if not auto and not (args.coordinator and args.num_processes and args.process_id is not None):
        raise FragcError("a multi-process run needs --coordinator HOST:PORT, --num-processes N and --process-id I "
                         "(or --coordinator auto where jax.distributed detects them, e.g. under SLURM)")
    distributed.initialize(None if auto else args.coordinator, None if auto else args.num_processes,
                           None if auto else args.process_id, local_devices=args.devices)
    distributed.keep_native_output_off_stdout()


def _check_same_options(args: argparse.Namespace) -> None:
    """Refuse a multi-process run whose processes were given different options."""
    from fragc import distributed

    same = {k: v for k, v in sorted(vars(args).items()) if k not in ("process_id", "coordinator")}
    distributed.check_same({_flag(k): v for k, v in same.items()})


def _flag(dest: str) -> str:
    return "--" + (dest[4:] if dest.startswith("cfg_") else dest).replace("_", "-")


def _algo_argument(parser: argparse.ArgumentParser) -> None:
    """The ALGO argument; the options of that algorithm's config come last (`_config_options`)."""
    parser.add_argument("algo", metavar="ALGO", help="a built-in algorithm (fragc algos), or your own class as "
                        "path/to/file.py:Class or package.module:Class; its config's fields are options, "
                        f"listed by {parser.prog} ALGO --help")


def _config_file_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="read options from a TOML or YAML file: the algorithm's config fields and fragc run's "
                             "options, by name (lr, ent_coef, seed, policy, ...; fragc ir and bench take the config "
                             "and the placement); options on the command line override it")


def _common(parser: argparse.ArgumentParser) -> None:
    _algo_argument(parser)
    _config_file_option(parser)
    parser.add_argument("--policy", default="single", help="distribution policy (default single)")
    parser.add_argument("--devices", type=_count, default=None, help="devices to use; simulated on CPU if needed")
    parser.add_argument("--env-groups", type=_groups, default=None, metavar="G",
                        help="host environments: split each replica's environments into G groups whose inference "
                        "overlaps the host stepping of the others (default 1; 0: step them in the compiled program)")
    parser.add_argument("--env-workers", type=_groups, default=None, metavar="W",
                        help="host environments: workers of each environment pool (EnvPool's threads; default 0: "
                        "the backend's own choice)")


def _auto_options(parser: argparse.ArgumentParser, explain: bool = True) -> None:
    """The options of the placement search (`--policy auto`, docs/auto.md)."""
    if explain:
        parser.add_argument("--explain", action="store_true",
                            help="with --policy auto: print the search's whole table (candidate, predicted and measured "
                                 "time per iteration, why pruned)")
    parser.add_argument("--auto-budget", type=_seconds, default=60.0, metavar="SECONDS",
                        help="with --policy auto: seconds the search may take (default 60)")
    parser.add_argument("--auto-top", type=_count, default=3, metavar="N",
                        help="with --policy auto: time the N best predicted candidates (default 3)")
    parser.add_argument("--memory-limit", type=_mebibytes, default=None, metavar="MIB",
                        help="with --policy auto: MiB per device a candidate may use (default: the device's own "
                             "limit where it reports one, none on CPU)")
    parser.add_argument("--no-auto-cache", action="store_true",
                        help="with --policy auto: search again, ignoring the decision cached on disk")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _mebibytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MiB, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of MiB, got {text!r}")
    return value


def _auto_kwargs(args: argparse.Namespace, iterations: int | None = None) -> dict:
    """compile's arguments of the search, from the command line (nothing unless --policy auto)."""
    from fragc.api import _auto_seeds

    if _auto_seeds(args.policy) is None:
        return {}
    return {"auto_budget": args.auto_budget, "auto_top": args.auto_top, "auto_cache": not args.no_auto_cache,
            "memory_limit": max(1, int(args.memory_limit * 2**20)) if args.memory_limit is not None else "device",
            "run_iterations": iterations, "auto_log": lambda line: print(line, file=sys.stderr)}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`fragc run: error: ...`) and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Unparsed(Exception):
    pass


class _EarlyParser(_Parser):
    """For a first look at the command line: a usage error raises `_Unparsed` and prints nothing.
    No abbreviations: without the algorithm's options, `--env` would read as `--env-groups`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "allow_abbrev": False})

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Unparsed(message)


ALGO_COMMANDS = ("run", "ir", "bench")


def _parser(algo: str | None = None, parser_class: type = _Parser) -> argparse.ArgumentParser:
    """The command line; `run`, `ir` and `bench` offer the config options of `algo`."""
    parser = parser_class(prog="fragc", description="Compile and run RL training loops as fragmented dataflow graphs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=parser_class)
    run = sub.add_parser("run", help="train an algorithm and print progress and the final mean return")
    _common(run)
    run.add_argument("--seed", type=_seed, default=0, help="PRNG seed, 0 to 2**32 - 1 (default 0)")
    run.add_argument("--iterations", type=_count, default=None, metavar="N",
                     help="train N iterations: sets the config's `iterations` field where it has one, else its "
                          "total_steps to N iterations' env steps; for an algorithm without either (or without a "
                          "config), the run length itself")
    run.add_argument("--print-config", action="store_true",
                     help="print the resolved configuration (these options and the algorithm's config) as a "
                          "--config file, in the format of --config (default TOML), and exit without training")
    run.add_argument("--iterations-per-dispatch", type=_count, default=16, help="iterations scanned per dispatch "
                     "(default 16; searched under --policy auto)")
    _auto_options(run)
    run.add_argument("--quiet", action="store_true", help="print only the final line")
    run.add_argument("--json", action="store_true", help="print a JSON summary on stdout (progress goes to stderr)")
    run.add_argument("--metrics", default=None, metavar="FILE", help="write one JSON line per reporting interval")
    run.add_argument("--checkpoint-dir", default=None, metavar="DIR", help="save the whole training state here")
    run.add_argument("--checkpoint-every", type=_count, default=64, metavar="K",
                     help="iterations between checkpoints (default 64; rounded up to whole dispatches)")
    run.add_argument("--resume", action="store_true", help="continue from the latest good checkpoint in --checkpoint-dir")
    run.add_argument("--stop-after", type=_count, default=None, metavar="K",
                     help="run at most K iterations now (checkpointed), to be continued with --resume")
    run.add_argument("--no-cache", action="store_true",
                     help="do not use the persistent compilation cache (default: on, in FRAGC_CACHE_DIR or ~/.cache/fragc)")
    run.add_argument("--track", default=None, metavar="SINKS",
                     help="log every metric against env steps to tensorboard, wandb and/or mlflow (comma-separated; "
                          "pip install 'fragc[track]'; docs/tracking.md)")
    run.add_argument("--track-dir", default=None, metavar="DIR",
                     help="where the sinks write (default: the --metrics file's folder, else --checkpoint-dir, else runs)")
    run.add_argument("--capture-video", action="store_true",
                     help="record a greedy evaluation episode every --video-every evaluations (needs --eval-every; "
                          "videos go to TRACK_DIR/videos; pip install 'fragc[video]')")
    run.add_argument("--video-every", type=_count, default=5, metavar="K",
                     help="evaluations between videos with --capture-video (default 5)")
    _process_options(run)
    ir = sub.add_parser("ir", help="print the traced module, or the module after a pass")
    _common(ir)
    ir.add_argument("--after", default=None, help="print the module after this pass (default: the last)")
    ir.add_argument("--print-after-all", action="store_true", help="print the module after every pass")
    ir.add_argument("--dump-dir", default=None, help="write the module after every pass to numbered .fir files")
    ir.add_argument("--dot", action="store_true", help="print the graph in Graphviz DOT instead")
    ir.add_argument("--bodies", action="store_true", help="print fragment bodies (jaxprs) too")
    bench = sub.add_parser("bench", help="compare distribution policies on one algorithm configuration")
    _algo_argument(bench)
    _config_file_option(bench)
    bench.add_argument("--policies", default="single,anakin,gspmd,actor_learner,actor_learner_async",
                       help="comma-separated policies, e.g. single,population(single,4) (default: every built-in)")
    bench.add_argument("--devices", type=_count, default=8, help="devices for the distributed policies (default 8)")
    bench.add_argument("--iterations", type=_count, default=16, help="iterations per timed repeat (default 16)")
    bench.add_argument("--repeats", type=_count, default=3, help="alternating repeats (default 3)")
    bench.add_argument("--out", default="bench-out", help="folder for bench.json and bench.png (default bench-out)")
    _auto_options(bench, explain=False)
    _process_options(bench)
    if algo is not None:
        for command in (run, ir, bench):
            _config_options(command, algo)
        if "--total-steps" not in run._option_string_actions:  # a config without total_steps, or none
            run.add_argument("--total-steps", type=_count, default=None, metavar="N",
                             help="train N env steps: N // steps_per_iteration iterations (where the algorithm "
                                  "has steps_per_iteration)")
    from fragc import sweep

    parser.commands = {"run": run, "ir": ir, "bench": bench,  # type: ignore[attr-defined]
                       "sweep": sweep.add_parser(sub, algo)}
    for name, what in (("policies", "built-in distribution policies"), ("algos", "algorithms"),
                       ("envs", "environment backends and the gymnax environments")):
        sub.add_parser(name, help=f"list the {what}, one line each")
    launch = sub.add_parser("launch", help="run a command as N local processes of one multi-process run",
                            description="Start N local processes on loopback, each with its own simulated CPU "
                                        "devices (--devices counts each process's), forward their output with a "
                                        "[i] prefix, and exit non-zero if any fails. "
                                        "Example: fragc launch -n 2 -- fragc run ppo --policy anakin --devices 4")
    launch.add_argument("-n", "--num-processes", type=_count, required=True, help="how many processes")
    launch.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command every process runs")
    plot = sub.add_parser("plot", help="draw the learning curve of a --metrics file to PNG")
    plot.add_argument("file", help="a JSON-lines file written by fragc run --metrics")
    plot.add_argument("--out", default=None, help="the PNG to write (default: FILE with .png)")
    video = sub.add_parser("video", help="render the policy of a checkpoint folder to .mp4 or .gif",
                           description="Play greedy episodes with the policy of the latest good checkpoint "
                                       "in CHECKPOINT_DIR and write them as a video (docs/videos.md).")
    video.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="a folder fragc run --checkpoint-dir wrote")
    video.add_argument("--out", default="agent.mp4", help="the video to write: .mp4 or .gif (default agent.mp4)")
    video.add_argument("--episodes", type=_count, default=2, help="episodes, one after another (default 2)")
    video.add_argument("--member", type=_groups, default=0, help="the population member to show (default 0)")
    video.add_argument("--seed", type=_groups, default=0, help="the episodes' seed (default 0)")
    video.add_argument("--fps", type=_count, default=None, help="frames per second (default: the environment's own rate)")
    video.add_argument("--max-steps", type=_count, default=None,
                       help="end each episode after this many steps (default: the environment's time limit)")
    return parser


def _make_algo(args: argparse.Namespace) -> Any:
    """The algorithm with the config options given. Under `fragc run`, `--iterations N` sets the config's
    `iterations` field where it has one, else its `total_steps` to N iterations' env steps (so that the config
    describes the run: PPO anneals its learning rate over `iterations`); `_run_length` reads it back."""
    from fragc import algos

    config = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
    iterations = getattr(args, "iterations", None) if args.command == "run" else None
    if iterations is None:
        return algos.make(args.algo, **config)
    if config.get("total_steps") is not None or getattr(args, "total_steps", None) is not None:
        raise FragcError("pass --iterations or --total-steps, not both")
    fields = _config_fields(args.algo)
    if "iterations" in fields:
        return algos.make(args.algo, **config, iterations=iterations)
    algo = algos.make(args.algo, **config)
    steps = steps_per_iteration(algo)
    if "total_steps" in fields and steps:
        algo = algos.make(args.algo, **config, total_steps=iterations * steps)
    return algo


def _config_fields(spec: str) -> list[str]:
    """The names of the init fields of `spec`'s config (none without one)."""
    from fragc import algos

    config_cls = algos.load(spec)[1]
    return [f.name for f in dataclasses.fields(config_cls) if f.init] if config_cls else []


def _run_length(algo: Any, args: argparse.Namespace) -> tuple[int, list[str]]:
    """How many iterations `fragc run` trains, and what to say about it (a --total-steps below one iteration): `--iterations`, else `--total-steps` over the steps of an iteration, else the
    config's `iterations` (a field, or a property such as total_steps // steps_per_iteration)."""
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


def _env_name(algo: Any) -> str:
    config = getattr(algo, "config", None)
    return str(getattr(config, "env", None) or getattr(config, "env_name", None) or "?")


def _compile(args: argparse.Namespace, check: Any = None, **kwargs: Any) -> Any:
    """(algo, its compiled program); `check(algo)` runs before compiling."""
    import fragc
    from fragc.devices import devices

    if _multiprocess(args):
        chosen = _devices_of_every_process(args)
    else:
        devices(args.devices)  # simulate CPU devices before JAX starts
        chosen = args.devices
    algo = _make_algo(args)
    if check is not None:
        check(algo)
    if callable(kwargs.get("auto")):
        kwargs.update(kwargs.pop("auto")())
    kwargs.pop("auto", None)
    return algo, fragc.compile(algo, policy=args.policy, devices=chosen, env_groups=args.env_groups,
                               env_workers=args.env_workers, **kwargs)


def _devices_of_every_process(args: argparse.Namespace) -> Any:
    """In a multi-process run `--devices N` counts each process's devices: the first N of each."""
    from fragc.devices import per_process_devices

    return None if args.devices is None else per_process_devices(args.devices)


def cmd_run(args: argparse.Namespace) -> int:
    """Parse, train, print: the training itself is `fragc.train`."""
    import jax

    from fragc.runtime.reporting import enable_compilation_cache, params_fingerprint
    from fragc.runtime.stopping import Stopped
    from fragc.training import algo_meta, train

    if args.print_config:
        algo = _make_algo(args)
        _run_length(algo, args)  # a run it could not start is refused here too
        print(_config_text(args, algo), end="")
        return 0
    if args.explain and not _auto_kwargs(args):
        raise FragcError(f"--explain explains --policy auto's choice; this run has --policy {args.policy}")
    if args.resume and not args.checkpoint_dir:
        raise FragcError("--resume needs --checkpoint-dir")
    if args.stop_after and not args.checkpoint_dir:
        raise FragcError("--stop-after needs --checkpoint-dir (to continue from with --resume)")
    if not args.no_cache:
        enable_compilation_cache()
    lead = jax.process_index() == 0  # progress and output come from process 0
    with _open_checkpoints(args.checkpoint_dir) as checkpoints:  # an unwritable folder fails before compiling
        run_info = {"algo": args.algo, "seed": args.seed}
        length: list = []

        def before_compiling(algo: Any) -> None:  # a run that cannot start is refused before compiling
            length.extend(_run_length(algo, args))
            if lead:
                for note in length[1]:
                    print(f"fragc: warning: {note}", file=sys.stderr)
            if args.resume:  # and so is another configuration's checkpoint
                checkpoints.check_run(algo_meta(algo, run_info))

        algo, prog = _compile(args, check=before_compiling, iterations_per_dispatch=args.iterations_per_dispatch,
                              auto=lambda: _auto_kwargs(args, length[0]))
        iterations, steps, env = length[0], steps_per_iteration(algo), _env_name(algo)
        report = getattr(prog, "auto", None)
        if report is not None and lead:
            print(report.table() if args.explain else report.summary(), file=sys.stderr if args.json else sys.stdout)
        if lead:
            _write_run_records(args, algo)
        out = sys.stderr if args.json else sys.stdout
        progress = None if args.quiet or not lead else out
        if progress is not None:
            what = [f"env {env}"] if env != "?" else []
            what += [f"policy {prog.policy.name}",
                     f"{iterations} iterations" + (f" x {steps} env steps" if steps else ""),
                     f"compiled in {prog.compile_seconds:.1f} s"]
            print(f"fragc run {args.algo}: {', '.join(what)}", file=out)
        try:
            result = train(prog, prog.init(args.seed), iterations, checkpoint_dir=checkpoints,
                           checkpoint_every=args.checkpoint_every, resume=args.resume, metrics=args.metrics,
                           progress=progress, stop_after=args.stop_after, run_info=run_info, track=args.track,
                           track_dir=args.track_dir, actions=_video_capture(args, algo))
        except Stopped as stop:
            if lead:
                print(f"fragc: {stop}; its checkpoint continues with --resume", file=sys.stderr)
            return stop.exit_code
        fingerprint = params_fingerprint(result.state)  # on every process: it may gather across processes
        if not lead:
            return 0
        env_steps = result.iterations * steps if steps else None  # unknown: not claimed
        last = _last_metrics(result.history, population=bool(prog.population))
        if args.json:
            import json

            print(json.dumps({"final_return": _finite_or_none(result.final_return), "env_steps": env_steps,
                              "iterations": result.iterations, "wall_s": round(result.wall_s, 3),
                              "compile_s": round(prog.compile_seconds, 3), "policy": prog.policy.name,
                              "iterations_per_dispatch": prog.k,
                              "auto": report.chosen.label if report is not None else None,
                              "devices": len(prog.devices), "algo": args.algo, "env": None if env == "?" else env,
                              "seed": args.seed,
                              "resumed_from": result.resumed_from, "processes": jax.process_count(),
                              "params_fingerprint": fingerprint,
                              "final_metrics": {k: _finite_or_none(v) for k, v in last.items()}}))
        else:
            import math

            after = f"{env_steps} env steps" if env_steps is not None else f"{result.iterations} iterations"
            if "episode_return" in last or (not last and math.isfinite(result.final_return)):
                evaluated = f", greedy evaluation {last['eval_return']:.1f}" if "eval_return" in last else ""
                print(f"final mean episode return {result.final_return:.1f}{evaluated} after {after} "
                      f"({result.wall_s:.1f} s)")
            else:  # an algorithm without an episode_return metric: the last value of each of its metrics
                shown = ", ".join(f"{k} {v:.4g}" for k, v in last.items()) or "none (no iteration ran)"
                print(f"final metrics: {shown} after {after} ({result.wall_s:.1f} s)")
        return 0


def _video_capture(args: argparse.Namespace, algo: Any) -> list:
    """`--capture-video`: a greedy episode recorded every `--video-every` evaluations (fragc/video.py)."""
    if not args.capture_video:
        return []
    eval_every = getattr(getattr(algo, "config", None), "eval_every", 0)
    if not eval_every:
        raise FragcError("--capture-video records every K evaluations: give --eval-every N (iterations between "
                         "evaluations) too")
    from fragc.video import CaptureVideo

    directory = args.track_dir or (os.path.dirname(os.path.abspath(args.metrics)) if args.metrics
                                   else args.checkpoint_dir or "runs")
    return [CaptureVideo(eval_every * args.video_every, directory)]


def _last_metrics(history: dict, population: bool = False) -> dict[str, float]:
    """Each metric's mean over its last iteration (over replicas, environments, population members: a
    population's rows are on axis 1)."""
    import numpy as np

    last = {}
    for name, rows in history.items():
        rows = np.asarray(rows)
        if rows.size and np.issubdtype(rows.dtype, np.number):
            last[name] = float(np.mean(rows[:, -1] if population else rows[-1]))
    return last


def _finite_or_none(x: float) -> float | None:
    """JSON has no NaN: a return not measured yet (no episode ended) is null."""
    import math

    return x if math.isfinite(x) else None


# ------------------------------------------------------------------ config files (fragc/config_files.py)

COMMAND_LINE_ONLY = ("resume", "stop_after", "quiet", "json", "no_cache", "config", "print_config", "coordinator",
                     "num_processes", "process_id", "help")
"""Options of `fragc run` a config file does not hold: they say what this invocation does, not which run it is."""

PLACEMENT = ("policy", "devices", "env_groups", "env_workers")
"""The run options that `fragc ir` and `fragc bench` take from a config file too (where they have them)."""

RUN_LENGTH = ("iterations", "total_steps", "cfg_total_steps")
"""The options that set the run length: one of them on the command line overrides the file's."""


def _file_keys(run: argparse.ArgumentParser, algo: str | None) -> dict[str, Any]:
    """The keys a config file may hold: each long option of `fragc run ALGO` as a `config_files.Key`."""
    from fragc import config_files

    types = {}
    if algo is not None:
        from fragc import algos

        config_cls = algos.load(algo)[1]
        types = {f"cfg_{f.name}": str(f.type) for f in dataclasses.fields(config_cls)} if config_cls else {}
        if "cfg_iterations" in types:
            types["iterations"] = types["cfg_iterations"]
    kinds = {_bool: "bool", _integer: "int", _count: "int", _groups: "int", _seed: "int", int: "int",
             float: "float", _seconds: "float", _mebibytes: "float", str: "str", None: "str"}
    keys = {}
    for action in run._actions:
        long = [o for o in action.option_strings if o.startswith("--")]
        if not long or action.dest in COMMAND_LINE_ONLY:
            continue
        name = config_files.normalized(long[0][2:])
        kind = kinds.get(action.type, "any")
        if kind == "str" and not isinstance(action, argparse._StoreAction):  # a flag (store_true): none are keys
            continue
        keys[name] = config_files.Key(name, action.dest, kind, action.type if kind in ("int", "float") else None,
                                      tuples="tuple" in types.get(action.dest, "").lower())
    return keys


def _given(argv: list[str], algo: str | None, parser_class: type | None = None) -> set[str]:
    """The destinations of the options given on the command line (not left to their defaults)."""
    parser = _parser(algo, parser_class or _Parser)
    for command in parser.commands.values():
        for action in command._actions:
            if action.option_strings:
                action.default = argparse.SUPPRESS
    try:
        given, _ = parser.parse_known_args([a for a in argv if a not in ("-h", "--help")])
    except _Unparsed:
        return set()
    return set(vars(given))


def _apply_config_file(args: argparse.Namespace, argv: list[str], parser: argparse.ArgumentParser) -> None:
    """The options of `--config FILE` the command line does not give, set on `args`. Keys are the options of
    `fragc run ALGO` (the file is a run's); `ir` and `bench` take the config fields and the placement."""
    from fragc import config_files

    path = args.config
    table = config_files.read(path)
    if config_files.RECORD_TABLE in table:
        config_files.check_record(path, table.pop(config_files.RECORD_TABLE), args.algo)
    keys = _file_keys(parser.commands["run"], args.algo)
    given = _given(argv, args.algo)
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
        dest = _dest_in(args, spec.dest)
        if dest is None or dest in given or (length_given and spec.dest in RUN_LENGTH):
            continue
        setattr(args, dest, value)


def _dest_in(args: argparse.Namespace, dest: str) -> str | None:
    """Where a `fragc run` option's value goes in `args` of another command (None: it has no such option)."""
    if args.command == "run":
        return dest
    if dest == "iterations":  # fragc run's --iterations of a config with an iterations field is that field
        dest = "cfg_iterations"
    if dest.startswith("cfg_") or dest in PLACEMENT:
        return dest if hasattr(args, dest) else None
    return None


def _early_config_file(early: argparse.Namespace, argv: list[str]) -> None:
    """`devices` from the config file, for what acts before JAX starts (`_simulate_devices_early`, joining a
    multi-process run); the whole file is read again once the algorithm's options are known."""
    from fragc import config_files

    path = getattr(early, "config", None)
    if not path or getattr(early, "command", None) not in ALGO_COMMANDS:
        return
    table = config_files.read(path)
    found = [(k, v) for k, v in table.items() if config_files.normalized(k) == "devices"]
    if found and "devices" not in _given(argv, None, _EarlyParser):
        key, value = found[0]
        early.devices = config_files.value_of(path, key, config_files.Key("devices", "devices", "int", _count), value)


def _config_format(args: argparse.Namespace) -> str:
    from fragc import config_files

    return config_files.format_of(args.config) if getattr(args, "config", None) else "toml"


RUN_OPTIONS_SHOWN = ("policy", "devices", "env_groups", "env_workers", "seed", "iterations_per_dispatch",
                     "iterations", "total_steps", "checkpoint_dir", "checkpoint_every", "metrics")
"""The run options a printed config holds, in this order (after them, the algorithm's config)."""


def _config_text(args: argparse.Namespace, algo: Any, record: dict | None = None) -> str:
    """The resolved configuration as a config file: `fragc run ALGO --config FILE` runs it again."""
    from fragc import config_files

    fields = _config_fields(args.algo)
    config = getattr(algo, "config", None)
    run = {name: getattr(args, name, None) for name in RUN_OPTIONS_SHOWN}
    if "iterations" in fields or ("total_steps" in fields and steps_per_iteration(algo)):
        run["iterations"] = None  # --iterations went into the config
    keys = {spec.dest: spec.name for spec in _file_keys(_parser(args.algo).commands["run"], args.algo).values()}
    sections = [(f"fragc run {args.algo}: the resolved configuration; fragc run {args.algo} --config FILE runs it "
                 "again\n(options given on the command line override the file's)", run)]
    if fields and config is not None:
        values, unwritable = {}, []
        for name in fields:
            value = getattr(config, name, None)
            key = "iterations" if name == "iterations" else keys.get(f"cfg_{name}", name)
            if _plain(value):
                values[key] = value
            else:
                unwritable.append(name)
        cls = type(config)
        comment = f"{args.algo}'s config ({cls.__module__}.{cls.__qualname__})"
        if unwritable:
            comment += f"\nnot written (not a plain value; the default is used): {', '.join(unwritable)}"
        sections.append((comment, values))
    return config_files.dumps(_config_format(args), sections, record)


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _write_run_records(args: argparse.Namespace, algo: Any) -> None:
    """The resolved config with where it came from (fragc's version, the command, the git revision of the
    algorithm's file): `run.toml` in the checkpoint folder, `NAME.run.toml` beside a metrics file `NAME.jsonl`
    (`.yaml` for a YAML --config); either runs again with --config."""
    from fragc import config_files

    fmt = _config_format(args)
    paths = []  # (where, the metrics file it is beside)
    if args.checkpoint_dir:
        paths.append((os.path.join(args.checkpoint_dir, f"run.{fmt}"), None))
    if args.metrics and (beside := config_files.beside_metrics(args.metrics, fmt)):
        paths.append((beside, args.metrics))
    if not paths:
        return
    text = _config_text(args, algo, config_files.record(args.algo, type(algo), getattr(args, "command_line", None)))
    for path, metrics in paths:
        config_files.write(path, text, beside=metrics)


def _open_checkpoints(directory: str | None) -> Any:
    """The run's checkpoints (closed when the run ends), or nothing to open without a folder."""
    if not directory:
        return contextlib.nullcontext()
    from fragc.runtime.checkpoint import Checkpointer

    return Checkpointer(directory)


def cmd_list(args: argparse.Namespace) -> int:
    if args.command == "policies":
        from fragc.passes.policy import BUILTIN

        for name, factory in BUILTIN.items():
            print(f"{name:22} {(factory.__doc__ or '').strip().splitlines()[0]}")
        print(f"{'population(POLICY,S)':22} S independent runs of POLICY vectorised over seeds")
    elif args.command == "algos":
        from fragc.algos import ALGOS

        for name, (*_, summary) in ALGOS.items():
            print(f"{name:16} {summary}")
    else:
        from fragc.algos.envs import BACKENDS, backend_summary, env_names, make

        for backend in BACKENDS:
            print(f"{backend + ':ID':26} {backend_summary(backend)}")
        print()
        for name in env_names():
            try:
                env, params = make(name)
                kind = type(env.action_space(params)).__name__
            except FragcError:
                kind = "(cannot be made here)"
            print(f"{name:26} actions: {kind}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from fragc.devices import devices
    from fragc.passes.policy import resolve
    from fragc.runtime.bench import format_table, run_bench, write_outputs
    from fragc.training import config_dict

    policies = policy_list(args.policies)
    if not policies:
        raise FragcError("--policies names no policy")
    if "auto" in policies:
        if policies != ["auto"]:
            raise FragcError("--policies auto runs the placement search on its own: name no other policy with it")
        return _bench_auto(args)
    if _multiprocess(args):
        chosen = _devices_of_every_process(args) or None
        import jax

        count = len(chosen) if chosen else jax.device_count()
    else:
        devices(args.devices)  # simulate CPU devices before JAX starts
        chosen = count = args.devices
    for p in policies:
        resolve(p, count)  # unknown names fail here, before any compilation
    _fit_env_count(args, policies, count)
    make = lambda: _make_algo(args)  # noqa: E731
    algo = make()
    import jax

    lead = jax.process_index() == 0
    log = (lambda line: print(line, file=sys.stderr)) if lead else (lambda line: None)
    rows = run_bench(make, policies, chosen, args.iterations, args.repeats, log=log)
    if not lead:
        return 0
    config = {"algo": args.algo, "env": _env_name(algo), "devices": count, "processes": jax.process_count(),
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


def _bench_auto(args: argparse.Namespace) -> int:
    """`fragc bench ALGO --policies auto`: the search's table, and its report as JSON in --out."""
    import json

    from fragc.devices import devices

    devices(args.devices)
    args.policy = "auto"
    _fit_env_count(args, ["anakin"], args.devices)
    algo = _make_algo(args)
    import fragc

    prog = fragc.compile(algo, "auto", devices=args.devices, **{k: v for k, v in _auto_kwargs(args).items()
                                                                 if k != "run_iterations"})
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


def _fit_env_count(args: argparse.Namespace, policies: list[str], count: int) -> None:
    """Every policy must divide the environments; unless --num-envs was given, round the
    algorithm's default up to a multiple of the device count, and say so."""
    import math

    from fragc import algos

    config_cls = algos.load(args.algo)[1]
    fields = {f.name: f for f in dataclasses.fields(config_cls)} if config_cls else {}
    if getattr(args, "cfg_num_envs", None) is not None or not isinstance(getattr(fields.get("num_envs"), "default", None), int):
        return
    default = fields["num_envs"].default
    wanted = math.lcm(default, count, 2 if count > 1 else 1)
    if wanted != default and any(p not in ("single", "gspmd") for p in policies):
        args.cfg_num_envs = wanted
        import jax

        if jax.process_index() == 0:
            print(f"bench: num_envs {default} -> {wanted} so that every policy's replica count divides it "
                  "(pass --num-envs to choose)", file=sys.stderr)


def cmd_plot(args: argparse.Namespace) -> int:
    from fragc.runtime.plots import plot_learning_curve

    out = args.out or (args.file.rsplit(".", 1)[0] + ".png")
    plot_learning_curve(args.file, out)
    print(out)
    return 0


def cmd_ir(args: argparse.Namespace) -> int:
    """Trace and run the passes, then print: the IR needs no XLA program, so none is compiled."""
    from fragc.api import run_passes
    from fragc.devices import devices
    from fragc.ir import to_dot
    from fragc.api import warn_per_replica

    if args.after and args.print_after_all:
        raise FragcError("pass --after or --print-after-all, not both")
    from fragc.api import _auto_seeds

    if _auto_seeds(args.policy) is not None:
        raise FragcError("fragc ir --policy auto: the choice needs the search; run `fragc run ALGO --policy auto "
                         "--explain` to see it, then `fragc ir ALGO --policy CHOSEN`")
    devices(args.devices)  # simulate CPU devices before JAX starts
    pipeline, _, _ = run_passes(_make_algo(args), policy=args.policy, devices=args.devices,
                                print_after_all=args.print_after_all, dump_dir=args.dump_dir,
                                env_groups=args.env_groups, env_workers=args.env_workers)
    warn_per_replica(pipeline.final)  # what compile says of a body that only works with one replica
    if args.print_after_all:
        return 0
    module = pipeline.after(args.after)
    if args.dot:
        print(to_dot(module), end="")
    else:
        from fragc.ir.printer import format_module

        print(format_module(module, bodies=args.bodies), end="")
    return 0


def _first_look(argv: list[str]) -> argparse.Namespace:
    """The command line read without the algorithm's options (which depend on the algorithm):
    the algorithm to load, and what must act before JAX starts: `--devices` and the process
    options. Empty if it does not parse; the full parse then reports why."""
    try:
        known, _ = _parser(None, _EarlyParser).parse_known_args([a for a in argv if a not in ("-h", "--help")])
    except _Unparsed:
        return argparse.Namespace()
    return known


def _simulate_devices_early(args: argparse.Namespace) -> None:
    """`--devices N` must reach JAX before anything starts its backend (importing gymnax does,
    and so may importing a user's algorithm)."""
    count = getattr(args, "devices", None)
    if count and count > 1:
        from fragc.devices import simulate_cpu_devices

        simulate_cpu_devices(count)


def cmd_launch(args: argparse.Namespace) -> int:
    from fragc.launch import launch

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return launch(args.num_processes, command)


def cmd_video(args: argparse.Namespace) -> int:
    """`fragc video`: fragc/video.py renders a checkpoint's policy."""
    from fragc import video

    return video.cmd_video(args)


COMMANDS = {"run": cmd_run, "ir": cmd_ir, "policies": cmd_list, "algos": cmd_list, "envs": cmd_list,
            "plot": cmd_plot, "bench": cmd_bench, "launch": cmd_launch, "video": cmd_video,
            "sweep": lambda args: __import__("fragc.sweep").sweep.cmd_sweep(args)}


def main(argv: Sequence[str] | None = None) -> int:
    from fragc.runtime.stopping import stop_signals_interrupt

    try:
        with stop_signals_interrupt(), _one_line_warnings():
            return _main(argv)
    except KeyboardInterrupt as stop:  # while starting: loading the algorithm imports JAX
        return _interrupted(stop)
    except FragcError as err:  # while starting: e.g. a malformed FRAGC_* variable
        return _usage_error(err)


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Python warnings (a damaged checkpoint, a shared key) as one `fragc: warning:` line each,
    without the source line Python adds (recorded warnings, as in pytest.warns, stay recorded)."""
    def one_line(message: Any, category: type, filename: str, lineno: int, line: Any = None) -> str:
        return f"fragc: warning: {message}\n"

    previous, warnings.formatwarning = warnings.formatwarning, one_line
    try:
        yield
    finally:
        warnings.formatwarning = previous


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    early = _first_look(argv)
    _early_config_file(early, argv)
    if getattr(early, "command", None) != "launch" and _multiprocess(early):
        return _guarded(_multiprocess_command, early, argv)
    _simulate_devices_early(early)
    try:
        args = _parse(argv, getattr(early, "algo", None))
    except FragcError as err:
        return _usage_error(err)
    args.command_line = argv
    return _guarded(COMMANDS[args.command], args)


def _parse(argv: list[str], algo: str | None) -> argparse.Namespace:
    """The whole command line, with the options of `algo` (whose module this imports), and those of its
    `--config` file that the command line does not give."""
    parser = _parser(algo)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        options = [u for u in unknown if u.startswith("-")]
        if options and getattr(args, "algo", None):
            raise FragcError(f"{args.algo} has no option {', '.join(options)} "
                             f"(see fragc {args.command} {args.algo} --help)")
        raise FragcError(f"unrecognized arguments: {' '.join(unknown)} (see fragc --help)")
    if getattr(args, "config", None):
        _apply_config_file(args, argv, parser)
    return args


def _multiprocess_command(early: argparse.Namespace, argv: list[str]) -> int:
    """`run` or `bench` as one process of several: join, parse, run, leave.

    Joining comes first: importing the algorithm may start JAX.

    A run that returns, whatever its code, leaves through JAX's shutdown
    barrier (every process returns alike). A failing process exits at once
    rather than through it, which would wait for processes that may be stuck
    in a collective with it (their watchdogs then name it). A failure in a collective is most likely a
    lost process: the watchdog gets time to name it before the error is shown.
    """
    import traceback

    from fragc import distributed

    _join(early)
    args = _parse(argv, early.algo)
    _check_same_options(args)
    args.command_line = argv
    try:
        code = {"run": cmd_run, "bench": cmd_bench}[args.command](args)
        distributed.finish()  # a code returned (0, or a signal's after a graceful stop) is every process's
        return code
    except FragcError as err:
        print(f"fragc: error: {err}", file=sys.stderr)
        distributed.fail(str(err))
        code = _exit_code(err)
    except KeyboardInterrupt as stop:
        distributed.fail("interrupted")
        code = _interrupted(stop)
    except Exception as err:  # noqa: BLE001
        import jax

        if isinstance(err, jax.errors.JaxRuntimeError):  # most likely a collective whose peer is gone
            distributed.wait_for_verdict(distributed.lost_after_s() + 5)
        traceback.print_exc()
        distributed.fail(f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _usage_error(err: FragcError) -> int:
    """One line, and the error's exit code: 2 for a user's mistake, 3 for a run that diverged."""
    print(f"fragc: error: {err}", file=sys.stderr)
    return _exit_code(err)


def _exit_code(err: FragcError) -> int:
    return getattr(err, "exit_code", 2)


def _interrupted(stop: KeyboardInterrupt) -> int:
    """Say so in one line; the exit code is 128 + the signal that stopped the command."""
    from fragc.runtime.stopping import exit_code

    print("fragc: interrupted", file=sys.stderr)
    return exit_code(stop)


def _guarded(command: Any, *args: Any) -> Any:
    """`command(*args)`, with a user's mistake reported as one line and exit code 2."""
    try:
        return command(*args)
    except FragcError as err:
        return _usage_error(err)
    except KeyboardInterrupt as stop:
        return _interrupted(stop)
    except BrokenPipeError:  # `fragc envs | head`
        sys.stderr.close()
        return 0


def console_main() -> int:
    """The `fragc` command: `main`, then a process that ends quickly. Python's shutdown collects the garbage
    among every object the run made (JAX's traces and caches): 0.8-1.0 s after a small `fragc run` here, against
    0.2 s with those objects frozen first, which the collector skips. Exit hooks (a tracker's last upload) still
    run; only cyclic garbage left at exit goes uncollected, as it may in any Python process."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(console_main())
