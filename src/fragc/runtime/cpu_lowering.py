"""fragc can lower two of JAX's primitives on the CPU another way, computing the same bits, where that measures faster.

- **`threefry2x32`** (every `jax.random` draw under the default key implementation), written out straight. JAX lowers
  it on GPUs as straight-line code, 20 rounds one after another, and on CPUs as a `fori_loop` of 5 trips over 4
  rounds each, to keep the HLO small. XLA's CPU runtime runs each trip as several small thunks (the loop's
  condition, the carry's copies, the round's fusion). Both lowerings do the same 32-bit adds, rotations and xors in
  the same order. Registered `inline=False`, as JAX registers its own straight rule: one function per shape, called
  wherever the shape is drawn, so a program's HLO holds the 20 rounds once, not once per draw.
- **A stable sort of 32-bit integer keys carrying values** (`lax.sort_key_val`; `jax.random.permutation` is one,
  PPO's minibatch shuffle), as one sort of 64-bit words, each a key above its position. XLA's CPU runtime sorts
  one buffer of a native type with `std::sort`'s own comparison, and several buffers through a compiled comparator
  called per comparison that moves every buffer's elements. The packed words are distinct and their order is the
  keys' order, ties by position: a stable sort's order. The keys are read off the words, the values gathered by
  position.

Neither changes a result, only the HLO, and neither wins everywhere: which is faster depends on the processor, and
on the program, since the rules change how XLA's CPU runtime spreads a program's thunks over its threads
(docs/benchmarks.md). So each rule is on only where its workload (`WORKLOADS`: for threefry, fragc's PPO iteration,
src/fragc/lowering_workloads.py; for the sort, PPO's shuffles) measured faster with it, in wall time and in CPU time, on
the processor it runs on: measured at the first lowering of a process that has not decided it, and kept per processor
model, usable cores and JAX version in the user's cache folder (`choices_path()`). `FRAGC_THREEFRY=straight` or
`rolled` and `FRAGC_SORT=packed` or `jax` decide without measuring.

The rules are taken inside `cpu_lowerings()` only, which wraps fragc's own lowerings (the fused, staged, SPMD and
host-loop programs): a user's programs lowered outside fragc keep JAX's choices. The block is a JAX configuration
state that is part of the jit cache's key, so JAX's caches of lowered and compiled functions keep the two apart: a
function lowered inside the block never hands its HLO to a plain `jax.jit` of the same function outside it, nor the
reverse. The rules, and that state, are read and installed through JAX internals (`jax._src`), which no public API
exposes; where a JAX release moves them, fragc keeps JAX's rules and says nothing (they are speed, never meaning).
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from . import cpu_threads
from .user_cache import read_json, user_cache_folder, write_json

RULES = ("threefry", "sort")
_FORCED = {"threefry": ("FRAGC_THREEFRY", {"straight": True, "rolled": False, "jax": False}),
           "sort": ("FRAGC_SORT", {"packed": True, "jax": False})}
"""Per rule: the environment variable that decides it without measuring, and its values."""

_install_lock = threading.Lock()
_installed: dict[str, bool] = {}  # rule name -> whether this JAX's internals were where expected
_chosen: dict[str, bool] = {}  # rule name -> on, once decided in this process


def forced(rule: str) -> bool | None:
    """The rule's choice from its environment variable (None: measure). An unknown value is refused."""
    from fragc.ir.errors import FragcError

    variable, values = _FORCED[rule]
    value = os.environ.get(variable, "auto")
    if value == "auto":
        return None
    if value not in values:
        raise FragcError(f"{variable}={value!r}: expected auto, {', '.join(values)}")
    return values[value]


def chosen(rule: str) -> bool:
    """Whether `rule` is on in this process: its environment variable, else the measured choice for this processor
    (measured once and kept, see the module)."""
    if rule not in _chosen:
        decision = forced(rule)
        if decision is None:  # measured on the CPU; where another backend is the default, JAX's rule, unmeasured

            decision = measured_choices()[rule]["on"] if jax.default_backend() == "cpu" else False
        _chosen[rule] = decision
    return _chosen[rule]


@contextlib.contextmanager
def choosing(**on: bool) -> Iterator[None]:
    """Decide rules by name for the lowerings inside the block, in every thread (benchmarks and tests):
    `choosing(threefry=False, sort=False)` lowers as JAX does."""
    unknown = set(on) - set(RULES)
    if unknown:
        raise ValueError(f"unknown CPU lowering rules {sorted(unknown)}; known: {', '.join(RULES)}")
    before = dict(_chosen)
    _chosen.update(on)
    try:
        yield
    finally:
        _chosen.clear()
        _chosen.update(before)


# ---------------------------------------------------------------- the scope and the rules


def _make_scope() -> Any:
    """A JAX configuration state, part of the jit cache's key, that `cpu_lowerings()` sets on its thread; False
    where this JAX has no such internals."""
    try:
        from jax._src import config

        return config.bool_state("fragc_cpu_lowerings", False, "Lower with fragc's CPU rules (internal).",
                                 include_in_jit_key=True, include_in_trace_context=True)
    except (ImportError, AttributeError, TypeError):
        return False


