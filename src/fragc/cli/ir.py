"""`fragc ir ALGO`: trace and run the passes, then print the module (or its Graphviz graph); compiles nothing."""

from __future__ import annotations

import argparse

from fragc.compiler import run_passes, warn_per_replica
from fragc.devices import devices
from fragc.ir.dot import to_dot
from fragc.ir.errors import FragcError
from fragc.ir.printer import format_module
from fragc.options import CompileOptions, search_seeds

from .algorithm import fit_fleet_envs, make_algo
from .options import config_options, placement_options


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    placement_options(parser)
    parser.add_argument("--after", default=None, help="print the module after this pass (default: the last)")
    parser.add_argument("--print-after-all", action="store_true", help="print the module after every pass")
    parser.add_argument("--dump-dir", default=None, help="write the module after every pass to numbered .fir files")
    parser.add_argument("--dot", action="store_true", help="print the graph in Graphviz DOT instead")
    parser.add_argument("--bodies", action="store_true", help="print fragment bodies (jaxprs) too")
    if algo is not None:
        config_options(parser, algo)


def main(args: argparse.Namespace) -> int:
    """Trace and run the passes, then print: the IR needs no XLA program, so none is compiled."""
    if args.after and args.print_after_all:
        raise FragcError("pass --after or --print-after-all, not both")
    if search_seeds(args.policy) is not None:
        raise FragcError("fragc ir --policy auto: the choice needs the search; run `fragc run ALGO --policy auto "
                         "--explain` to see it, then `fragc ir ALGO --policy CHOSEN`")
    devices(args.devices)  # simulate CPU devices before JAX starts
    fit_fleet_envs(args)
    options = CompileOptions(args.policy, args.devices, print_after_all=args.print_after_all, dump_dir=args.dump_dir,
                             env_groups=args.env_groups, env_workers=args.env_workers, env_fleet=args.env_fleet)
    pipeline, _, _ = run_passes(make_algo(args), options)
    warn_per_replica(pipeline.final)  # what compile says of a body that only works with one replica
    if args.print_after_all:
        return 0
    module = pipeline.after(args.after)
    print(to_dot(module) if args.dot else format_module(module, bodies=args.bodies), end="")
    return 0
