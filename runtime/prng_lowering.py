"""fragc's programs draw their random bits with threefry written out straight, on the CPU too.

JAX lowers `threefry2x32` (every `jax.random` call under the default key implementation) in two ways: on GPUs as
straight-line code, 20 rounds one after another; on CPUs as a `fori_loop` of 5 trips over 4 rounds each, to keep
the HLO small. XLA's CPU runtime runs each trip of that loop as several small thunks (the loop's condition, the
carry's copies, the round's fusion), and PPO's rollout draws random bits three times a step: the loops were about
a sixth of a CartPole iteration on this 2-core CPU (docs/benchmarks.md; bench/population.py's
`--purejaxrl-straight` side lowers PureJaxRL's program the same way).

The two lowerings compute the same bits (the same 32-bit adds, rotations and xors in the same order), so choosing
the straight one changes no result, only the HLO. It is chosen inside `straight_threefry()` only, which wraps
fragc's own lowerings: a user's programs outside fragc keep JAX's choice. The rule is read and installed through
JAX internals (`jax._src`), which no public API exposes; where a JAX release moves them, fragc keeps JAX's rule
and says nothing (it is speed, never meaning).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

enabled = os.environ.get("FRAGC_THREEFRY", "straight") != "rolled"
"""Whether `straight_threefry()` chooses anything. `FRAGC_THREEFRY=rolled` keeps JAX's CPU lowering: smaller
programs that compile sooner and step slower, which the test suite (compiles first) takes; benchmarks turn it off
to measure the choice (bench/population.py's `fragc_rolled` side)."""

_local = threading.local()
_installed: bool | None = None  # None: not tried yet; False: this JAX's internals are not where expected
_install_lock = threading.Lock()


def _install() -> bool:
    """Route the CPU lowering of `threefry2x32` through `choose` once per process (JAX's rolled rule outside
    `straight_threefry()`, the straight one inside); -> whether it is routed."""
    global _installed
    with _install_lock:
        if _installed is None:
            try:
                from jax._src.interpreters import mlir
                from jax._src.random import threefry2x32 as threefry

                primitive = threefry.threefry2x32_p
                rolled = mlir._platform_specific_lowerings["cpu"][primitive].rule
                straight = threefry._threefry2x32_lowering_rule
            except (ImportError, AttributeError, KeyError, TypeError):
                _installed = False
            else:
                def choose(ctx: Any, *args: Any, **params: Any) -> Any:
                    rule = straight if getattr(_local, "depth", 0) else rolled
                    return rule(ctx, *args, **params)

                mlir.register_lowering(primitive, choose, platform="cpu")
                _installed = True
    return _installed


@contextlib.contextmanager
def straight_threefry() -> Iterator[None]:
    """Lowerings on this thread inside the block lower `threefry2x32` straight on the CPU (see the module)."""
    if not enabled:
        yield
        return
    _install()
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