_SCOPE = _make_scope()
"""Made at import: a state added to the jit cache's key makes JAX trace again, once, every function it had compiled
before (a benchmark's PureJaxRL train compiled before fragc's runtime was imported compiled twice)."""


def in_scope() -> bool:
    """Whether this thread is lowering inside `cpu_lowerings()`."""
    return _SCOPE is not False and bool(_SCOPE.value)


def _route(name: str, find: Callable[[], tuple[Any, Callable, Callable, bool]]) -> None:
    """Route the CPU lowering of a primitive through a choice once per process: `find()` -> (primitive, JAX's
    rule, fragc's rule, inline); fragc's is taken inside `cpu_lowerings()` where `chosen(name)`, JAX's elsewhere."""
    with _install_lock:
        if name in _installed:
            return
        try:
            from jax._src.interpreters import mlir

            primitive, jax_rule, fragc_rule, inline = find()
        except (ImportError, AttributeError, KeyError, TypeError):
            _installed[name] = False
            return

        def choose(ctx: Any, *args: Any, **params: Any) -> Any:
            rule = fragc_rule if in_scope() and chosen(name) else jax_rule
            return rule(ctx, *args, **params)

        mlir.register_lowering(primitive, choose, platform="cpu", inline=inline)
        _installed[name] = True


def _find_threefry() -> tuple[Any, Callable, Callable, bool]:
    from jax._src.interpreters import mlir
    from jax._src.random import threefry2x32 as threefry

    primitive = threefry.threefry2x32_p
    return (primitive, mlir._platform_specific_lowerings["cpu"][primitive].rule,
            threefry._threefry2x32_lowering_rule, False)


def _find_sort() -> tuple[Any, Callable, Callable, bool]:
    from jax._src.interpreters import mlir
    from jax._src.lax import lax

    entry = mlir._platform_specific_lowerings["cpu"].get(lax.sort_p) or mlir._lowerings[lax.sort_p]
    jax_rule, enable_x64 = entry.rule, jax.enable_x64

    def rule(ctx: Any, *operands: Any, dimension: int, is_stable: bool, num_keys: int) -> Any:
        key, *values = ctx.avals_in
        if not (is_stable and num_keys == 1 and values and key.dtype in (np.uint32, np.int32)
                and all(isinstance(v.dtype, np.dtype) for v in values)):  # (not values of JAX's extended dtypes)
            return jax_rule(ctx, *operands, dimension=dimension, is_stable=is_stable, num_keys=num_keys)
        with enable_x64(True):  # 64-bit words inside this lowering only; its inputs and outputs are 32-bit
            return mlir.lower_fun(functools.partial(_sort_packed, dimension=dimension),
                                  multiple_results=True)(ctx, *operands)

    return lax.sort_p, jax_rule, rule, True


def _sort_packed(key: Any, *values: Any, dimension: int) -> list[Any]:
    """`lax.sort_key_val`'s stable order of 32-bit `key` along `dimension`, by one sort of 64-bit words: the key
    (its order as unsigned bits) above its position."""

    ordered = key.astype(jnp.uint32) ^ np.uint32(0x80000000) if key.dtype == jnp.int32 else key
    position = jax.lax.broadcasted_iota(jnp.uint64, key.shape, dimension)
    words = jax.lax.sort((ordered.astype(jnp.uint64) << np.uint64(32)) | position, dimension=dimension,
                         is_stable=False)  # distinct words: any sort is the stable one
    order = (words & np.uint64(0xFFFFFFFF)).astype(jnp.int32)
    sorted_key = (words >> np.uint64(32)).astype(jnp.uint32)
    if key.dtype == jnp.int32:
        sorted_key = (sorted_key ^ np.uint32(0x80000000)).astype(jnp.int32)
    return [sorted_key, *(jnp.take_along_axis(v, order, axis=dimension) for v in values)]


def _install() -> None:
    if _SCOPE is not False:
        _route("threefry", _find_threefry)
        _route("sort", _find_sort)


@contextlib.contextmanager
def cpu_lowerings() -> Iterator[None]:
    """Lowerings on this thread inside the block take fragc's CPU rules where they are on (see the module). Where
    this process has not decided a rule yet it decides it here, before anything lowers (measuring compiles and
    runs programs, which a lowering cannot do inside itself)."""
    for rule in RULES:
        chosen(rule)
    with _scope_on():
        yield


@contextlib.contextmanager
def _scope_on() -> Iterator[None]:
    _install()
    with contextlib.nullcontext() if _SCOPE is False else _SCOPE(True):
        yield


# ---------------------------------------------------------------- measuring the choices


