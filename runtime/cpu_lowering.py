"""fragc lowers two of JAX's primitives on the CPU the way that runs faster there, computing the same bits.

- **`threefry2x32`** (every `jax.random` draw under the default key implementation), written out straight. JAX lowers
  it on GPUs as straight-line code, 20 rounds one after another, and on CPUs as a `fori_loop` of 5 trips over 4
  rounds each, to keep the HLO small. XLA's CPU runtime runs each trip as several small thunks (the loop's
  condition, the carry's copies, the round's fusion), and PPO's rollout draws three times a step: the loops were
  about a sixth of a CartPole iteration on this 2-core CPU (docs/benchmarks.md, "Threefry straight"). Both
  lowerings do the same 32-bit adds, rotations and xors in the same order.
- **A stable sort of 32-bit integer keys carrying values** (`lax.sort_key_val`; `jax.random.permutation` is one,
  PPO's minibatch shuffle), as one sort of 64-bit words, each a key above its position. XLA's CPU runtime sorts
  one buffer of a native type with `std::sort`'s own comparison, and several buffers through a compiled comparator
  called per comparison that moves every buffer's elements: about 4 times slower for 512 elements
  (docs/benchmarks.md, "Sorts packed"). The packed words are distinct and their order is the keys' order, ties
  by position: a stable sort's order. The keys are read off the words, the values gathered by position.

Neither changes a result, only the HLO. Both are chosen inside `cpu_lowerings()` only, which wraps fragc's own
lowerings (the fused, staged, SPMD and host-loop programs): a user's programs lowered outside fragc keep JAX's
choices. The rules are read and installed through JAX internals (`jax._src`), which no public API exposes; where
a JAX release moves them, fragc keeps JAX's rule and says nothing (they are speed, never meaning).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any, Callable, Iterator

import numpy as np

straight_threefry = os.environ.get("FRAGC_THREEFRY", "straight") != "rolled"
"""Whether `cpu_lowerings()` lowers threefry straight. `FRAGC_THREEFRY=rolled` keeps JAX's CPU lowering: smaller
programs that compile sooner and step slower, which the test suite (compiles first) takes; benchmarks turn it off
to measure the choice (bench/population.py's `fragc_rolled` side)."""

packed_sort = os.environ.get("FRAGC_SORT", "packed") != "jax"
"""Whether `cpu_lowerings()` packs key-value sorts (`FRAGC_SORT=jax` keeps JAX's lowering; bench/population.py's
`fragc_rolled` side turns both off)."""

_local = threading.local()
_installed: dict[str, bool] = {}  # rule name -> whether this JAX's internals were where expected
_install_lock = threading.Lock()


def _route(name: str, find: Callable[[], tuple[Any, Callable, Callable]], chosen: Callable[[], bool]) -> None:
    """Route the CPU lowering of a primitive through a choice once per process: `find()` -> (primitive, JAX's
    rule, fragc's rule); fragc's is taken inside `cpu_lowerings()` while `chosen()`, JAX's elsewhere."""
    with _install_lock:
        if name in _installed:
            return
        try:
            from jax._src.interpreters import mlir

            primitive, jax_rule, fragc_rule = find()
        except (ImportError, AttributeError, KeyError, TypeError):
            _installed[name] = False
            return

        def choose(ctx: Any, *args: Any, **params: Any) -> Any:
            rule = fragc_rule if getattr(_local, "depth", 0) and chosen() else jax_rule
            return rule(ctx, *args, **params)

        mlir.register_lowering(primitive, choose, platform="cpu")
        _installed[name] = True


def _find_threefry() -> tuple[Any, Callable, Callable]:
    from jax._src.interpreters import mlir
    from jax._src.random import threefry2x32 as threefry

    primitive = threefry.threefry2x32_p
    return primitive, mlir._platform_specific_lowerings["cpu"][primitive].rule, threefry._threefry2x32_lowering_rule


def _find_sort() -> tuple[Any, Callable, Callable]:
    import jax
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

    return lax.sort_p, jax_rule, rule


def _sort_packed(key: Any, *values: Any, dimension: int) -> list[Any]:
    """`lax.sort_key_val`'s stable order of 32-bit `key` along `dimension`, by one sort of 64-bit words: the key
    (its order as unsigned bits) above its position."""
    import jax
    import jax.numpy as jnp

    ordered = key.astype(jnp.uint32) ^ np.uint32(0x80000000) if key.dtype == jnp.int32 else key
    position = jax.lax.broadcasted_iota(jnp.uint64, key.shape, dimension)
    words = jax.lax.sort((ordered.astype(jnp.uint64) << np.uint64(32)) | position, dimension=dimension,
                         is_stable=False)  # distinct words: any sort is the stable one
    order = (words & np.uint64(0xFFFFFFFF)).astype(jnp.int32)
    sorted_key = (words >> np.uint64(32)).astype(jnp.uint32)
    if key.dtype == jnp.int32:
        sorted_key = (sorted_key ^ np.uint32(0x80000000)).astype(jnp.int32)
    return [sorted_key, *(jnp.take_along_axis(v, order, axis=dimension) for v in values)]


@contextlib.contextmanager
def cpu_lowerings() -> Iterator[None]:
    """Lowerings on this thread inside the block take fragc's CPU rules (see the module)."""
    _route("threefry", _find_threefry, lambda: straight_threefry)
    _route("sort", _find_sort, lambda: packed_sort)
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
