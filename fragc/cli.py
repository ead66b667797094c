"""The `fragc` command line: `fragc run ALGO ...`, `fragc ir ALGO ...`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any, Sequence

from fragc.ir.errors import FragcError


def _config_options(parser: argparse.ArgumentParser) -> None:
    """Every config field of every algorithm as `--field-name`; `_make_algo` refuses fields the chosen one lacks."""
    from fragc.algos import ALGOS, load

    fields = {}
    for name in ALGOS:
        for field in dataclasses.fields(load(name)[1]):
            fields.setdefault(field.name, field)
    for field in fields.values():
        flag = "--" + field.name.replace("_", "-")
        kind = {"bool": _bool, "int": _count, "float": float}.get(str(field.type), str)
        parser.add_argument(flag, dest=f"cfg_{field.name}", type=kind, default=None, metavar=field.name.upper(),
                            help=f"(default {field.default})")


def _count(text: str) -> int:
    value = int(float(text))  # accepts 5e5
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text}")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("algo", help="algorithm name (fragc.algos)")
    parser.add_argument("--policy", default="single", help="distribution policy (default single)")
    parser.add_argument("--devices", type=_count, default=None, help="devices to use; simulated on CPU if needed")
    _config_options(parser)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fragc", description="Compile and run RL training loops as fragmented dataflow graphs.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train an algorithm and print progress and the final mean return")
    _common(run)
    run.add_argument("--seed", type=int, default=0, help="PRNG seed (default 0)")
    run.add_argument("--iterations-per-dispatch", type=_count, default=16, help="iterations scanned per dispatch")
    run.add_argument("--quiet", action="store_true", help="print only the final line")
    ir = sub.add_parser("ir", help="print the traced module, or the module after a pass")
    _common(ir)
    ir.add_argument("--after", default=None, help="print the module after this pass (default: the last)")
    ir.add_argument("--print-after-all", action="store_true", help="print the module after every pass")
    ir.add_argument("--dump-dir", default=None, help="write the module after every pass to numbered .fir files")
    ir.add_argument("--dot", action="store_true", help="print the graph in Graphviz DOT instead")
    ir.add_argument("--bodies", action="store_true", help="print fragment bodies (jaxprs) too")
    return parser


def _make_algo(args: argparse.Namespace) -> Any:
    from fragc import algos

    config = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
    _, config_cls = algos.load(args.algo)
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise FragcError(f"{args.algo} has no option(s) {', '.join('--' + u.replace('_', '-') for u in unknown)}")
    return algos.make(args.algo, **config)


def _compile(args: argparse.Namespace, **kwargs: Any) -> Any:
    from fragc.devices import devices

    devices(args.devices)  # simulate CPU devices before JAX starts
    import fragc

    algo = _make_algo(args)
    return algo, fragc.compile(algo, policy=args.policy, devices=args.devices, **kwargs)


def cmd_run(args: argparse.Namespace) -> int:
    algo, prog = _compile(args, iterations_per_dispatch=args.iterations_per_dispatch)
    iterations = algo.config.iterations
    steps = algo.steps_per_iteration
    say = (lambda *a: None) if args.quiet else print
    say(f"fragc run {args.algo}: env {algo.config.env}, policy {args.policy}, {iterations} iterations "
        f"x {steps} env steps, compiled in {prog.compile_seconds:.1f} s")
    state = prog.init(args.seed)
    start, last_print = time.perf_counter(), 0.0

    def progress(done: int, metrics: dict) -> None:
        nonlocal last_print
        now = time.perf_counter() - start
        if now - last_print >= 2.0 or done == iterations:
            last_print = now
            say(f"  iter {done:>6}/{iterations}  env steps {done * steps:>9}  return {metrics['episode_return'][-1]:7.1f}"
                f"  {done * steps / max(now, 1e-9):9.0f} steps/s")

    state, history = prog.run(state, iterations, callback=progress)
    wall = time.perf_counter() - start
    final = float(history["episode_return"][-1])
    print(f"final mean episode return {final:.1f} after {iterations * steps} env steps ({wall:.1f} s)")
    return 0


def cmd_ir(args: argparse.Namespace) -> int:
    from fragc.ir import to_dot

    if args.after and args.print_after_all:
        raise FragcError("pass --after or --print-after-all, not both")
    _, prog = _compile(args, print_after_all=args.print_after_all, dump_dir=args.dump_dir)
    if args.print_after_all:
        return 0
    module = prog.pipeline.after(args.after)
    if args.dot:
        print(to_dot(module), end="")
    else:
        from fragc.ir.printer import format_module

        print(format_module(module, bodies=args.bodies), end="")
    return 0


def _simulate_devices_early(argv: Sequence[str] | None) -> None:
    """`--devices N` must reach JAX before anything starts its backend (importing gymnax does)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--devices", type=int, default=None)
    known, _ = pre.parse_known_args(argv)
    if known.devices and known.devices > 1:
        from fragc.devices import simulate_cpu_devices

        simulate_cpu_devices(known.devices)


def main(argv: Sequence[str] | None = None) -> int:
    _simulate_devices_early(argv)
    args = _parser().parse_args(argv)
    try:
        return {"run": cmd_run, "ir": cmd_ir}[args.command](args)
    except FragcError as err:
        print(f"fragc: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fragc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
