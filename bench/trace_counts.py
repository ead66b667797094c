"""How often each function is traced from `fragc.compile(...)` to the first iteration, phase by phase.

Counts, while `fragc.compile(algo, policy)`, `prog.init(seed)` and `prog.run(state, 1)` run:

- `calls`: how many times each of the algorithm's own functions was called: `init`, `iteration` and every
  fragment's function (their names). Outside a run these run only when something traces them: the
  `eval_shape` of `init`, the iteration's trace, each fragment's body (at one replica, and again at 2 for the
  replica check), `Program.init`'s jit of `init`.
- `jax_traces`: JAX's jaxpr traces (jit, `make_jaxpr`, `eval_shape`) by function name, `lowerings` (jaxpr ->
  MLIR) and `compiles` (XLA backend compiles), with their seconds.

    python bench/trace_counts.py [--algo ppo] [--policy single] [--json]

tests/test_trace_counts.py asserts these counts for the built-in PPO under `single`, so that a change that
traces something again does not go unnoticed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import threading
import time
from typing import Any, Callable, Iterator

import jax
from jax._src import dispatch, monitoring

import fragc
from fragc.ir.frontend import Fragment

PHASES = ("compile", "init", "first_iteration")


def algorithm_functions(algo: Any) -> dict[str, tuple[Any, str]]:
    """Name -> (object, attribute) of `algo`'s `init`, `iteration` and every fragment of its class and of the
    objects it holds (PPO's evaluator: `evaluator.evaluate`)."""
    targets: dict[str, tuple[Any, str]] = {"init": (algo, "init"), "iteration": (algo, "iteration")}
    for obj in [algo, *vars(algo).values()]:
        for cls in type(obj).__mro__:
            for attr, value in vars(cls).items():
                name = attr if obj is algo else f"{type(obj).__name__.lower()}.{attr}"
                if isinstance(value, Fragment) and name not in targets:
                    targets[name] = (obj, attr)
    return targets


class Counter:
    """Calls of the algorithm's functions (in every thread) and JAX's trace, lowering and compile events.

    `counting()` sets a counting wrapper of each function on its object (an instance attribute, which a method
    or a `Fragment`, having no `__set__`, gives way to; a fragment's wrapper is a `Fragment` around the counting
    function, with the original's name, role and axes), and removes them after."""

    def __init__(self, targets: dict[str, tuple[Any, str]]):
        self.targets = targets
        self.calls: collections.Counter = collections.Counter()
        self.jax_traces: collections.Counter = collections.Counter()
        self.lowerings = self.compiles = 0
        self.seconds = collections.Counter()
        self._lock = threading.Lock()

    def _counting(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            return fn(*args, **kwargs)

        return counted

    def _event(self, event: str, duration: float, **kwargs: Any) -> None:
        with self._lock:
            if event == dispatch.JAXPR_TRACE_EVENT:
                self.jax_traces[str(kwargs.get("fun_name", "?"))] += 1
                self.seconds["trace"] += duration
            elif event == dispatch.JAXPR_TO_MLIR_MODULE_EVENT:
                self.lowerings += 1
                self.seconds["lower"] += duration
            elif event == dispatch.BACKEND_COMPILE_EVENT:
                self.compiles += 1
                self.seconds["compile"] += duration

    @contextlib.contextmanager
    def counting(self) -> Iterator["Counter"]:
        for name, (obj, attr) in self.targets.items():
            bound = getattr(obj, attr)
            if isinstance(bound, Fragment):
                wrapper = Fragment(self._counting(name, bound.fn), bound.role, bound.in_axes, bound.out_axes)
            else:
                wrapper = self._counting(name, bound)
            object.__setattr__(obj, attr, wrapper)
        monitoring.register_event_duration_secs_listener(self._event)
        try:
            yield self
        finally:
            monitoring.unregister_event_duration_listener(self._event)
            for obj, attr in self.targets.values():
                object.__delattr__(obj, attr)

    def snapshot(self) -> dict[str, Any]:
        return {"calls": dict(self.calls), "jax_traces": dict(self.jax_traces), "lowerings": self.lowerings,
                "compiles": self.compiles, "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}


def count(make_algo: Callable[[], Any], policy: Any = "single",
          **compile_kwargs: Any) -> tuple[dict[str, dict[str, Any]], Any]:
    """(phase -> the counts of that phase, the program) for `fragc.compile(make_algo(), policy, **compile_kwargs)`,
    `init(0)` and one iteration. `make_algo` is called before counting starts (constructing an algorithm traces
    nothing)."""
    algo = make_algo()
    out: dict[str, dict[str, Any]] = {}

    def phase(name: str, fn: Callable[[], Any]) -> Any:
        counter = Counter(algorithm_functions(algo))
        start = time.perf_counter()
        with counter.counting():
            result = jax.block_until_ready(fn())
        out[name] = {**counter.snapshot(), "wall_s": round(time.perf_counter() - start, 3)}
        return result

    prog = phase("compile", lambda: fragc.compile(algo, policy, **compile_kwargs))
    state = phase("init", lambda: prog.init(0))
    phase("first_iteration", lambda: prog.run(state, 1))
    return out, prog


def totals(counts: dict[str, dict[str, Any]]) -> collections.Counter:
    """Calls of each function over all phases."""
    total: collections.Counter = collections.Counter()
    for phase in counts.values():
        total.update(phase["calls"])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="ppo", help="a built-in algorithm (fragc.algos)")
    parser.add_argument("--policy", default="single")
    parser.add_argument("--devices", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args()
    from fragc.algos import make  # noqa: PLC0415

    counts, _ = count(lambda: make(args.algo), args.policy, devices=args.devices)
    if args.json:
        print(json.dumps(counts, indent=1))
        return
    for name, c in counts.items():
        print(f"{name}: {c['wall_s']} s; Python bodies run: {c['calls']}")
        print(f"  jax traces {sum(c['jax_traces'].values())} {c['jax_traces']}")
        print(f"  lowerings {c['lowerings']}, XLA compiles {c['compiles']}, seconds {c['seconds']}")
    print(f"total Python bodies run: {dict(totals(counts))}")


if __name__ == "__main__":
    main()
