"""`fragc policies`, `fragc algos`, `fragc envs`: one line per built-in policy, algorithm, environment."""

from __future__ import annotations

import argparse

from fragc.algos import ALGOS
from fragc.algos.envs import BACKENDS, backend_summary, env_names, make
from fragc.ir.errors import FragcError
from fragc.passes.policy import BUILTIN


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    pass  # each lists everything it knows


def main(args: argparse.Namespace) -> int:
    {"policies": policies, "algos": algorithms, "envs": environments}[args.command]()
    return 0


def policies() -> None:
    for name, factory in BUILTIN.items():
        print(f"{name:22} {(factory.__doc__ or '').strip().splitlines()[0]}")
    print(f"{'population(POLICY,S)':22} S independent runs of POLICY vectorised over seeds")


def algorithms() -> None:
    for name, (*_, summary) in ALGOS.items():
        print(f"{name:16} {summary}")


def environments() -> None:
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