def processor() -> str:
    """This machine's processor model, the cores this process may use, the threads XLA's CPU runtime runs on
    (src/fragc/runtime/cpu_threads.py: a rule's worth depends on them) and the JAX version: what a choice is kept
    under."""
    return (f"{cpu_threads.processor_model()} | {cpu_threads.usable_cores()} cores | {cpu_threads.threads()} threads"
            f" | jax {jax.__version__}")


def choices_path() -> str:
    """Where the measured choices are kept (a JSON object, processor -> rule -> measurement)."""
    return os.path.join(user_cache_folder(), "cpu_lowerings.json")


def measured_choices() -> dict[str, dict]:
    """Per rule: {"on": ..., and the medians measured}, for this processor: read from `choices_path()`, or measured
    now (a few seconds, once per processor) and written there."""
    path, key = choices_path(), f"{processor()} | {WORKLOADS_VERSION}"
    kept = read_json(path) or {}
    if key in kept and set(RULES) <= set(kept[key]):
        return kept[key]
    print(f"fragc: timing its CPU lowering rules on this processor (once; kept in {path})", file=sys.stderr)
    kept[key] = measure()
    write_json(path, kept)  # atomically: two processes measuring at once each write a whole file
    return kept[key]


def _micro(program: Callable[[], tuple[Callable, Any]], calls: int = 8) -> Callable[[], Callable[[], None]]:
    """A workload of a jitted micro-program: compiled under the rules chosen when it is built, run `calls` times."""
    def build() -> Callable[[], None]:

        fn, arg = program()
        with _scope_on():  # a function each side: JAX's caches key on the function too
            compiled = jax.jit(lambda a: fn(a)).lower(arg).compile()

        def run() -> None:
            for _ in range(calls):
                jax.block_until_ready(compiled(arg))

        return run

    return build


def _threefry_program() -> tuple[Callable, Any]:
    """What PPO's rollout draws: 64 steps, each splitting 16 per-environment keys in 3 and drawing an action and a
    uniform with two of them."""

    def steps(keys: Any) -> Any:
        def step(keys: Any, _: None) -> tuple[Any, Any]:
            split = jax.vmap(lambda k: jax.random.split(k, 3))(keys)
            action = jax.vmap(lambda k: jax.random.categorical(k, jnp.zeros(2)))(split[:, 0])
            noise = jax.vmap(jax.random.uniform)(split[:, 1])
            return split[:, 2], action.astype(jnp.float32) + noise

        return jax.lax.scan(step, keys, None, 64)

    return steps, jax.random.split(jax.random.key(0), 16)


def _sort_program() -> tuple[Callable, Any]:
    """What PPO's minibatch shuffle sorts: 16 permutations of 512 steps, one after another."""

    def shuffles(key: Any) -> Any:
        def shuffle(key: Any, _: None) -> tuple[Any, Any]:
            key, draw = jax.random.split(key)
            return key, jax.random.permutation(draw, 512)

        return jax.lax.scan(shuffle, key, None, 16)

    return shuffles, jax.random.key(0)


WORKLOADS: dict[str, Callable[[], Callable[[], None]]] = {"threefry": _micro(_threefry_program),
                                                          "sort": _micro(_sort_program)}
"""Per rule, what decides it: a function that builds (compiles) the workload under the rules chosen when it is
called and returns a function running it once. These are micro-programs; the API layer (src/fragc/lowering_workloads.py)
replaces threefry's with a whole training iteration, since a rule's worth in a program also depends on how XLA's
CPU runtime spreads the program over threads, which a micro-program does not show."""
WORKLOADS_VERSION = "workloads 2"
"""Part of a kept choice's key: a change of what decides the rules measures them again."""
MARGIN = 0.95
"""A rule is on where its workload's median wall time is under this fraction of JAX's, and its CPU time no more."""


def measure(rounds: int = 7, workloads: dict[str, Callable[[], Callable[[], None]]] | None = None
            ) -> dict[str, dict]:
    """Per rule: its workload (`WORKLOADS`) built with the rule and with JAX's lowering (the other rules off), timed
    alternately (wall and process CPU time, medians of `rounds`), and whether the rule is on (`MARGIN`)."""
    workloads = workloads or WORKLOADS
    _install()
    out = {}
    for rule in RULES:
        runs = {}
        for side, on in (("fragc", True), ("jax", False)):
            with choosing(**{r: on and r == rule for r in RULES}):
                runs[side] = workloads[rule]()
        wall: dict[str, list[float]] = {side: [] for side in runs}
        cpu: dict[str, list[float]] = {side: [] for side in runs}
        for run in runs.values():
            run()
        for _ in range(rounds):
            for side, run in runs.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                run()
                wall[side].append(time.perf_counter() - start)
                cpu[side].append(time.process_time() - start_cpu)
        medians = {f"{side}_{what}_s": statistics.median(v) for what, table in (("wall", wall), ("cpu", cpu))
                   for side, v in table.items()}
        on = (medians["fragc_wall_s"] < MARGIN * medians["jax_wall_s"]
              and medians["fragc_cpu_s"] <= medians["jax_cpu_s"])
        out[rule] = {"on": on, **medians}
    return out
